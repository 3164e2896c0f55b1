"""Which DRA devices are in use, kept incrementally from watch events (DRA spec §5.1, §5.4, §8).

The index mirrors the scheduler's ``allocateddevices.go`` (a claim holds its devices from the
event that shows its allocation until the one that clears it or deletes the claim) and
``pools_experimental.go: GatherPools`` (only a pool's highest generation counts). A claim event
touches that claim's devices, a slice event that slice's pool: nothing rescans the cluster.

Not thread-safe: writes and reads go under the caller's lock, as for ``ClusterState``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..kube.dra import (
    Amounts,
    ClaimAllocation,
    CounterSet,
    Device,
    DeviceClass,
    DeviceKey,
    DeviceTaintRule,
    NodeSelection,
    PoolKey,
    ResourceSlice,
    claim_allocation_from,
    claim_ref,
    device_class_from,
    device_taint_rule_from,
    resource_slice_from,
)
from ..kube.tolerations import Taint


@dataclass(frozen=True, slots=True)
class Share:
    """One share of a device that allows multiple allocations (``SharedDeviceID``)."""

    claim: str  # the holder's key
    share_id: str
    consumed_capacity: Amounts | None


@dataclass(frozen=True, slots=True)
class DeviceUse:
    """Who holds a device: claims holding it whole, and shares. More than one exclusive holder
    means the device is already handed out twice."""

    exclusive: tuple[str, ...] = ()
    shares: tuple[Share, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.exclusive or self.shares)


_NO_USE = DeviceUse()


def holds(allocation: ClaimAllocation) -> Iterator[tuple[DeviceKey, str | Share]]:
    """What each result of an allocated claim holds (``foreachAllocatedDevice``): admin access
    holds nothing, a result with a shareID holds a share, any other result the whole device."""
    key = allocation.key
    for result in allocation.results:
        if result.admin_access:
            continue
        if result.share_id is not None:
            yield result.key, Share(key, result.share_id, result.consumed_capacity)
        else:
            yield result.key, key


def add_use(use: DeviceUse, holding: str | Share) -> DeviceUse:
    if isinstance(holding, Share):
        return DeviceUse(use.exclusive, (*use.shares, holding))
    return DeviceUse((*use.exclusive, holding), use.shares)


def _without(items: tuple, item: object) -> tuple:
    """``items`` less its last occurrence of ``item``: removal undoes the matching addition."""
    for i in range(len(items) - 1, -1, -1):
        if items[i] == item:
            return items[:i] + items[i + 1 :]
    return items


@dataclass(frozen=True, slots=True)
class CounterScope:
    """Counter sets and the devices drawing on them: the whole pool, or (1.34 layout with a
    set name repeated across slices, open question 4) one slice."""

    counter_sets: Mapping[str, CounterSet]
    devices: Mapping[str, Device]  # the devices of the scope that consume counters


class Pool:
    """A pool at its current (highest) generation: its devices and counter sets."""

    __slots__ = (
        "_counter_devices",
        "_counter_sets",
        "devices",
        "driver",
        "duplicate_counter_set",
        "duplicate_device",
        "generation",
        "mixed_layout",
        "name",
        "resource_slice_count",
        "slices",
    )

    def __init__(self, driver: str, name: str, generation: int) -> None:
        self.driver = driver
        self.name = name
        self.generation = generation
        self.resource_slice_count = 0
        self.slices: tuple[str, ...] = ()  # current-generation slice names
        self.devices: dict[str, Device] = {}
        self._counter_devices: dict[str, Device] | None = None
        self._counter_sets: dict[str, CounterSet] | None = None
        self.duplicate_device = ""
        self.duplicate_counter_set = ""
        self.mixed_layout = False  # a slice carries devices and sharedCounters (1.34)

    @property
    def complete(self) -> bool:
        """All slices of the generation are here (``GatherPools: isComplete``)."""
        return len(self.slices) == self.resource_slice_count

    @property
    def counter_devices(self) -> Mapping[str, Device]:
        return self._counter_devices or {}

    @property
    def counter_sets(self) -> Mapping[str, CounterSet]:
        return self._counter_sets or {}

    @property
    def per_slice_counters(self) -> bool:
        """1.34 layout with a counter-set name in two slices: each slice keeps its own counters,
        as the 1.34 allocator did (``availableCounters`` keyed by slice name)."""
        return self.mixed_layout and bool(self.duplicate_counter_set)

    def add(self, piece: ResourceSlice) -> None:
        self.slices = (*self.slices, piece.name)
        self.resource_slice_count = max(self.resource_slice_count, piece.resource_slice_count)
        for device in piece.devices:
            if device.name in self.devices:
                self.duplicate_device = self.duplicate_device or device.name
                continue
            self.devices[device.name] = device
            if device.consumes_counters:
                if self._counter_devices is None:
                    self._counter_devices = {}
                self._counter_devices[device.name] = device
        for counter_set in piece.shared_counters:
            if self._counter_sets is None:
                self._counter_sets = {}
            if counter_set.name in self._counter_sets:
                self.duplicate_counter_set = self.duplicate_counter_set or counter_set.name
            else:
                self._counter_sets[counter_set.name] = counter_set
        if piece.devices and piece.shared_counters:
            self.mixed_layout = True


# Deleted claim keys remembered: far more than can be in flight within a reservation's TTL.
DELETED_KEYS = 16384


class DeviceIndex:
    """Devices in use, pools, device classes and taint rules; mutated only by the methods below."""

    __slots__ = (
        "_claims",
        "_classes",
        "_deleted",
        "_named",
        "_pool_slices",
        "_pools",
        "_reserved",
        "_slices",
        "_taint_rules",
        "_uses",
        "_versions",
        "revision",
    )

    def __init__(self) -> None:
        self._claims: dict[str, ClaimAllocation] = {}  # allocated claims only
        # Every claim, allocated or not, by (namespace, name): a pod names its claims that way.
        self._named: dict[tuple[str, str], str] = {}
        # Every claim's namespace, name and resourceVersion, by key: an in-flight allocation
        # counts until its claim changes, and a watch deletes a claim by its key.
        self._versions: dict[str, tuple[str, str, str]] = {}
        # Allocated claims by the pods they are reserved for (``status.reservedFor``): a bind
        # of such a pod must go where its devices are.
        self._reserved: dict[str, tuple[str, ...]] = {}
        # Keys of claims seen deleted, oldest first (at most ``DELETED_KEYS``): evidence that an
        # allocation recorded in flight for one of them will never land.
        self._deleted: dict[str, None] = {}
        self._uses: dict[DeviceKey, DeviceUse] = {}
        self._slices: dict[str, ResourceSlice] = {}
        self._pool_slices: dict[PoolKey, set[str]] = {}  # every generation
        self._pools: dict[PoolKey, Pool] = {}
        self._classes: dict[str, DeviceClass] = {}
        self._taint_rules: dict[str, DeviceTaintRule] = {}
        self.revision = 0  # bumped by every change

    # --- claims ----------------------------------------------------------------------------------

    def set_claim(self, obj: Mapping[str, Any]) -> None:
        """A ResourceClaim added or updated: it holds its devices iff it has an allocation."""
        ref = claim_ref(obj)
        key, allocation = claim_allocation_from(obj)
        self._deleted.pop(key, None)  # a hand-written key (namespace/name) may come back
        self._named[(ref.namespace, ref.name)] = key
        version = (obj.get("metadata") or {}).get("resourceVersion")
        self._versions[key] = (ref.namespace, ref.name, version if isinstance(version, str) else "")
        if allocation is None:
            self.remove_claim(key)
        else:
            self.set_allocation(allocation)

    def delete_claim(self, obj: Mapping[str, Any]) -> None:
        """A ResourceClaim deleted: its devices are free, and pods naming it find nothing."""
        self.delete_claim_key(claim_ref(obj).key)

    def delete_claim_key(self, key: str) -> None:
        self._deleted[key] = None
        if len(self._deleted) > DELETED_KEYS:
            del self._deleted[next(iter(self._deleted))]
        known = self._versions.pop(key, None)
        if known is not None and self._named.get(known[:2]) == key:
            del self._named[known[:2]]
        self.remove_claim(key)

    def version(self, key: str) -> str | None:
        """The resourceVersion of the claim as last seen ("" when it had none), or None."""
        known = self._versions.get(key)
        return None if known is None else known[2]

    def deleted(self, key: str) -> bool:
        """Whether the claim was seen deleted (among the last ``DELETED_KEYS`` deletions)."""
        return key in self._deleted

    def claim_keys(self) -> list[str]:
        """Every claim's key, allocated or not."""
        return list(self._versions)

    def slice_names(self) -> list[str]:
        return list(self._slices)

    def class_names(self) -> list[str]:
        return list(self._classes)

    def taint_rule_names(self) -> list[str]:
        return list(self._taint_rules)

    def named(self, namespace: str, name: str) -> tuple[str, ClaimAllocation | None] | None:
        """A claim by namespace and name: its key and allocation (None: not allocated), or None
        when the index knows no such claim."""
        key = self._named.get((namespace, name))
        return None if key is None else (key, self._claims.get(key))

    def set_allocation(self, allocation: ClaimAllocation) -> None:
        key = allocation.key
        old = self._claims.get(key)
        if old == allocation:
            return
        self.revision += 1
        self._claims[key] = allocation
        if old is None or old.reserved_for != allocation.reserved_for:
            self._unreserve(key, old)
            for consumer in allocation.reserved_for:
                self._reserved[consumer.uid] = (*self._reserved.get(consumer.uid, ()), key)
        if old is not None and old.results == allocation.results:
            return  # reservedFor or nodeSelector only: the same devices
        if old is not None:
            self._release(old)
        for device, holding in holds(allocation):
            self._uses[device] = add_use(self._uses.get(device, _NO_USE), holding)

    def remove_claim(self, key: str) -> None:
        """The claim was deleted or deallocated: its devices are free at once."""
        old = self._claims.pop(key, None)
        if old is not None:
            self.revision += 1
            self._release(old)
            self._unreserve(key, old)

    def _unreserve(self, key: str, old: ClaimAllocation | None) -> None:
        for consumer in old.reserved_for if old is not None else ():
            left = tuple(k for k in self._reserved.get(consumer.uid, ()) if k != key)
            if left:
                self._reserved[consumer.uid] = left
            else:
                self._reserved.pop(consumer.uid, None)

    def reserved_for(self, pod_uid: str) -> list[ClaimAllocation]:
        """The allocated claims reserved for a pod (its ``status.reservedFor`` names the pod)."""
        return [self._claims[key] for key in self._reserved.get(pod_uid, ())]

    def _release(self, allocation: ClaimAllocation) -> None:
        for device, holding in holds(allocation):
            use = self._uses.get(device, _NO_USE)
            if isinstance(holding, Share):
                use = DeviceUse(use.exclusive, _without(use.shares, holding))
            else:
                use = DeviceUse(_without(use.exclusive, holding), use.shares)
            if use:
                self._uses[device] = use
            else:
                self._uses.pop(device, None)

    def claim(self, key: str) -> ClaimAllocation | None:
        return self._claims.get(key)

    def claims(self) -> Mapping[str, ClaimAllocation]:
        """Allocated claims by key (read-only view)."""
        return MappingProxyType(self._claims)

    def use(self, key: DeviceKey) -> DeviceUse:
        return self._uses.get(key, _NO_USE)

    def uses(self) -> Mapping[DeviceKey, DeviceUse]:
        """Every device some claim holds (read-only view)."""
        return MappingProxyType(self._uses)

    # --- slices and pools --------------------------------------------------------------------------

    def set_slice(self, obj: Mapping[str, Any]) -> None:
        """A ResourceSlice added or updated: only its pool changes."""
        piece = resource_slice_from(obj)
        old = self._slices.get(piece.name)
        if old == piece:
            return
        self.revision += 1
        self._slices[piece.name] = piece
        if old is not None and old.pool_key != piece.pool_key:
            self._drop_from_pool(old)
            old = None
        key = piece.pool_key
        self._pool_slices.setdefault(key, set()).add(piece.name)
        pool = self._pools.get(key)
        if old is not None:
            self._rebuild(key)  # a slice changed in place: recount its pool
        elif pool is None or piece.generation > pool.generation:
            pool = self._pools[key] = Pool(piece.driver, piece.pool, piece.generation)
            pool.add(piece)  # a newer generation replaces every older slice's devices
        elif piece.generation == pool.generation:
            pool.add(piece)
        # else: out-dated, ignored (``addSlice``), but remembered for when newer ones go

    def remove_slice(self, name: str) -> None:
        old = self._slices.pop(name, None)
        if old is not None:
            self.revision += 1
            self._drop_from_pool(old)

    def _drop_from_pool(self, piece: ResourceSlice) -> None:
        key = piece.pool_key
        names = self._pool_slices.get(key, set())
        names.discard(piece.name)
        if not names:
            self._pool_slices.pop(key, None)
            self._pools.pop(key, None)
        elif piece.name in self._pools[key].slices:
            self._rebuild(key)

    def _rebuild(self, key: PoolKey) -> None:
        """Recompute a pool from its slices: the highest generation that is left counts."""
        pieces = sorted((self._slices[n] for n in self._pool_slices[key]), key=lambda s: s.name)
        generation = max(s.generation for s in pieces)
        pool = self._pools[key] = Pool(key[0], key[1], generation)
        for piece in pieces:
            if piece.generation == generation:
                pool.add(piece)

    def free_devices_on(self, node: str, labels: Mapping[str, str], enough: int) -> int:
        """How many devices of current pool generations the node can use that no claim holds
        (a device that allows multiple allocations always counts), up to ``enough``: what the
        scheduler could still allocate there. Device classes' selectors are not evaluated:
        any device counts, so this rules nodes out, never in."""
        found = 0
        for pool in list(self._pools.values()):
            for name in pool.slices:
                piece = self._slices.get(name)
                if piece is None:
                    continue
                for device in piece.devices:
                    where = device.node if piece.per_device_node_selection else piece.node
                    free = device.allow_multiple_allocations or not self.use((*piece.pool_key, device.name))
                    if free and _usable(where, node, labels):
                        found += 1
                        if found >= enough:
                            return found
        return found

    def pool(self, driver: str, name: str) -> Pool | None:
        return self._pools.get((driver, name))

    def pools(self) -> Mapping[PoolKey, Pool]:
        return MappingProxyType(self._pools)

    def device(self, key: DeviceKey) -> Device | None:
        """The device in its pool's current generation (§5.4: lookups use only that)."""
        pool = self._pools.get(key[:2])
        return None if pool is None else pool.devices.get(key[2])

    def invalid_reason(self, pool: Pool) -> str:
        """Why upstream would refuse to allocate from the pool (``buildPool``), or ``""``."""
        if pool.duplicate_device:
            return f"duplicate device name {pool.duplicate_device}"
        if pool.duplicate_counter_set and not pool.per_slice_counters:
            return f"duplicate counter set name {pool.duplicate_counter_set}"
        for scope in self.counter_scopes(pool):
            for device in scope.devices.values():
                for consumption in device.consumes_counters:
                    counter_set = scope.counter_sets.get(consumption.counter_set)
                    if counter_set is None:
                        return f"counter set {consumption.counter_set} not found"
                    known = {name for name, _ in counter_set.counters}
                    for name, _ in consumption.counters:
                        if name not in known:
                            return f"counter {name} not found in counter set {counter_set.name}"
        return ""

    def counter_scopes(self, pool: Pool) -> tuple[CounterScope, ...]:
        """The pool's counter sets with the devices consuming from them (§5.5)."""
        if not pool.counter_devices and not pool.counter_sets:
            return ()
        if not pool.per_slice_counters:
            return (CounterScope(pool.counter_sets, pool.counter_devices),)
        scopes = []
        for name in pool.slices:
            piece = self._slices[name]
            devices = {d.name: d for d in piece.devices if d.consumes_counters}
            if devices or piece.shared_counters:
                scopes.append(CounterScope({s.name: s for s in piece.shared_counters}, devices))
        return tuple(scopes)

    # --- classes and taint rules -------------------------------------------------------------------

    def set_device_class(self, obj: Mapping[str, Any]) -> None:
        device_class = device_class_from(obj)
        if self._classes.get(device_class.name) != device_class:
            self.revision += 1
            self._classes[device_class.name] = device_class

    def remove_device_class(self, name: str) -> None:
        if self._classes.pop(name, None) is not None:
            self.revision += 1

    def device_class(self, name: str) -> DeviceClass | None:
        return self._classes.get(name)

    def set_taint_rule(self, obj: Mapping[str, Any]) -> None:
        rule = device_taint_rule_from(obj)
        if self._taint_rules.get(rule.name) != rule:
            self.revision += 1
            self._taint_rules[rule.name] = rule

    def remove_taint_rule(self, name: str) -> None:
        if self._taint_rules.pop(name, None) is not None:
            self.revision += 1

    def taints(self, key: DeviceKey, device: Device | None = None) -> tuple[Taint, ...]:
        """The device's own taints and those of every DeviceTaintRule selecting it
        (``resourceslice/tracker``: the scheduler sees slices patched with the rules)."""
        device = device or self.device(key)
        own = device.taints if device is not None else ()
        return own + tuple(r.taint for r in self._taint_rules.values() if r.applies_to(key))


def index_of(
    slices: Iterable[Mapping[str, Any]] = (),
    claims: Iterable[Mapping[str, Any]] = (),
    classes: Iterable[Mapping[str, Any]] = (),
    taint_rules: Iterable[Mapping[str, Any]] = (),
) -> DeviceIndex:
    """An index built from object lists (snapshots, tests)."""
    index = DeviceIndex()
    for obj in slices:
        index.set_slice(obj)
    for obj in claims:
        index.set_claim(obj)
    for obj in classes:
        index.set_device_class(obj)
    for obj in taint_rules:
        index.set_taint_rule(obj)
    return index


def _usable(where: NodeSelection | None, node: str, labels: Mapping[str, str]) -> bool:
    """Whether devices published for ``where`` are usable on ``node`` (a slice's nodeName,
    allNodes or nodeSelector; a device's own with perDeviceNodeSelection)."""
    if where is None:
        return False
    if where.all_nodes:
        return True
    if where.node_name:
        return where.node_name == node
    return where.node_selector is not None and where.node_selector.matches(labels, node)
