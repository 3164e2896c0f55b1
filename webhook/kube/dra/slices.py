"""``ResourceSlice``: the devices a driver publishes per pool, with their capacity, counters
and taints (DRA spec §2)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import MAPPING, FieldError, mapping_at
from ..tolerations import Taint
from .fields import Amounts, PoolKey, _amounts, _boolean, _integer, _mappings, _string, capacity_key, quantity
from .node_selection import NodeSelection, _node_selection, _shared

_devices: dict[str, Device] = {}  # shared: every node of a type publishes the same devices


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
