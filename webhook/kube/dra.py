"""Compact typed readers for ``resource.k8s.io/v1`` objects (DRA spec §2, §4).

Upstream: ``staging/src/k8s.io/api/resource/v1/types.go``. Only what decides whether a device
is handed out twice is kept: attributes, configs and binding conditions are dropped, so a
device of one node equals the same device of every other node and the records can be shared.

A device is ``(driver, pool, device)`` (``allocatedstate.go: DeviceID``). Quantities are exact
integers in nano-units: apimachinery rounds every quantity up to nano scale, so these sums and
comparisons are exactly the API server's, never floats. Capacity names are normalised: a
``<driver>/<name>`` of the device's own driver is ``<name>`` (spec open question 5; the API
documents the two spellings as one capacity).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from .errors import MAPPING, FieldError, mapping_at
from .quantity import CACHED_LENGTH, QuantityError, ceil_int, parse_quantity
from .selectors import node_selector_terms_match
from .tolerations import Taint

NANO = 10**9
DeviceKey = tuple[str, str, str]
PoolKey = tuple[str, str]
Amounts = tuple[tuple[str, int], ...]  # (name, nano-units), in the object's order

TAINT_EFFECTS_PREVENTING_ALLOCATION = frozenset({"NoSchedule", "NoExecute"})

_intern = sys.intern


def device_name(key: DeviceKey) -> str:
    """``driver/pool/device``, the way upstream prints a ``DeviceID``."""
    return "/".join(key)


def capacity_key(driver: str, name: str) -> str:
    """The capacity name with the device's own driver domain dropped (open question 5)."""
    prefix = f"{driver}/"
    return _intern(name[len(prefix) :] if name.startswith(prefix) else name)


def amount_of(amounts: Amounts | None, name: str) -> int | None:
    for key, amount in amounts or ():
        if key == name:
            return amount
    return None


_SUFFIXES = (
    *((s, 1024**p) for s, p in (("Ei", 6), ("Pi", 5), ("Ti", 4), ("Gi", 3), ("Mi", 2), ("Ki", 1))),
    *((s, 1000**p) for s, p in (("E", 6), ("P", 5), ("T", 4), ("G", 3), ("M", 2), ("k", 1))),
)


def format_nano(amount: int) -> str:
    """A quantity for messages: ``40Gi``, ``10G``, ``7``, ``1.5``."""
    whole, fraction = divmod(amount, NANO)
    if fraction:
        return f"{whole}.{fraction:09d}".rstrip("0")
    found = [(whole // size, suffix) for suffix, size in _SUFFIXES if whole and whole % size == 0]
    return "{}{}".format(*min(found)) if found else str(whole)


# --- field readers: every malformed value is a FieldError naming the field ---------------------


def quantity(raw: object, field: str) -> int:
    """A non-negative quantity in nano-units."""
    try:
        if type(raw) is str and len(raw) <= CACHED_LENGTH:
            return _nano(raw)  # a cluster repeats a handful of quantities
        return _nano_of(raw)
    except QuantityError as err:
        raise FieldError(field, str(err)) from None


def _nano_of(raw: object) -> int:
    value = parse_quantity(raw)
    if value < 0:
        raise QuantityError(f"{raw!r} must not be negative")
    return ceil_int(value * NANO)


_nano = lru_cache(maxsize=4096)(_nano_of)


def _string(
    obj: Mapping[str, Any], key: str, field: str, *, required: bool = True, unique: bool = False
) -> str:
    """A string; names that repeat across objects are interned, ``unique`` ones (uids) not."""
    value = obj.get(key)
    if type(value) is str and value:
        return value if unique else _intern(value)
    if value is None or value == "":
        if required:
            raise FieldError(field, "is required")
        return ""
    if not isinstance(value, str):
        raise FieldError(field, "must be a string")
    return value if unique else _intern(value)


def _integer(obj: Mapping[str, Any], key: str, field: str, default: int | None = None) -> int:
    value = obj.get(key)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(field, "must be an integer")
    return value


def _boolean(obj: Mapping[str, Any], key: str, field: str) -> bool:
    value = obj.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise FieldError(field, "must be true or false")
    return value


def _mappings(obj: Mapping[str, Any], key: str, field: str) -> list[Mapping[str, Any]]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise FieldError(field, "must be a list of objects")
    for item in value:  # decoded JSON holds dicts: the abstract Mapping check only for the rest
        if type(item) is not dict and not isinstance(item, MAPPING):
            raise FieldError(field, "must be a list of objects")
    return value


def _amounts(obj: Mapping[str, Any], field: str, driver: str, nested: str | None) -> Amounts:
    """``{name: quantity}`` or, with ``nested``, ``{name: {nested: quantity}}``."""
    if not isinstance(obj, MAPPING):
        raise FieldError(field, "must be a mapping")
    amounts = []
    for name, raw in obj.items():
        where = f"{field}.{name}"
        if nested is not None:
            if not isinstance(raw, MAPPING):
                raise FieldError(where, "must be a mapping")
            raw, where = raw.get(nested), f"{where}.{nested}"
        amounts.append(
            (capacity_key(driver, str(name)) if driver else _intern(str(name)), quantity(raw, where))
        )
    return tuple(amounts)


# --- node selection ------------------------------------------------------------------------------

Requirement = tuple[str, str, tuple[str, ...]]  # key, operator, values
_SHARED_MAX = 16_384  # distinct inputs remembered per kind: a cluster has a few per node type
_SHARED_KEY_BYTES = 2048  # larger inputs are parsed every time, never kept
_selectors: dict[str, NodeSelector] = {}
_devices: dict[str, Device] = {}


def _shared(cache: dict[str, Any], inputs: object, parse: Callable[[], Any]) -> Any:
    """``parse()``, once per distinct JSON of ``inputs`` (everything ``parse`` reads): the
    devices of every node of a type, and the node selectors of a node's claims, are one object.
    Errors are never cached; inputs that are not plain JSON are parsed every time."""
    try:
        # As a str: orjson's bytes keep a 4 KiB buffer whatever their length.
        key = orjson.dumps(inputs).decode()
    except TypeError:  # orjson.JSONEncodeError
        return parse()
    found = cache.get(key)
    if found is None:
        found = parse()
        if len(key) <= _SHARED_KEY_BYTES:
            if len(cache) >= _SHARED_MAX:
                cache.clear()
            cache[key] = found
    return found


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    match_expressions: tuple[Requirement, ...]
    match_fields: tuple[Requirement, ...]

    def as_mapping(self) -> dict[str, Any]:
        def listed(requirements):
            return [{"key": k, "operator": o, "values": list(v)} for k, o, v in requirements]

        return {"matchExpressions": listed(self.match_expressions), "matchFields": listed(self.match_fields)}


@dataclass(frozen=True, slots=True)
class NodeSelector:
    """A ``v1.NodeSelector``; equal selectors are one shared object (every claim of a node
    carries the same one)."""

    terms: tuple[NodeSelectorTerm, ...]

    def matches(self, labels: Mapping[str, str], node_name: str) -> bool:
        """Whether a node is selected (``nodeaffinity.NodeSelector.Match``)."""
        return node_selector_terms_match([t.as_mapping() for t in self.terms], labels, node_name)


def node_selector(raw: object, field: str) -> NodeSelector | None:
    if raw is None:
        return None
    return _shared(_selectors, raw, lambda: _node_selector(raw, field))


def _node_selector(raw: object, field: str) -> NodeSelector:
    if not isinstance(raw, MAPPING):
        raise FieldError(field, "must be a mapping")
    terms = []
    for i, term in enumerate(_mappings(raw, "nodeSelectorTerms", f"{field}.nodeSelectorTerms")):
        where = f"{field}.nodeSelectorTerms[{i}]"
        terms.append(
            NodeSelectorTerm(
                _requirements(term, "matchExpressions", f"{where}.matchExpressions"),
                _requirements(term, "matchFields", f"{where}.matchFields"),
            )
        )
    return NodeSelector(tuple(terms))


def _requirements(term: Mapping[str, Any], key: str, field: str) -> tuple[Requirement, ...]:
    found = []
    for i, requirement in enumerate(_mappings(term, key, field)):
        values = requirement.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise FieldError(f"{field}[{i}].values", "must be a list of strings")
        found.append(
            (
                _string(requirement, "key", f"{field}[{i}].key"),
                _string(requirement, "operator", f"{field}[{i}].operator"),
                tuple(_intern(v) for v in values),
            )
        )
    return tuple(found)


@dataclass(frozen=True, slots=True)
class NodeSelection:
    """Where devices are usable: exactly one of the three is set on a valid object."""

    node_name: str = ""
    all_nodes: bool = False
    node_selector: NodeSelector | None = None


def _node_selection(obj: Mapping[str, Any], field: str) -> NodeSelection | None:
    name = _string(obj, "nodeName", f"{field}.nodeName", required=False)
    all_nodes = _boolean(obj, "allNodes", f"{field}.allNodes")
    selector = node_selector(obj.get("nodeSelector"), f"{field}.nodeSelector")
    if not (name or all_nodes or selector):
        return None
    return NodeSelection(name, all_nodes, selector)


# --- ResourceSlice -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ValidRange:
    min: int
    max: int | None = None
    step: int | None = None


@dataclass(frozen=True, slots=True)
class RequestPolicy:
    """``capacity[].requestPolicy``: how much one share takes (``consumable_capacity.go``)."""

    default: int | None = None
    valid_values: tuple[int, ...] = ()
    valid_range: ValidRange | None = None


@dataclass(frozen=True, slots=True)
class Capacity:
    value: int
    policy: RequestPolicy | None = None


@dataclass(frozen=True, slots=True)
class CounterConsumption:
    counter_set: str
    counters: Amounts


@dataclass(frozen=True, slots=True)
class CounterSet:
    name: str
    counters: Amounts


@dataclass(frozen=True, slots=True)
class Device:
    """One device of a slice; hashable, so equal devices of different nodes share one record."""

    name: str
    capacity: tuple[tuple[str, Capacity], ...] = ()
    allow_multiple_allocations: bool = False
    consumes_counters: tuple[CounterConsumption, ...] = ()
    taints: tuple[Taint, ...] = ()
    node: NodeSelection | None = None  # only with perDeviceNodeSelection
    binds_to_node: bool = False

    def capacity_of(self, name: str) -> Capacity | None:
        for key, capacity in self.capacity:
            if key == name:
                return capacity
        return None


@dataclass(frozen=True, slots=True)
class ResourceSlice:
    name: str
    driver: str
    pool: str
    generation: int
    resource_slice_count: int
    node: NodeSelection | None
    per_device_node_selection: bool
    devices: tuple[Device, ...]
    shared_counters: tuple[CounterSet, ...]

    @property
    def pool_key(self) -> PoolKey:
        return (self.driver, self.pool)


def resource_slice_from(obj: Mapping[str, Any]) -> ResourceSlice:
    """Read a ResourceSlice; the 1.34 layout (counters and devices in one slice) included."""
    metadata = mapping_at(obj, "metadata", "metadata")
    spec = mapping_at(obj, "spec", "spec")
    driver = _string(spec, "driver", "spec.driver")
    pool = mapping_at(spec, "pool", "spec.pool")
    count = _integer(pool, "resourceSliceCount", "spec.pool.resourceSliceCount")
    if count < 1:
        raise FieldError("spec.pool.resourceSliceCount", "must be greater than zero")
    generation = _integer(pool, "generation", "spec.pool.generation", default=0)
    devices = tuple(
        _shared(
            _devices,
            [driver, *map(d.get, _DEVICE_FIELDS)],
            lambda d=d, i=i: _device(d, f"spec.devices[{i}]", driver),
        )
        for i, d in enumerate(_mappings(spec, "devices", "spec.devices"))
    )
    counters = tuple(
        CounterSet(
            _string(s, "name", f"spec.sharedCounters[{i}].name"),
            _amounts(s.get("counters") or {}, f"spec.sharedCounters[{i}].counters", "", "value"),
        )
        for i, s in enumerate(_mappings(spec, "sharedCounters", "spec.sharedCounters"))
    )
    return ResourceSlice(
        name=_string(metadata, "name", "metadata.name"),
        driver=driver,
        pool=_string(pool, "name", "spec.pool.name"),
        generation=generation,
        resource_slice_count=count,
        node=_node_selection(spec, "spec"),
        per_device_node_selection=_boolean(spec, "perDeviceNodeSelection", "spec.perDeviceNodeSelection"),
        devices=devices,
        shared_counters=counters,
    )


_DEVICE_FIELDS = (
    "name",
    "capacity",
    "allowMultipleAllocations",
    "consumesCounters",
    "taints",
    "nodeName",
    "nodeSelector",
    "allNodes",
    "bindsToNode",
)


def _device(obj: Mapping[str, Any], field: str, driver: str) -> Device:
    capacity = mapping_at(obj, "capacity", f"{field}.capacity")
    return Device(
        name=_string(obj, "name", f"{field}.name"),
        capacity=tuple(
            (capacity_key(driver, str(name)), _capacity(raw, f"{field}.capacity.{name}"))
            for name, raw in capacity.items()
        ),
        allow_multiple_allocations=_boolean(
            obj, "allowMultipleAllocations", f"{field}.allowMultipleAllocations"
        ),
        consumes_counters=tuple(
            CounterConsumption(
                _string(c, "counterSet", f"{field}.consumesCounters[{i}].counterSet"),
                _amounts(c.get("counters") or {}, f"{field}.consumesCounters[{i}].counters", "", "value"),
            )
            for i, c in enumerate(_mappings(obj, "consumesCounters", f"{field}.consumesCounters"))
        ),
        taints=tuple(
            _taint(t, f"{field}.taints[{i}]")
            for i, t in enumerate(_mappings(obj, "taints", f"{field}.taints"))
        ),
        node=_node_selection(obj, field),
        binds_to_node=_boolean(obj, "bindsToNode", f"{field}.bindsToNode"),
    )


def _capacity(raw: object, field: str) -> Capacity:
    if not isinstance(raw, MAPPING):
        raise FieldError(field, "must be a mapping")
    policy = raw.get("requestPolicy")
    return Capacity(quantity(raw.get("value"), f"{field}.value"), _policy(policy, f"{field}.requestPolicy"))


def _policy(raw: object, field: str) -> RequestPolicy | None:
    if raw is None:
        return None
    if not isinstance(raw, MAPPING):
        raise FieldError(field, "must be a mapping")
    default = raw.get("default")
    values = raw.get("validValues") or []
    if not isinstance(values, list):
        raise FieldError(f"{field}.validValues", "must be a list of quantities")
    valid_range = None
    if raw.get("validRange") is not None:
        rng = mapping_at(raw, "validRange", f"{field}.validRange")
        optional = {
            k: quantity(rng[k], f"{field}.validRange.{k}") for k in ("max", "step") if rng.get(k) is not None
        }
        valid_range = ValidRange(quantity(rng.get("min"), f"{field}.validRange.min"), **optional)
    return RequestPolicy(
        None if default is None else quantity(default, f"{field}.default"),
        tuple(quantity(v, f"{field}.validValues[{i}]") for i, v in enumerate(values)),
        valid_range,
    )


def _taint(obj: Mapping[str, Any], field: str) -> Taint:
    return Taint(
        _string(obj, "key", f"{field}.key"),
        _string(obj, "value", f"{field}.value", required=False),
        _string(obj, "effect", f"{field}.effect"),
    )


# --- ResourceClaim -------------------------------------------------------------------------------


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


# --- DeviceClass and DeviceTaintRule ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceClass:
    name: str
    extended_resource_name: str = ""


def device_class_from(obj: Mapping[str, Any]) -> DeviceClass:
    metadata = mapping_at(obj, "metadata", "metadata")
    spec = mapping_at(obj, "spec", "spec")
    return DeviceClass(
        _string(metadata, "name", "metadata.name"),
        _string(spec, "extendedResourceName", "spec.extendedResourceName", required=False),
    )


@dataclass(frozen=True, slots=True)
class DeviceTaintRule:
    """One taint for the devices its selector names (``DeviceTaintSelector``: driver, pool,
    device; unset fields match all). ``selects`` is False for a rule without a selector, and for a
    1.34 rule selecting by device class or CEL, which the guard cannot evaluate."""

    name: str
    taint: Taint
    driver: str = ""
    pool: str = ""
    device: str = ""
    selects: bool = True

    def applies_to(self, key: DeviceKey) -> bool:
        return self.selects and all(
            not want or want == have
            for want, have in zip((self.driver, self.pool, self.device), key, strict=True)
        )


def device_taint_rule_from(obj: Mapping[str, Any]) -> DeviceTaintRule:
    metadata = mapping_at(obj, "metadata", "metadata")
    spec = mapping_at(obj, "spec", "spec")
    selector = spec.get("deviceSelector")
    if selector is not None and not isinstance(selector, MAPPING):
        raise FieldError("spec.deviceSelector", "must be a mapping")
    selector = selector or {}
    return DeviceTaintRule(
        name=_string(metadata, "name", "metadata.name"),
        taint=_taint(mapping_at(spec, "taint", "spec.taint"), "spec.taint"),
        driver=_string(selector, "driver", "spec.deviceSelector.driver", required=False),
        pool=_string(selector, "pool", "spec.deviceSelector.pool", required=False),
        device=_string(selector, "device", "spec.deviceSelector.device", required=False),
        selects=spec.get("deviceSelector") is not None
        and not selector.get("deviceClassName")
        and not selector.get("selectors"),
    )


def is_allocation_write(obj: Mapping[str, Any], old_obj: Mapping[str, Any] | None, operation: str) -> bool:
    """A ResourceClaim status UPDATE whose old allocation is absent and new one present: the
    one transition judged (clearing, re-writing and reservedFor changes are not)."""
    return (
        operation == "UPDATE"
        and obj.get("kind") == "ResourceClaim"
        and old_obj is not None
        and allocation_written(old_obj, obj)
    )
