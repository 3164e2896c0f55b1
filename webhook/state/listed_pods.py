"""A page of a pod list decoded straight into the few fields a pod's record reads.

Parsed whole into dicts, a live pod (~11 KB of JSON: managed fields, env, volumes, probes)
costs ~95 µs to parse and free, and its record is built from a dozen of its values. msgspec
decodes a page into typed structs that keep only those values and skip the rest without
building them: a list of such pods costs 36.5 µs of CPU a pod against 193.4 parsed whole
(``bench/informer_bench.py``, HTTP and filing in the state included).

The types are as strict as the checks ``model.pod_record`` runs, or stricter: a page that
does not decode (a field of another JSON type, a priority past 64 bits) returns None, and the
informer parses it whole like any other, so each odd pod is judged, or reported, exactly as
before. What the requests, ports and NUMA footprint are derived from is kept as raw JSON text:
it is the key their derivation is shared under, and a key seen for the first time is parsed by
orjson like the page would have been (it reads an integer past 64 bits as a float, msgspec as
an int). A decoded pod the types cannot carry whole is swapped for its dict from a parse of the
page: a pending pod (its record keeps the spec for the bind checks) and the Failed and Running
pods the storm breakers read. A pod's watch events are decoded the same way (``pod_event``).
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
import orjson

from ..kube.pod_fields import check_pod_fields
from .apiserver import Page
from .model import (
    MIRROR_ANNOTATION,
    TERMINAL_PHASES,
    Derived,
    PodRecord,
    derive,
    derived_once,
    key_of,
    record_fields,
)
from .storm import StormBreakers


class _Object(msgspec.Struct, gc=False):
    """Any JSON object: only its type is checked (``check_pod_fields``), its members skipped."""


# Absent and null both read as null, as ``dict.get`` reads them (a Raw cannot be optional).
_NULL = msgspec.Raw(b"null")
# Integers of 64 bits: orjson reads a larger one as a float, which a priority is not (and msgspec
# bounds an int within 64 signed bits; a priority between those and 2**64 takes the JSON path).
_Priority = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class _Annotations(msgspec.Struct, gc=False):
    mirror: Any = msgspec.field(default=msgspec.UNSET, name=MIRROR_ANNOTATION)


class _Metadata(msgspec.Struct, gc=False):
    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    resourceVersion: str | None = None
    generateName: str | None = None
    labels: _Object | None = None
    annotations: _Annotations | None = None


class _Container(msgspec.Struct, gc=False):
    name: str | None = None
    restartPolicy: str | None = None
    resources: msgspec.Raw = _NULL
    ports: msgspec.Raw = _NULL


class _Spec(msgspec.Struct, gc=False):
    nodeName: str | None = None
    schedulerName: str | None = None
    priority: _Priority | None = None
    containers: list[_Container] | None = None
    initContainers: list[_Container] | None = None
    resources: msgspec.Raw = _NULL
    overhead: msgspec.Raw = _NULL
    nodeSelector: _Object | None = None
    affinity: _Object | None = None
    securityContext: _Object | None = None
    os: _Object | None = None
    tolerations: list[_Object] | None = None


class _ContainerStatus(msgspec.Struct, gc=False):
    name: str | None = None
    allocatedResources: msgspec.Raw = _NULL
    resources: msgspec.Raw = _NULL


class _Condition(msgspec.Struct, gc=False):
    type: str | None = None
    reason: str | None = None


class _Status(msgspec.Struct, gc=False):
    phase: str | None = None
    containerStatuses: list[_ContainerStatus] | None = None
    initContainerStatuses: list[_ContainerStatus] | None = None
    conditions: list[_Condition] | None = None


class ListedPod(msgspec.Struct, gc=False):
    """A pod of a list page, as far as its record reads it."""

    metadata: _Metadata | None = None
    spec: _Spec | None = None
    status: _Status | None = None


class _ListMetadata(msgspec.Struct, gc=False):
    resourceVersion: str | None = None
    continue_: str | None = msgspec.field(default=None, name="continue")


class _PodPage(msgspec.Struct, gc=False):
    metadata: _ListMetadata | None = None
    items: list[ListedPod] | None = None


class _Listing(msgspec.Struct, gc=False):
    metadata: _ListMetadata | None = None


class _Event(msgspec.Struct, gc=False):
    type: str | None = None
    object: ListedPod | None = None


_DECODER = msgspec.json.Decoder(_PodPage)
_EVENT_DECODER = msgspec.json.Decoder(_Event)
_LISTING_DECODER = msgspec.json.Decoder(_Listing)
# An ERROR event's object is a Status: the parsed JSON reads its code and message.
_TYPED_EVENTS = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})
_NO_METADATA, _NO_SPEC, _NO_STATUS = _Metadata(), _Spec(), _Status()


def pod_page(body: bytes, storm: StormBreakers | None) -> Page | None:
    """A pod list page whose items are ``ListedPod``s, or dicts for the pods those cannot
    carry; None when it does not decode as one (the caller parses it whole)."""
    try:
        page = _DECODER.decode(body)
    except (msgspec.MsgspecError, ValueError):  # invalid UTF-8 raises a UnicodeDecodeError
        return None
    items: list[ListedPod | dict[str, Any]] = list(page.items or ())
    running_read = storm is not None and (
        bool(storm.breakers) or any(listed_phase(pod) == "Failed" for pod in page.items or ())
    )
    whole = [i for i, pod in enumerate(page.items or ()) if _read_whole(pod, storm, running_read)]
    if whole:
        try:
            parsed = orjson.loads(body)["items"]
        except (orjson.JSONDecodeError, TypeError, KeyError):
            return None
        for i in whole:
            items[i] = parsed[i]
    metadata = page.metadata or _ListMetadata()
    return Page(items, metadata.resourceVersion or "", metadata.continue_ or "")


def page_token(body: bytes) -> str | None:
    """The continue token of a list page, read alone ("" on the last page); None where the
    page's metadata does not decode."""
    try:
        listing = _LISTING_DECODER.decode(body)
    except (msgspec.MsgspecError, ValueError):
        return None
    return (listing.metadata or _ListMetadata()).continue_ or ""


def pod_event(line: bytes, storm: StormBreakers | None) -> tuple[str, ListedPod, str | None] | None:
    """A pod watch event decoded typed: its type, pod and resourceVersion; None where the line
    is to be read as parsed JSON (an ERROR, a pod ``pod_page`` would keep whole, a field of
    another type)."""
    try:
        event = _EVENT_DECODER.decode(line)
    except (msgspec.MsgspecError, ValueError):
        return None
    pod = event.object
    if event.type not in _TYPED_EVENTS or pod is None:
        return None
    applied = event.type == "ADDED" or event.type == "MODIFIED"
    if applied and _read_whole(pod, storm, storm is not None and bool(storm.breakers)):
        return None
    return event.type, pod, (pod.metadata or _NO_METADATA).resourceVersion


def _read_whole(pod: ListedPod, storm: StormBreakers | None, running_read: bool) -> bool:
    """Whether the pod's dict is read: its record keeps the spec (pending), or the storm
    breakers read it (``StormBreakers.observe``: Failed pods, and Running ones once a breaker
    counts, which a Failed pod of the same page may start: ``running_read``)."""
    phase = listed_phase(pod)
    if storm is not None and phase == "Failed":
        return True
    if phase in TERMINAL_PHASES:
        return False
    return not (pod.spec or _NO_SPEC).nodeName or (running_read and phase == "Running")


def listed_phase(pod: ListedPod) -> str | None:
    """A listed pod's ``status.phase``."""
    return (pod.status or _NO_STATUS).phase


def listed_key(pod: ListedPod) -> str:
    """``model.object_key`` of a listed pod."""
    metadata = pod.metadata or _NO_METADATA
    return key_of(metadata.uid, metadata.namespace, metadata.name)


def listed_record(pod: ListedPod) -> PodRecord | None:
    """``model.pod_record(pod, parsed_json=True)`` of a listed pod (a bound one: ``pod_page``
    hands the others over as dicts)."""
    fields = listed_fields(pod)
    return None if fields is None else PodRecord(*fields)


def listed_fields(pod: ListedPod) -> tuple | None:
    """``listed_record``'s fields (``model.record_fields``), or None for a terminal pod."""
    status = pod.status or _NO_STATUS
    if status.phase in TERMINAL_PHASES:
        return None
    spec, metadata = pod.spec or _NO_SPEC, pod.metadata or _NO_METADATA
    annotations = metadata.annotations
    key = _inputs_key(spec, status)
    return record_fields(
        key_of(metadata.uid, metadata.namespace, metadata.name),
        metadata.namespace,
        metadata.name,
        metadata.generateName,
        node=spec.nodeName,
        scheduler=spec.schedulerName,
        priority=spec.priority,
        mirror=annotations is not None and annotations.mirror is not msgspec.UNSET,
        derived=derived_once(key, lambda: _derive_from(key)),
    )


_ENCODER = msgspec.json.Encoder()
_RAW_KEY = b"L"  # the dict path's keys are JSON arrays: no key of one is a key of the other


def _inputs_key(spec: _Spec, status: _Status) -> bytes:
    """What ``model._inputs`` reads, as JSON text with each value's text as listed."""
    statuses = None
    if status.containerStatuses or status.initContainerStatuses:
        statuses = (status.initContainerStatuses or (), status.containerStatuses or (), _infeasible(status))
    inputs = (spec.containers or (), spec.initContainers or (), spec.resources, spec.overhead, statuses)
    return _RAW_KEY + _ENCODER.encode(inputs)


def _infeasible(status: _Status) -> bool:
    """``resources.resize_infeasible`` of the listed conditions."""
    for condition in status.conditions or ():
        if condition.type == "PodResizePending":
            return condition.reason == "Infeasible"
    return False


def _derive_from(key: bytes) -> Derived:
    """Requests, ports and footprint from the inputs' text parsed as the page's JSON would be,
    in a spec and a status of their own (absent and null read alike there). The spec's
    mappings are checked first, as ``pod_record`` checks them before it derives."""
    containers, init_containers, resources, overhead, statuses = orjson.loads(key[len(_RAW_KEY) :])
    spec = _without_nulls(
        {
            "containers": [_without_nulls(c) for c in containers],
            "initContainers": [_without_nulls(c) for c in init_containers],
            "resources": resources,
            "overhead": overhead,
        }
    )
    check_pod_fields({}, spec)
    status: dict[str, Any] = {}
    if statuses is not None:
        init_statuses, container_statuses, infeasible = statuses
        status = {
            "initContainerStatuses": [_without_nulls(s) for s in init_statuses],
            "containerStatuses": [_without_nulls(s) for s in container_statuses],
            "conditions": [{"type": "PodResizePending", "reason": "Infeasible"}] if infeasible else [],
        }
    return derive(spec, status)


def _without_nulls(values: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in values.items() if value is not None}
