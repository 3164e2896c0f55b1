"""``ResourceClaim``: what a claim asks for, and the allocation written to its status (DRA
spec §3, §4)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import MAPPING, mapping_at
from ..tolerations import Taint
from .fields import Amounts, DeviceKey, _amounts, _boolean, _intern, _mappings, _string, device_name
from .node_selection import NodeSelector, node_selector


@dataclass(frozen=True, slots=True)
class DeviceToleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        """``resourceclaim/devicetoleration.go: ToleratesTaint``."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        return self.operator in ("", "Equal") and self.value == taint.value


def _tolerations(obj: Mapping[str, Any], field: str) -> tuple[DeviceToleration, ...]:
    if not obj.get("tolerations"):
        _mappings(obj, "tolerations", field)  # only to refuse a wrong type
        return ()
    return tuple(
        DeviceToleration(
            _string(t, "key", f"{field}[{i}].key", required=False),
            _string(t, "operator", f"{field}[{i}].operator", required=False) or "Equal",
            _string(t, "value", f"{field}[{i}].value", required=False),
            _string(t, "effect", f"{field}[{i}].effect", required=False),
        )
        for i, t in enumerate(_mappings(obj, "tolerations", field))
    )


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """One request, or one subrequest named ``<request>/<subrequest>`` as results name it."""

    name: str
    admin_access: bool = False
    tolerations: tuple[DeviceToleration, ...] = ()
    capacity: Amounts | None = None  # ``capacity.requests``, names not yet normalised


@dataclass(frozen=True, slots=True)
class ClaimRef:
    namespace: str
    name: str
    uid: str = ""

    @property
    def key(self) -> str:
        """The uid for live objects, ``namespace/name`` for hand-written ones (as pods)."""
        return self.uid or f"{self.namespace}/{self.name}"

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One ``status.allocation.devices.results[]`` entry."""

    key: DeviceKey
    request: str
    admin_access: bool = False
    share_id: str | None = None
    consumed_capacity: Amounts | None = None  # normalised names
    tolerations: tuple[DeviceToleration, ...] = ()

    @property
    def driver(self) -> str:
        return self.key[0]

    @property
    def pool(self) -> str:
        return self.key[1]

    @property
    def device(self) -> str:
        return self.key[2]

    @property
    def name(self) -> str:
        return device_name(self.key)


@dataclass(frozen=True, slots=True)
class ReservedFor:
    resource: str
    name: str
    uid: str


@dataclass(frozen=True, slots=True)
class ClaimAllocation:
    """What an allocated claim holds: the index's per-claim entry and an in-flight record."""

    claim: ClaimRef
    results: tuple[AllocatedDevice, ...]
    node_selector: NodeSelector | None = None
    reserved_for: tuple[ReservedFor, ...] = ()

    @property
    def key(self) -> str:
        return self.claim.key


@dataclass(frozen=True, slots=True)
class ResourceClaim:
    claim: ClaimRef
    requests: tuple[DeviceRequest, ...]
    allocation: ClaimAllocation | None
    deleting: bool = False

    @property
    def key(self) -> str:
        return self.claim.key

    def request(self, name: str) -> DeviceRequest | None:
        for request in self.requests:
            if request.name == name:
                return request
        return None


def claim_key(obj: Mapping[str, Any]) -> str:
    """The index key of a ResourceClaim object (uid, else ``namespace/name``), e.g. for deletes."""
    return _claim_ref(mapping_at(obj, "metadata", "metadata")).key


def claim_ref(obj: Mapping[str, Any]) -> ClaimRef:
    """A ResourceClaim object's namespace, name and uid."""
    return _claim_ref(mapping_at(obj, "metadata", "metadata"))


def claim_allocation_from(obj: Mapping[str, Any]) -> tuple[str, ClaimAllocation | None]:
    """A claim's key and allocation, its spec unread: what a watch event changes in the index."""
    ref = _claim_ref(mapping_at(obj, "metadata", "metadata"))
    return ref.key, allocation_from(ref, mapping_at(obj, "status", "status"))


def _claim_ref(metadata: Mapping[str, Any]) -> ClaimRef:
    return ClaimRef(
        _string(metadata, "namespace", "metadata.namespace", required=False) or "default",
        _string(metadata, "name", "metadata.name", unique=True),
        _string(metadata, "uid", "metadata.uid", required=False, unique=True),
    )


def resource_claim_from(obj: Mapping[str, Any]) -> ResourceClaim:
    """Read a ResourceClaim: its requests (for tolerations and capacity) and its allocation."""
    metadata = mapping_at(obj, "metadata", "metadata")
    ref = _claim_ref(metadata)
    spec = mapping_at(obj, "spec", "spec")
    devices = mapping_at(spec, "devices", "spec.devices")
    status = mapping_at(obj, "status", "status")
    return ResourceClaim(
        claim=ref,
        requests=_requests(devices),
        allocation=allocation_from(ref, status),
        deleting=metadata.get("deletionTimestamp") is not None,
    )


def _requests(devices: Mapping[str, Any]) -> tuple[DeviceRequest, ...]:
    found = []
    for i, request in enumerate(_mappings(devices, "requests", "spec.devices.requests")):
        field = f"spec.devices.requests[{i}]"
        name = _string(request, "name", f"{field}.name")
        if request.get("exactly") is not None:
            found.append(
                _request(name, mapping_at(request, "exactly", f"{field}.exactly"), f"{field}.exactly")
            )
        for j, sub in enumerate(_mappings(request, "firstAvailable", f"{field}.firstAvailable")):
            where = f"{field}.firstAvailable[{j}]"
            found.append(_request(f"{name}/{_string(sub, 'name', f'{where}.name')}", sub, where))
    return tuple(found)


def _request(name: str, obj: Mapping[str, Any], field: str) -> DeviceRequest:
    capacity = mapping_at(obj, "capacity", f"{field}.capacity")
    requests = capacity.get("requests")
    return DeviceRequest(
        name=_intern(name),
        admin_access=_boolean(obj, "adminAccess", f"{field}.adminAccess"),
        tolerations=_tolerations(obj, f"{field}.tolerations"),
        capacity=None if requests is None else _amounts(requests, f"{field}.capacity.requests", "", None),
    )


def allocation_from(ref: ClaimRef, status: Mapping[str, Any]) -> ClaimAllocation | None:
    """``status.allocation`` (None when absent or null) with ``status.reservedFor``."""
    if status.get("allocation") is None:
        return None
    allocation = mapping_at(status, "allocation", "status.allocation")
    devices = mapping_at(allocation, "devices", "status.allocation.devices")
    results = tuple(
        _result(r, f"status.allocation.devices.results[{i}]")
        for i, r in enumerate(_mappings(devices, "results", "status.allocation.devices.results"))
    )
    reserved = tuple(
        ReservedFor(
            _string(r, "resource", f"status.reservedFor[{i}].resource", required=False) or "pods",
            _string(r, "name", f"status.reservedFor[{i}].name", unique=True),
            _string(r, "uid", f"status.reservedFor[{i}].uid", required=False, unique=True),
        )
        for i, r in enumerate(_mappings(status, "reservedFor", "status.reservedFor"))
    )
    selector = node_selector(allocation.get("nodeSelector"), "status.allocation.nodeSelector")
    return ClaimAllocation(ref, results, selector, reserved)


def _result(obj: Mapping[str, Any], field: str) -> AllocatedDevice:
    driver = _string(obj, "driver", f"{field}.driver")
    consumed = obj.get("consumedCapacity")
    share_id = _string(obj, "shareID", f"{field}.shareID", required=False, unique=True)
    return AllocatedDevice(
        key=(driver, _string(obj, "pool", f"{field}.pool"), _string(obj, "device", f"{field}.device")),
        request=_string(obj, "request", f"{field}.request"),
        admin_access=_boolean(obj, "adminAccess", f"{field}.adminAccess"),
        share_id=share_id or None,
        consumed_capacity=None
        if consumed is None
        else _amounts(consumed, f"{field}.consumedCapacity", driver, None),
        tolerations=_tolerations(obj, f"{field}.tolerations"),
    )


def allocation_written(old_obj: Mapping[str, Any] | None, new_obj: Mapping[str, Any]) -> bool:
    """Whether a ``resourceclaims/status`` UPDATE sets a new allocation (spec §3.1).

    Only nil → set is judged: clearing is a deallocation, and set → set is either an identical
    re-write (a reservedFor append) or a change the API server refuses itself.
    """
    return _allocation_of(old_obj) is None and _allocation_of(new_obj) is not None


def _allocation_of(obj: Mapping[str, Any] | None) -> object:
    if not isinstance(obj, MAPPING):
        return None
    status = obj.get("status")
    return status.get("allocation") if isinstance(status, MAPPING) else None


def is_allocation_write(obj: Mapping[str, Any], old_obj: Mapping[str, Any] | None, operation: str) -> bool:
    """A ResourceClaim status UPDATE whose old allocation is absent and new one present: the
    one transition judged (clearing, re-writing and reservedFor changes are not)."""
    return (
        operation == "UPDATE"
        and obj.get("kind") == "ResourceClaim"
        and old_obj is not None
        and allocation_written(old_obj, obj)
    )
