"""The kubelet's NUMA topology hints and their merge, in closed form (topology-admission-spec §2, §3).

Masks are ints over zone *indexes* (bit ``i`` is the node's ``i``-th NUMA zone, ascending ids),
so the numeric order of masks is the kubelet's ``bitmask.IsLessThan`` order. A provider answers
for one resource with ``Hints``: ``None`` when it has no preference (``{nil, true}``), an empty
tuple when nothing can satisfy it (``{nil, false}``), else its ``(mask, preferred)`` pairs in
``bitmask.IterateBitMasks`` order. ``admit`` is the merge's verdict without the cross product:
tests/unit/checks/test_topology_merge.py proves it equal to a transcription of ``HintMerger`` on every input.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from itertools import combinations

NONE = "none"
BEST_EFFORT = "best-effort"
RESTRICTED = "restricted"
SINGLE_NUMA_NODE = "single-numa-node"
REFUSING_POLICIES = (RESTRICTED, SINGLE_NUMA_NODE)  # the only ones whose admit can say no

Hint = tuple[int, bool]  # (mask, preferred)
Hints = tuple[Hint, ...] | None


def width(mask: int) -> int:
    return mask.bit_count()


def iterate_masks(zones: int) -> Iterator[int]:
    """Every non-empty subset of ``zones`` by size, then in order (``bitmask.IterateBitMasks``)."""
    bits = [i for i in range(zones.bit_length()) if zones >> i & 1]

    def subsets(start: int, size: int, accum: int) -> Iterator[int]:
        if size == 0:
            yield accum
            return
        for k in range(start, len(bits) - size + 1):
            yield from subsets(k + 1, size - 1, accum | 1 << bits[k])

    for size in range(1, len(bits) + 1):
        yield from subsets(0, size, 0)


@lru_cache(maxsize=1024)
def masks_of_width(zones: int, size: int) -> tuple[int, ...]:
    """The subsets of ``zones`` with ``size`` zones, in ``iterate_masks`` order (cached: a
    cluster has a few zone layouts)."""
    bits = [i for i in range(zones.bit_length()) if zones >> i & 1]
    return tuple(sum(1 << b for b in chosen) for chosen in combinations(bits, size))


def mask_sum(values: Sequence[int], mask: int) -> int:
    """The sum of ``values`` over the zones of ``mask`` (its set bits only: most masks are narrow)."""
    total = 0
    while mask:
        low = mask & -mask
        total += values[low.bit_length() - 1]
        mask ^= low
    return total


def count_hints(
    zones: int,
    capacity: Sequence[int],
    free: Sequence[int],
    request: int,
    reusable: tuple[int, int] = (0, 0),
    preferred_only: bool = False,
) -> Hints:
    """CPU and device hints: ``generateCPUTopologyHints`` (cpumanager/policy_static.go) and
    ``generateDeviceTopologyHints`` (devicemanager/topology_hints.go) have one shape.

    A mask is a hint when its free amount plus the reusable amount (held by this pod's init
    containers, all of which must lie inside the mask: ``reusable`` is (zones, amount)) covers
    the request; it is preferred when no narrower mask has the *capacity* for the request.
    ``preferred_only``: only the preferred hints, all ``admit`` reads (an empty tuple where there
    are none, which it reads alike): the masks of one width instead of all 2^N.
    """
    reuse_zones, reuse_amount = reusable
    if preferred_only:
        return _preferred_counts(zones, capacity, free, request, reusable)
    min_width = width(zones)
    found: list[int] = []
    for mask in iterate_masks(zones):
        if mask_sum(capacity, mask) >= request:
            min_width = min(min_width, width(mask))
        if reuse_zones & ~mask:
            continue
        if mask_sum(free, mask) + reuse_amount >= request:
            found.append(mask)
    return tuple((mask, width(mask) == min_width) for mask in found)


def _preferred_counts(
    zones: int, capacity: Sequence[int], free: Sequence[int], request: int, reusable: tuple[int, int]
) -> Hints:
    """``count_hints``' preferred hints: the narrowest width some mask's capacity covers (the
    widest capacities first: ``min_width``), then the masks of that width that have room."""
    reuse_zones, reuse_amount = reusable
    ordered = sorted((capacity[i] for i in range(zones.bit_length()) if zones >> i & 1), reverse=True)
    preferred, total = width(zones), 0
    for size, amount in enumerate(ordered, 1):
        total += amount
        if total >= request:
            preferred = size
            break
    return tuple(
        (mask, True)
        for mask in masks_of_width(zones, preferred)
        if not reuse_zones & ~mask and mask_sum(free, mask) + reuse_amount >= request
    )


def memory_hints(
    zones: int,
    allocatable: Mapping[str, Sequence[int]],
    free: Mapping[str, Sequence[int]],
    requests: Mapping[str, int],
    reusable: Mapping[int, Mapping[str, int]] | None = None,
    preferred_only: bool = False,
) -> Hints:
    """The memory manager's hints, one list for memory and every hugepages size together
    (``memorymanager/policy_static.go :: calculateHints``): a mask qualifies when, for every
    requested type, its allocatable and then its free amount (plus what this pod's init
    containers hold on exactly that mask) cover the request. Preferred: the narrowest width
    whose allocatable covers them all. No mask at all is an empty hint map, which the topology
    manager reads as no preference (None), not as impossible (§2.2). The groups of earlier
    multi-NUMA allocations are not in the NRT (§9) and are not modelled."""
    reusable = reusable or {}
    if preferred_only:
        return _preferred_memory(zones, allocatable, free, requests, reusable)
    min_width = width(zones)
    found: list[int] = []
    for mask in iterate_masks(zones):
        if any(mask_sum(allocatable[t], mask) < amount for t, amount in requests.items()):
            continue
        min_width = min(min_width, width(mask))
        held = reusable.get(mask, {})
        if all(mask_sum(free[t], mask) + held.get(t, 0) >= amount for t, amount in requests.items()):
            found.append(mask)
    if not found:
        return None
    return tuple((mask, width(mask) == min_width) for mask in found)


def _preferred_memory(
    zones: int,
    allocatable: Mapping[str, Sequence[int]],
    free: Mapping[str, Sequence[int]],
    requests: Mapping[str, int],
    reusable: Mapping[int, Mapping[str, int]],
) -> Hints:
    """``memory_hints``' preferred hints, width by width from the narrowest: the first width
    whose allocatable covers the requests is the preferred one. Where none of its masks has the
    free memory, one wider mask that has it stands for the rest (a non-preferred list, which
    ``admit`` reads as no preferred hint); where no mask has it, None (no hints at all)."""
    preferred: int | None = None
    for size in range(1, width(zones) + 1):
        found = []
        for mask in masks_of_width(zones, size):
            if any(mask_sum(allocatable[t], mask) < amount for t, amount in requests.items()):
                continue
            if preferred is None:
                preferred = size
            held = reusable.get(mask, {})
            if all(mask_sum(free[t], mask) + held.get(t, 0) >= amount for t, amount in requests.items()):
                if size > preferred:
                    return ((mask, False),)
                found.append((mask, True))
        if found:
            return tuple(found)
    return None


def narrowest(masks: set[int]) -> int:
    """``NUMAInfo.Narrowest`` over a set: fewest zones, then the numerically smallest mask."""
    return min(masks, key=lambda m: (width(m), m))


def admit(policy: str, hints: Mapping[str, Hints], zones: int) -> tuple[bool, int]:
    """The topology manager's verdict and the mask it stores (topology-admission-spec §3.4).

    ``restricted`` admits when one mask is a preferred hint of every resource with hints (a
    preferred merge needs every hint preferred and every mask equal: ``mergePermutation``);
    ``single-numa-node`` when that mask is a single zone (``filterSingleNumaHints``). The mask
    is the narrowest such (``HintMerger.compare``). Without hints it is every zone; for the
    policies that never refuse it is every zone too (their choice is not modelled).
    """
    if policy not in REFUSING_POLICIES:
        return True, zones
    lists = [h for h in hints.values() if h is not None]
    if not lists:
        return True, zones
    common: set[int] | None = None
    for hint_list in lists:
        preferred = {mask for mask, is_preferred in hint_list if is_preferred and mask}
        common = preferred if common is None else common & preferred
    assert common is not None
    if policy == SINGLE_NUMA_NODE:
        common = {mask for mask in common if width(mask) == 1}
    if not common:
        return False, 0
    return True, narrowest(common)
