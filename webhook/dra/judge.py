"""Whether a new DRA allocation hands out what another claim holds (DRA spec §5).

The rules are the upstream allocator's (``structured/internal/experimental``), applied to an
allocation someone else computed: each finding names the device as ``driver/pool/device`` and,
where there is one, the claim holding it. ``in_flight`` are allocations already allowed but not
yet in the index; they count exactly like indexed claims.

The spec's open questions, as decided here:

1. A result naming a pool of which no slice exists is not ``DeviceNotInSlice`` (informer lag
   cannot be told from a bogus name); ``missing_pools`` lets the caller warn.
2. Available counters are reduced only by other claims' exclusive allocations, as upstream's
   ``checkAvailableCounters`` does; shares and admin access take none. The new allocation's
   admin-access results take no counters either (§5.5: access for monitoring hands out nothing).
3. Mixed use: a device another claim holds in any way can join this allocation only as one
   more share of a device that allows multiple allocations; anything else (a whole-device result
   next to shares, a shareID on a device that does not allow sharing) is
   ``DeviceAlreadyAllocated``.
4. 1.34 slices with counters and devices together and a counter-set name repeated across them:
   counters are per slice (``DeviceIndex.counter_scopes``).
5. ``<driver>/<capacity>`` and ``<capacity>`` are one capacity (``kube.dra.capacity_key``).

Also: a new share consumes the larger of its recorded ``consumedCapacity`` and what upstream
computes from its request (``GetConsumedCapacityFromRequest``), so an understated record cannot
squeeze in; tolerations are the request's (a status write cannot change the spec), the result's
copy only when the request is unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..kube.dra import (
    NANO,
    TAINT_EFFECTS_PREVENTING_ALLOCATION,
    AllocatedDevice,
    Capacity,
    ClaimAllocation,
    ClaimRef,
    Device,
    DeviceKey,
    PoolKey,
    ResourceClaim,
    ValidRange,
    amount_of,
    capacity_key,
    device_name,
    format_nano,
    resource_claim_from,
)
from ..state.devices import CounterScope, DeviceIndex, DeviceUse, add_use, holds

ALREADY_ALLOCATED = "DeviceAlreadyAllocated"
CAPACITY_EXCEEDED = "DeviceCapacityExceeded"
COUNTERS_EXCEEDED = "DeviceCountersExceeded"
TAINT_NOT_TOLERATED = "DeviceTaintNotTolerated"
NOT_IN_SLICE = "DeviceNotInSlice"
REASONS = (ALREADY_ALLOCATED, CAPACITY_EXCEEDED, COUNTERS_EXCEEDED, TAINT_NOT_TOLERATED, NOT_IN_SLICE)


@dataclass(frozen=True, slots=True)
class DeviceFinding:
    """One reason the allocation must not land, for one device."""

    reason: str
    device: str  # driver/pool/device
    message: str
    holders: tuple[ClaimRef, ...] = ()  # the claims holding what this allocation wants


def reasons(findings: Iterable[DeviceFinding]) -> list[str]:
    """Each reason once, in the spec's order (§5.9)."""
    found = {f.reason for f in findings}
    return [r for r in REASONS if r in found]


class _Holdings:
    """What other claims hold: the index plus in-flight allocations, never the judged claim."""

    def __init__(self, index: DeviceIndex, in_flight: Iterable[ClaimAllocation], own: str) -> None:
        self._index = index
        self._own = own
        self._extra: dict[DeviceKey, DeviceUse] = {}
        self._refs: dict[str, ClaimRef] = {}
        for allocation in in_flight:
            if allocation.key == own or index.claim(allocation.key) is not None:
                continue  # the index shows it already: counting it twice would double its share
            self._refs[allocation.key] = allocation.claim
            for device, holding in holds(allocation):
                self._extra[device] = add_use(self._extra.get(device, DeviceUse()), holding)

    def use(self, key: DeviceKey) -> DeviceUse:
        use = self._index.use(key)
        extra = self._extra.get(key)
        if extra is not None:
            use = DeviceUse(use.exclusive + extra.exclusive, use.shares + extra.shares)
        own = self._own
        if own in use.exclusive or any(s.claim == own for s in use.shares):
            use = DeviceUse(
                tuple(c for c in use.exclusive if c != own), tuple(s for s in use.shares if s.claim != own)
            )
        return use

    def refs(self, claims: Iterable[str]) -> tuple[ClaimRef, ...]:
        found = []
        for key in dict.fromkeys(claims):
            allocation = self._index.claim(key)
            found.append(
                allocation.claim if allocation is not None else self._refs.get(key, ClaimRef("", key))
            )
        return tuple(found)


def judge_allocation(
    claim: ResourceClaim | ClaimAllocation | Mapping[str, Any],
    index: DeviceIndex,
    *,
    in_flight: Iterable[ClaimAllocation] = (),
) -> list[DeviceFinding]:
    """Findings against the claim's new ``status.allocation``; empty means allow (§5.9).

    An indexed ``ClaimAllocation`` can be judged too (an audit of what is already allocated):
    without its spec, its results' own tolerations and recorded consumption stand."""
    claim = _as_claim(claim)
    if claim.allocation is None:
        return []
    held = _Holdings(index, in_flight, claim.key)
    results = claim.allocation.results
    return [
        *_already_allocated(claim, results, index, held),
        *_capacity_exceeded(claim, results, index, held),
        *_counters_exceeded(results, index, held),
        *_taints_not_tolerated(claim, results, index),
        *_not_in_slice(results, index),
    ]


def missing_pools(
    claim: ResourceClaim | ClaimAllocation | Mapping[str, Any], index: DeviceIndex
) -> list[PoolKey]:
    """Pools the allocation names of which the index has no slice (open question 1)."""
    claim = _as_claim(claim)
    results = claim.allocation.results if claim.allocation is not None else ()
    return list(dict.fromkeys(r.key[:2] for r in results if index.pool(*r.key[:2]) is None))


def _as_claim(claim: ResourceClaim | ClaimAllocation | Mapping[str, Any]) -> ResourceClaim:
    if isinstance(claim, ResourceClaim):
        return claim
    if isinstance(claim, ClaimAllocation):
        return ResourceClaim(claim.claim, (), claim)
    return resource_claim_from(claim)


def _is_share(result: AllocatedDevice, device: Device | None) -> bool:
    """A shareID makes a share only on a device that allows it (§5.2 rule 2); an unknown
    device is taken at the result's word."""
    return result.share_id is not None and (device is None or device.allow_multiple_allocations)


# --- §5.2 exclusive use ------------------------------------------------------------------------------


def _already_allocated(claim: ResourceClaim, results, index: DeviceIndex, held: _Holdings):
    """``allocateDevice`` / ``deviceInUse`` / ``allocatingDeviceForClaim``."""
    earlier: dict[DeviceKey, list[AllocatedDevice]] = {}
    for result in results:
        device = index.device(result.key)
        before = earlier.setdefault(result.key, [])
        if any(not _may_repeat(result, other, device) for other in before):
            yield DeviceFinding(
                ALREADY_ALLOCATED,
                result.name,
                f"{result.name} appears twice in this allocation "
                f"(requests {before[0].request} and {result.request})",
                (claim.claim,),
            )
        before.append(result)
        if result.admin_access:
            continue  # admin access blocks nobody and is blocked by nobody
        use = held.use(result.key)
        if use.exclusive:
            holders = held.refs(use.exclusive)
            yield DeviceFinding(
                ALREADY_ALLOCATED, result.name, f"{result.name} is allocated to {_names(holders)}", holders
            )
        elif use.shares and not _is_share(result, device):
            holders = held.refs(s.claim for s in use.shares)
            yield DeviceFinding(
                ALREADY_ALLOCATED,
                result.name,
                f"{result.name} is shared by {_names(holders)}; it cannot also be allocated whole",
                holders,
            )


def _may_repeat(a: AllocatedDevice, b: AllocatedDevice, device: Device | None) -> bool:
    """One claim may name a device twice only as shares (or admin access) of a device that
    allows multiple allocations."""
    if device is None:
        return a.share_id is not None and b.share_id is not None
    return device.allow_multiple_allocations and all(r.admin_access or r.share_id is not None for r in (a, b))


# --- §5.3 consumable capacity ------------------------------------------------------------------------


def _capacity_exceeded(claim: ResourceClaim, results, index: DeviceIndex, held: _Holdings):
    """``CmpRequestOverCapacity``: every share's consumption, others' and ours, within each
    capacity of the device; equality fits."""
    shares: dict[DeviceKey, list[AllocatedDevice]] = {}
    for result in results:
        device = index.device(result.key)
        shareable = device is not None and device.allow_multiple_allocations
        if shareable and not result.admin_access and result.share_id is not None:
            shares.setdefault(result.key, []).append(result)
    for key, ours in shares.items():
        device = index.device(key)
        others = held.use(key).shares
        for name, capacity in device.capacity:
            in_use = sum(amount_of(s.consumed_capacity, name) or 0 for s in others)
            wanted = sum(consumption(claim, r, name, capacity) for r in ours)
            if in_use + wanted > capacity.value:
                holders = held.refs(s.claim for s in others if amount_of(s.consumed_capacity, name))
                yield DeviceFinding(
                    CAPACITY_EXCEEDED,
                    device_name(key),
                    f"{device_name(key)} capacity {name}: this allocation takes {format_nano(wanted)}, "
                    f"{format_nano(in_use)} of {format_nano(capacity.value)} is in use"
                    + (f" by {_names(holders)}" if holders else ""),
                    holders,
                )


def consumption(claim: ResourceClaim, result: AllocatedDevice, name: str, capacity: Capacity) -> int:
    """What one new share takes of one capacity: its record, but never less than its request."""
    recorded = amount_of(result.consumed_capacity, name)
    request = claim.request(result.request)
    if request is None:
        return recorded if recorded is not None else consumed_from_request(None, capacity)
    requested = None
    for key, amount in request.capacity or ():
        if capacity_key(result.driver, key) == name:
            requested = amount
    return max(recorded or 0, consumed_from_request(requested, capacity))


def consumed_from_request(requested: int | None, capacity: Capacity) -> int:
    """``calculateConsumedCapacity``: no request takes the policy's default, else the whole
    capacity; a request is rounded up to the policy's range or valid values."""
    policy = capacity.policy
    if requested is None:
        return policy.default if policy is not None and policy.default is not None else capacity.value
    if policy is None:
        return requested
    if policy.valid_range is not None:
        return _round_up_range(requested, policy.valid_range)
    if policy.valid_values:
        return next((v for v in policy.valid_values if requested <= v), requested)
    return requested


def _round_up_range(requested: int, valid: ValidRange) -> int:
    """``roundUpRange``: at least ``min``, then up to ``min + n * step`` in whole units
    (upstream steps with ``Quantity.Value()``, which rounds up to an integer)."""
    if requested < valid.min:
        return valid.min
    if valid.step is None:
        return requested
    units, step, low = (-(-v // NANO) for v in (requested, valid.step, valid.min))
    if step <= 0:
        return requested
    steps = -(-(units - low) // step)
    return (low + step * steps) * NANO


# --- §5.5 counters -----------------------------------------------------------------------------------


def _counters_exceeded(results, index: DeviceIndex, held: _Holdings):
    """``checkAvailableCounters``: per pool and counter set, what other claims' exclusive
    devices take plus what this allocation takes must stay within every counter."""
    by_pool: dict[PoolKey, dict[str, tuple[AllocatedDevice, Device]]] = {}
    for result in results:
        device = index.device(result.key)
        if result.admin_access or device is None or not device.consumes_counters:
            continue
        use = held.use(result.key)
        if use.exclusive:
            continue  # DeviceAlreadyAllocated already; its counters are taken by its holder
        if _is_share(result, device) and any(s.consumed_capacity is not None for s in use.shares):
            continue  # ``skipCounterCheck``: a shared device in use took its counters once
        by_pool.setdefault(result.key[:2], {}).setdefault(result.device, (result, device))
    for key, ours in by_pool.items():
        pool = index.pool(*key)
        for scope in index.counter_scopes(pool):
            mine = [(r, d) for r, d in ours.values() if scope.devices.get(d.name) is d]
            if mine:
                yield from _scope_findings(key, scope, mine, held)


def _scope_findings(pool: PoolKey, scope: CounterScope, mine, held: _Holdings):
    available = {(s.name, c): total for s in scope.counter_sets.values() for c, total in s.counters}
    taken_by: dict[tuple[str, str], list[str]] = {}
    for device in scope.devices.values():
        holders = held.use((*pool, device.name)).exclusive
        if holders:
            for counter, amount in _consumed(device):
                if counter in available:
                    available[counter] -= amount
                    taken_by.setdefault(counter, []).extend(holders)
    wanted: dict[tuple[str, str], int] = {}
    for _, device in mine:
        for counter, amount in _consumed(device):
            wanted[counter] = wanted.get(counter, 0) + amount
    exceeded = [c for c, left in available.items() if wanted.get(c, 0) > left]
    if not exceeded:
        return
    culprits = [(r, d, [c for c in exceeded if c in dict(_consumed(d))]) for r, d in mine]
    if not any(found for _, _, found in culprits):  # a set already over its limit: upstream refuses
        culprits = [(r, d, exceeded) for r, d in mine]
    for result, _, counters in culprits:
        if not counters:
            continue
        holders = held.refs(c for counter in counters for c in taken_by.get(counter, ()))
        details = ", ".join(
            f"{name}/{counter}: this allocation takes {format_nano(wanted.get((name, counter), 0))} "
            f"of {format_nano(max(available[(name, counter)], 0))} left"
            for name, counter in counters
        )
        message = f"{result.name} counters {details}" + (f" (held by {_names(holders)})" if holders else "")
        yield DeviceFinding(COUNTERS_EXCEEDED, result.name, message, holders)


def _consumed(device: Device) -> list[tuple[tuple[str, str], int]]:
    return [((c.counter_set, name), amount) for c in device.consumes_counters for name, amount in c.counters]


# --- §5.6 taints ---------------------------------------------------------------------------------


def _taints_not_tolerated(claim: ResourceClaim, results, index: DeviceIndex):
    """``taintPreventsAllocation``: a NoSchedule or NoExecute taint no toleration of the request
    tolerates. Admin access is checked too (the check is outside the in-use branch)."""
    for result in results:
        taints = index.taints(result.key)
        if not taints:
            continue
        request = claim.request(result.request)
        tolerations = request.tolerations if request is not None else result.tolerations
        untolerated = [
            str(t)
            for t in taints
            if t.effect in TAINT_EFFECTS_PREVENTING_ALLOCATION
            and not any(x.tolerates(t) for x in tolerations)
        ]
        if untolerated:
            yield DeviceFinding(
                TAINT_NOT_TOLERATED,
                result.name,
                f"{result.name} has taint {', '.join(untolerated)} "
                f"that request {result.request} does not tolerate",
            )


# --- §5.4 pools ----------------------------------------------------------------------------------


def _not_in_slice(results, index: DeviceIndex):
    """Only a complete, valid pool at its current generation proves a device is not there."""
    for key in dict.fromkeys(r.key for r in results):
        pool = index.pool(*key[:2])
        if pool is None or key[2] in pool.devices or not pool.complete or index.invalid_reason(pool):
            continue
        yield DeviceFinding(
            NOT_IN_SLICE,
            device_name(key),
            f"{device_name(key)} is in no ResourceSlice of pool {key[0]}/{key[1]} "
            f"at its current generation {pool.generation}",
        )


def _names(refs: Iterable[ClaimRef]) -> str:
    return ", ".join(f"claim {r}" for r in refs)
