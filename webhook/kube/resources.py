"""Pod resource requests exactly as the scheduler and kubelet compute them.

Upstream: ``component-helpers/resource/helpers.go`` (``PodRequests``,
``aggregateContainerResourcesByFn``) folded into integers like
``scheduler/framework/types.go`` (``Resource.Add``). kubelet-admission-spec §4.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from .errors import MAPPING, FieldError
from .quantity import CACHED_LENGTH, QuantityError, base_units, parse_quantity

ResourceVector = dict[str, int]

_POD_LEVEL = ("cpu", "memory")
_QUALIFIED_NAME = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)


def is_native_resource(name: str) -> bool:
    """``cpu``, ``hugepages-2Mi``, ``kubernetes.io/...``: names Kubernetes itself defines."""
    return "/" not in name or "kubernetes.io/" in name


@lru_cache(maxsize=4096)  # a cluster names a few dozen resources; asked per request and pod event
def is_extended_resource(name: str) -> bool:
    """Vendor resources such as ``nvidia.com/gpu`` (``v1helper.IsExtendedResourceName``)."""
    if is_native_resource(name) or name.startswith("requests."):
        return False
    return _QUALIFIED_NAME.fullmatch(name) is not None and len(name.split("/", 1)[1]) <= 63


def is_scalar_resource(name: str) -> bool:
    """Everything compared by the scalar branch of the fit check."""
    return (
        is_extended_resource(name)
        or name.startswith("hugepages-")
        or name.startswith("attachable-volumes-")
        or name.startswith("kubernetes.io/")
    )


def _pod_level_supported(name: str) -> bool:
    return name in _POD_LEVEL or name.startswith("hugepages-")


def resource_list(values: object, field: str) -> ResourceVector:
    """Parse a ``ResourceList`` mapping into integer base units; errors name the field."""
    if values is None:
        return {}
    if not isinstance(values, MAPPING):
        raise FieldError(field, "must be a mapping of resource name to quantity")
    vector: ResourceVector = {}
    for name, raw in values.items():
        try:
            if type(name) is str and type(raw) is str and len(raw) <= CACHED_LENGTH:
                vector[name] = _string_amount(name, raw)
            else:
                vector[str(name)] = _amount(str(name), raw)
        except QuantityError as err:
            raise FieldError(f"{field}.{name}", str(err)) from None
    return vector


@lru_cache(maxsize=16384)
def _string_amount(name: str, raw: str) -> int:
    """``_amount`` for the common case; a cluster's pods repeat a few hundred distinct quantities.
    Long strings are never cached: the cache would keep them alive (a megabyte each)."""
    return _amount(name, raw)


def _amount(name: str, raw: object) -> int:
    amount = base_units(name, parse_quantity(raw))
    if amount < 0:
        raise QuantityError(f"{raw!r} must not be negative")
    return amount


def container_requests(container: Mapping[str, Any], field: str) -> ResourceVector:
    """Requests of one container, with limits standing in for missing requests.

    The API server defaults a missing request to its limit before the kubelet ever sees the
    pod; templates in manifests have not been defaulted yet, so do it here.
    """
    resources = container.get("resources") or {}
    if not isinstance(resources, MAPPING):
        raise FieldError(f"{field}.resources", "must be a mapping")
    limits = resource_list(resources.get("limits"), f"{field}.resources.limits")
    requests = resource_list(resources.get("requests"), f"{field}.resources.requests")
    return {**limits, **requests}


def add_into(total: ResourceVector, other: Mapping[str, int]) -> None:
    for name, amount in other.items():
        total[name] = total.get(name, 0) + amount


def max_into(total: ResourceVector, other: Mapping[str, int]) -> None:
    for name, amount in other.items():
        if name not in total or amount > total[name]:
            total[name] = amount


def containers(spec: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    """``spec.containers`` or ``spec.initContainers`` as a list, rejecting other shapes."""
    value = spec.get(key)
    if not value:
        return []
    if not isinstance(value, list):
        raise FieldError(f"spec.{key}", "must be a list of containers")
    for item in value:
        if not isinstance(item, MAPPING):
            raise FieldError(f"spec.{key}", "must be a list of containers")
    return value


def is_sidecar(container: Mapping[str, Any]) -> bool:
    """A restartable init container: it keeps running next to the app containers."""
    return container.get("restartPolicy") == "Always"


def _aggregate(spec: Mapping[str, Any], requests_of) -> ResourceVector:
    """Sum app containers and sidecars; take the max with each init container's peak."""
    total: ResourceVector = {}
    for i, container in enumerate(containers(spec, "containers")):
        add_into(total, requests_of(container, f"spec.containers[{i}]"))
    sidecars: ResourceVector = {}
    init_peak: ResourceVector = {}
    for i, container in enumerate(containers(spec, "initContainers")):
        own = requests_of(container, f"spec.initContainers[{i}]")
        if is_sidecar(container):
            add_into(total, own)
            add_into(sidecars, own)
            peak = dict(sidecars)
        else:
            peak = dict(own)
            add_into(peak, sidecars)
        max_into(init_peak, peak)
    max_into(total, init_peak)
    return total


def resize_infeasible(status: Mapping[str, Any]) -> bool:
    for condition in status.get("conditions") or ():
        if isinstance(condition, MAPPING) and condition.get("type") == "PodResizePending":
            return condition.get("reason") == "Infeasible"
    return False


def _status_requests(spec: Mapping[str, Any], status: Mapping[str, Any]) -> ResourceVector:
    """max(spec, allocated, actuated) for pods with container statuses (in-place resize)."""
    by_name: dict[str, Mapping[str, Any]] = {}
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or ():
            if isinstance(cs, MAPPING) and isinstance(cs.get("name"), str):
                by_name.setdefault(cs["name"], cs)
    infeasible = resize_infeasible(status)

    def allocated(container, field):
        cs = by_name.get(container.get("name"))
        if cs and cs.get("allocatedResources") is not None:
            return resource_list(cs["allocatedResources"], f"status.{field}.allocatedResources")
        return {} if infeasible else container_requests(container, field)

    def actuated(container, field):
        cs = by_name.get(container.get("name"))
        if cs and isinstance(cs.get("resources"), MAPPING) and cs["resources"].get("requests") is not None:
            return resource_list(cs["resources"]["requests"], f"status.{field}.resources")
        return allocated(container, field)

    result = {} if infeasible else _aggregate(spec, container_requests)
    max_into(result, _aggregate(spec, allocated))
    max_into(result, _aggregate(spec, actuated))
    return result


def pod_requests(spec: Mapping[str, Any], status: Mapping[str, Any] | None = None) -> ResourceVector:
    """The pod's request vector (kubelet-admission-spec §4.1, and §4.2 for running pods given ``status``).

    Zero entries are kept: the kubelet skips zero scalar requests itself, and a zero that is
    present differs from an absent resource when unknown extended resources are dropped.
    """
    if status and (status.get("containerStatuses") or status.get("initContainerStatuses")):
        requests = _status_requests(spec, status)
    else:
        requests = _aggregate(spec, container_requests)
    pod_resources = spec.get("resources")
    if isinstance(pod_resources, MAPPING):
        pod_level = {
            **resource_list(pod_resources.get("limits"), "spec.resources.limits"),
            **resource_list(pod_resources.get("requests"), "spec.resources.requests"),
        }
        for name, amount in pod_level.items():
            if _pod_level_supported(name):
                requests[name] = amount
    add_into(requests, resource_list(spec.get("overhead"), "spec.overhead"))
    return requests


def qos_class(spec: Mapping[str, Any]) -> str:
    """``BestEffort`` / ``Burstable`` / ``Guaranteed`` from cpu and memory (``ComputePodQOS``).

    Pod-level ``spec.resources`` decide alone when set; otherwise every app and init
    container counts. Requests are defaulted from limits, as the API server does.
    """
    pod_resources = spec.get("resources")
    if isinstance(pod_resources, MAPPING) and pod_resources:
        parts = [("spec.resources", pod_resources)]
    else:
        parts = [
            (f"spec.{key}[{i}].resources", c.get("resources") or {})
            for key in ("containers", "initContainers")
            for i, c in enumerate(containers(spec, key))
        ]
    requests: ResourceVector = {}
    limits: ResourceVector = {}
    guaranteed = True
    for field, resources in parts:
        lim = resource_list(resources.get("limits"), f"{field}.limits")
        req = {**lim, **resource_list(resources.get("requests"), f"{field}.requests")}
        add_into(requests, {k: v for k, v in req.items() if k in _POD_LEVEL and v > 0})
        found = {k: v for k, v in lim.items() if k in _POD_LEVEL and v > 0}
        add_into(limits, found)
        if set(found) != set(_POD_LEVEL):
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and requests == limits:
        return "Guaranteed"
    return "Burstable"
