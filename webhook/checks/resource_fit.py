"""Resource fit (``helper.Fits``, ``predicate.go`` ``removeMissingExtendedResources``).
kubelet-admission-spec §4."""

from __future__ import annotations

from collections.abc import Mapping

from ..kube.quantity import format_amount
from ..kube.reasons import out_of
from ..kube.resources import ResourceVector, is_extended_resource, is_scalar_resource
from .failure import Failure

_NATIVE = ("cpu", "memory", "ephemeral-storage")


def without_missing_extended(requests: Mapping[str, int], allocatable: Mapping[str, int]) -> ResourceVector:
    """Drop extended-resource requests the node does not report (cluster-level resources)."""
    return {
        name: amount
        for name, amount in requests.items()
        if not is_extended_resource(name) or name in allocatable
    }


def _insufficient(name: str, requested: int, used: int, capacity: int, node: str) -> Failure:
    free = max(capacity - used, 0)
    return Failure(
        out_of(name),
        f"Node didn't have enough resource: {name}, requested: {requested}, "
        f"used: {used}, capacity: {capacity}",
        f"node {node} has {format_amount(name, free)} {name} free of "
        f"{format_amount(name, capacity)} allocatable",
        resource=name,
        requested=requested,
        used=used,
        capacity=capacity,
    )


def insufficient_resources(pod, node, usage, kubelet=None) -> list[Failure]:
    """Every resource the node cannot fit, in kubelet order: pods, cpu, memory, storage, scalars."""
    requests, allocatable, used = pod.record.requests, node.allocatable, usage.requested
    failures = []
    pods_allowed = allocatable.get("pods", 0)
    if usage.pod_count + 1 > pods_allowed:
        failures.append(_insufficient("pods", 1, usage.pod_count, pods_allowed, node.name))
    requests = without_missing_extended(requests, allocatable)
    scalars = sorted(name for name in requests if is_scalar_resource(name))
    for name in (*_NATIVE, *scalars):
        wanted = requests.get(name, 0)
        if wanted > 0 and wanted > allocatable.get(name, 0) - used.get(name, 0):
            failures.append(
                _insufficient(name, wanted, used.get(name, 0), allocatable.get(name, 0), node.name)
            )
    return failures
