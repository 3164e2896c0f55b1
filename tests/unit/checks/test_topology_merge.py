"""The closed forms of topology-admission-spec §3.4 (``kube.numa.admit``) against a direct
transcription of the kubelet's merge: ``filterProvidersHints``, ``filterSingleNumaHints``,
``mergePermutation`` and ``HintMerger`` (pkg/kubelet/cm/topologymanager/policy.go,
policy_single_numa_node.go, policy_restricted.go), over every permutation of hints, for random
topologies of 1-4 NUMA nodes and random pods."""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.checks.topology import MEMORY, Unit, ZoneState
from webhook.kube.numa import admit, iterate_masks
from webhook.state.topology import NodeTopology, ZoneAmounts

GiB = 1024**3


@dataclass(frozen=True)
class TopologyHint:
    """``topologymanager.TopologyHint``: ``affinity`` None is a nil ``NUMANodeAffinity``."""

    affinity: int | None
    preferred: bool


def count(mask: int) -> int:
    return mask.bit_count()


def is_narrower_than(a: int, b: int) -> bool:
    """``bitMask.IsNarrowerThan``: fewer bits, or as many and numerically smaller."""
    return a < b if count(a) == count(b) else count(a) < count(b)


def filter_providers_hints(providers: list[dict[str, list[TopologyHint] | None]]) -> list[list[TopologyHint]]:
    out = []
    for hints in providers:
        if not hints:
            out.append([TopologyHint(None, True)])
            continue
        for resource in hints:
            if hints[resource] is None:
                out.append([TopologyHint(None, True)])
            elif len(hints[resource]) == 0:
                out.append([TopologyHint(None, False)])
            else:
                out.append(hints[resource])
    return out


def filter_single_numa_hints(all_hints: list[list[TopologyHint]]) -> list[list[TopologyHint]]:
    return [
        [
            h
            for h in hints
            if (h.affinity is None and h.preferred)
            or (h.affinity is not None and count(h.affinity) == 1 and h.preferred)
        ]
        for hints in all_hints
    ]


def merge_permutation(default: int, permutation: list[TopologyHint]) -> TopologyHint:
    preferred = True
    affinities: list[int] = []
    for hint in permutation:
        if hint.affinity is not None:
            affinities.append(hint.affinity)
            if hint.affinity != affinities[0]:
                preferred = False
        if not hint.preferred:
            preferred = False
    merged = default
    for a in affinities:
        merged &= a
    return TopologyHint(merged, preferred)


def max_of_min_affinity_counts(hints: list[list[TopologyHint]]) -> int:
    best = 0
    for resource_hints in hints:
        narrowest = None
        for h in resource_hints:
            if h.affinity is None:
                continue
            if narrowest is None or is_narrower_than(h.affinity, narrowest):
                narrowest = h.affinity
        if narrowest is not None and count(narrowest) > best:
            best = count(narrowest)
    return best


class HintMerger:
    def __init__(self, default: int, hints: list[list[TopologyHint]]) -> None:
        self.default = default
        self.hints = hints
        self.best_non_preferred = max_of_min_affinity_counts(hints)

    @staticmethod
    def compare_masks(current: TopologyHint, candidate: TopologyHint) -> TopologyHint:
        if candidate.affinity == current.affinity:
            return current
        best = (
            current.affinity if is_narrower_than(current.affinity, candidate.affinity) else candidate.affinity
        )
        return current if best == current.affinity else candidate

    def compare(self, current: TopologyHint | None, candidate: TopologyHint) -> TopologyHint | None:
        if count(candidate.affinity) == 0:
            return current
        if current is None:
            return candidate
        if not current.preferred and candidate.preferred:
            return candidate
        if current.preferred and not candidate.preferred:
            return current
        if current.preferred and candidate.preferred:
            return self.compare_masks(current, candidate)
        best = self.best_non_preferred
        if count(current.affinity) > best:
            return self.compare_masks(current, candidate)
        if count(current.affinity) == best:
            if count(candidate.affinity) != best:
                return current
            return self.compare_masks(current, candidate)
        if count(candidate.affinity) > best:
            return current
        if count(candidate.affinity) == best:
            return candidate
        if count(candidate.affinity) > count(current.affinity):
            return candidate
        if count(candidate.affinity) < count(current.affinity):
            return current
        return self.compare_masks(current, candidate)

    def merge(self) -> TopologyHint:
        best: TopologyHint | None = None

        def iterate(i: int, accum: list[TopologyHint]) -> None:
            nonlocal best
            if i == len(self.hints):
                best = self.compare(best, merge_permutation(self.default, accum))
                return
            for hint in self.hints[i]:
                iterate(i + 1, [*accum, hint])

        iterate(0, [])
        return best if best is not None else TopologyHint(self.default, False)


def kubelet_merge(policy: str, providers, default: int) -> tuple[bool, int | None]:
    """``Policy.Merge`` of each policy: (admit, the stored affinity; None for nil)."""
    filtered = filter_providers_hints(providers)
    if policy == "single-numa-node":
        best = HintMerger(default, filter_single_numa_hints(filtered)).merge()
        if best.affinity == default:
            best = TopologyHint(None, best.preferred)
        return best.preferred, best.affinity
    best = HintMerger(default, filtered).merge()
    return (best.preferred if policy == "restricted" else True), best.affinity


# -- the inputs -----------------------------------------------------------------------------------

RESOURCES = ("cpu", "memory", "hugepages-1Gi", "example.com/gpu")
UNIT = {"cpu": 1000, "memory": GiB, "hugepages-1Gi": GiB, "example.com/gpu": 1}


@st.composite
def topologies(draw) -> NodeTopology:
    zones = draw(st.integers(1, 4))
    listed = draw(st.lists(st.sampled_from(RESOURCES), min_size=1, max_size=4, unique=True))
    resources = {}
    for r in listed:
        capacity = tuple(draw(st.integers(0, 8)) * UNIT[r] for _ in range(zones))
        allocatable = tuple(c - draw(st.integers(0, c // UNIT[r])) * UNIT[r] for c in capacity)
        available = tuple(a - draw(st.integers(0, a // UNIT[r])) * UNIT[r] for a in allocatable)
        resources[r] = ZoneAmounts((1 << zones) - 1, capacity, allocatable, available)
    return NodeTopology("n", tuple(range(zones)), resources, "restricted", "container")


@st.composite
def units(draw, topology: NodeTopology) -> Unit:
    def amount(r: str) -> int:
        return draw(st.integers(0, 12)) * UNIT[r] if r in topology.resources else 0

    memory = {r: a for r in ("memory", "hugepages-1Gi") if (a := amount(r))}
    gpu = amount("example.com/gpu")
    return Unit("container", "c", amount("cpu"), memory, {"example.com/gpu": gpu} if gpu else {})


def providers_of(hints, unit: Unit) -> list[dict[str, list[TopologyHint] | None]]:
    """The three providers' maps, as ``GetTopologyHints`` returns them."""

    def listed(found):
        return [TopologyHint(mask, preferred) for mask, preferred in found]

    cpu = {"cpu": listed(hints["cpu"])} if "cpu" in hints else None
    memory = {}
    if hints.get(MEMORY) is not None:
        memory = {t: listed(hints[MEMORY]) for t in unit.memory}
    devices = {r: listed(hints[r]) for r in unit.devices}
    return [cpu, memory, devices]


@settings(max_examples=400, deadline=None)
@given(st.data(), st.sampled_from(["restricted", "single-numa-node", "best-effort", "none"]))
def test_closed_forms_equal_the_kubelets_hint_merger_on_every_permutation(data, policy):
    topology = data.draw(topologies())
    unit = data.draw(units(topology))
    hints = ZoneState.of(topology).hints(unit, complete=True)
    everything = (1 << len(topology.zones)) - 1
    ok, mask = admit(policy, hints, everything)
    # The check's own lists (the preferred hints only) give the same verdict and mask.
    assert admit(policy, ZoneState.of(topology).hints(unit), everything) == (ok, mask)
    if policy == "none":
        assert ok  # admitPolicyNone: the merge is never called
        return
    kubelet_ok, kubelet_mask = kubelet_merge(policy, providers_of(hints, unit), everything)
    assert ok == kubelet_ok
    if ok and policy != "best-effort":
        assert mask == (everything if kubelet_mask is None else kubelet_mask)


@st.composite
def hint_lists(draw):
    """Arbitrary hint lists, shapes no provider would send included: the closed forms hold for all."""
    zones = draw(st.integers(1, 4))
    masks = list(iterate_masks((1 << zones) - 1))
    lists = draw(
        st.lists(
            st.one_of(
                st.none(),
                st.just(()),
                st.lists(st.tuples(st.sampled_from(masks), st.booleans()), min_size=1, max_size=5).map(tuple),
            ),
            max_size=4,
        )
    )
    return zones, {f"r{i}": h for i, h in enumerate(lists)}


@settings(max_examples=400, deadline=None)
@given(hint_lists(), st.sampled_from(["restricted", "single-numa-node"]))
def test_closed_forms_hold_for_arbitrary_hint_lists(zones_and_hints, policy):
    zones, hints = zones_and_hints
    everything = (1 << zones) - 1
    providers = [{r: None if h is None else [TopologyHint(m, p) for m, p in h]} for r, h in hints.items()]
    ok, mask = admit(policy, hints, everything)
    kubelet_ok, kubelet_mask = kubelet_merge(policy, providers, everything)
    assert ok == kubelet_ok
    if ok:
        assert mask == (everything if kubelet_mask is None else kubelet_mask)
