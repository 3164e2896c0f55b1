"""The kubelet's topology manager admit handler: ``TopologyAffinityError``. topology-admission-spec §7.

Handler 3 in the kubelet's order (``containerManager.GetAllocateResourcesPodAdmitHandler``), after
sysctls and before the predicates. With ``restricted`` or ``single-numa-node``, a pod whose CPUs,
memory, hugepages or devices cannot be aligned on the NUMA zones the policy allows is refused.
The zones and policy come from the node's NodeResourceTopology (``state.topology``), as the
guard's config leaves them (``policies.nodeAdmission.topology``); without them nothing is said.

Container scope evaluates init containers then app containers in order, each against what the
earlier ones left (§4.1, §5.2); pod scope evaluates the pod's totals once (§4.2). The hints and
their merge are ``kube.numa``'s.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..kube.numa import REFUSING_POLICIES, SINGLE_NUMA_NODE, Hints, admit, count_hints, memory_hints, width
from ..kube.podfingerprint import METHOD_WITH_EXCLUSIVE_RESOURCES, sign
from ..kube.quantity import format_amount
from ..kube.reasons import SMT_ALIGNMENT_ERROR, TOPOLOGY_AFFINITY_ERROR
from ..kube.resources import container_requests, qos_class
from ..state.model import NodeUsage
from ..state.topology import (
    CPU,
    INIT,
    POD,
    SIDECAR,
    Footprint,
    NodeTopology,
    Unit,
    is_memory,
    pod_containers,
    pod_level_resources,
)
from .failure import FINGERPRINT_MISMATCH, Failure

MESSAGE = "Resources cannot be allocated with Topology locality"  # TopologyAffinityError.Error()
MEMORY = "memory"  # the memory manager's one hint list, for memory and hugepages together
POD_SCOPE = "pod"


def topology_affinity(pod, node, usage=None, kubelet=None) -> Failure | None:
    """``topologymanager.scope.Admit``: per unit, the merge of the policies that can refuse (the
    first unit the policy cannot merge into a preferred hint refuses the whole pod), then the
    providers' ``Allocate`` for its containers, where the CPU manager's ``full-pcpus-only``
    refuses with ``SMTAlignmentError`` (topology-admission-spec §9; only where the config
    declares it, with the threads per core)."""
    topology: NodeTopology | None = kubelet.topology if kubelet is not None else None
    threads = kubelet.smt_threads if kubelet is not None else 0
    cpus = _exclusive_cpus(pod.spec) if threads else []
    if topology is None or topology.policy not in REFUSING_POLICIES or not topology.zones:
        return smt_alignment(cpus, threads)  # scope_none / best-effort: Allocate every container
    seen = PodsSeen(topology, usage)
    zones = _zones_after(topology, tuple(seen.unaccounted()))
    pod_scope = topology.effective_scope == POD_SCOPE
    for i, unit in enumerate(units_on(pod.record.numa, topology)):  # the footprint, read once
        if not unit.empty:  # else every provider returns nil: {nil, true}
            ok, mask = admit(topology.policy, zones.hints(unit), zones.all)
            if not ok:
                return seen.doubted(Failure(TOPOLOGY_AFFINITY_ERROR, MESSAGE, zones.detail(unit, topology)))
            zones.allocate(unit, mask)
        failure = smt_alignment(cpus if pod_scope else cpus[i : i + 1], threads)
        if failure is not None:
            return failure
    return None


# Per node: its NRT, the footprints placed on it, and the free amounts after them. A burst of binds
# to one node places the same pods for every decision until one of them changes: a memo keyed by
# identity (an NRT and a pod's footprint are immutable, and replaced when they change).
_PLACED: dict[str, tuple[NodeTopology, tuple[Footprint, ...], dict[str, list[int]]]] = {}
_PLACED_NODES = 8192


def _zones_after(topology: NodeTopology, placed: tuple[Footprint, ...]) -> ZoneState:
    """The node's zones with the pods its NRT does not count yet placed, in order."""
    if not placed:
        return ZoneState.of(topology)
    memo = _PLACED.get(topology.node)
    if memo is not None and memo[0] is topology and _same(memo[1], placed):
        return ZoneState(topology, {r: list(free) for r, free in memo[2].items()})
    zones = ZoneState.of(topology)
    for steps in placed:
        zones.place(steps)
    if len(_PLACED) >= _PLACED_NODES:
        _PLACED.clear()
    _PLACED[topology.node] = (topology, placed, {r: list(free) for r, free in zones.free.items()})
    return zones


def _same(before: tuple[Footprint, ...], now: tuple[Footprint, ...]) -> bool:
    return len(before) == len(now) and all(a is b for a, b in zip(before, now, strict=True))


@dataclass(slots=True)
class PodsSeen:
    """What the node's NRT may not count yet (issue 27 item 4): the pods the state saw bound
    after it last changed and the binds in flight (``NodeUsage.unaccounted``, in bind order), and
    whether the pods the state knows on the node are those its ``nodeTopologyPodsFingerprint``
    was computed over."""

    topology: NodeTopology
    usage: NodeUsage | None
    _matches: bool | None = None
    _checked: bool = False

    def unaccounted(self) -> Iterator[Footprint]:
        """The footprints to place before the pod's. Where the fingerprint matches the bound pods,
        the NRT counts every one of them: only the binds in flight remain (scheduler-plugins'
        ``overreserve`` cache flushes its assumed pods on a match the same way)."""
        usage = self.usage
        if usage is None or not usage.unaccounted:
            return
        for key in usage.unaccounted:
            record = usage.pods.get(key)
            if record is None:
                continue
            bound = key == record.key  # a bind in flight is filed under another key
            if bound and self.fingerprint_matches():
                continue
            yield record.numa

    def fingerprint_matches(self) -> bool | None:
        """Whether the NRT's fingerprint is that of the pods bound on the node as the state knows
        them (``podfingerprint.Fingerprint.Sign``; with method ``with-exclusive-resources``, only
        the pods that align something there); None where the NRT publishes none."""
        if not self._checked:
            self._checked = True
            published = self.topology.fingerprint
            if published and self.usage is not None:
                self._matches = self.known_fingerprint() == published
        return self._matches

    def known_fingerprint(self) -> str:
        """The fingerprint of the pods the state knows bound on the node, as the exporter would
        sign them (the audit shows it beside the published one)."""
        return sign(self._hashes())

    def known_pods(self) -> int:
        """How many pods that fingerprint is computed over."""
        return sum(1 for _ in self._hashes())

    def _hashes(self) -> Iterator[int]:
        assert self.usage is not None
        exclusive = self.topology.fingerprint_method == METHOD_WITH_EXCLUSIVE_RESOURCES
        aligned = self.topology.resources
        memory_manager = any(is_memory(r) for r in aligned)
        for key, record in self.usage.pods.items():
            if key != record.key:
                continue  # a bind in flight: not on the node yet
            if exclusive and all(u.on(aligned, memory_manager).empty for u in record.numa):
                continue
            yield record.ident

    def doubted(self, failure: Failure) -> Failure:
        """A refusal, downgraded to a warning where the NRT's fingerprint shows it was computed
        over other pods than the state knows on the node: its ``available`` cannot be trusted."""
        if self.fingerprint_matches() is not False:
            return failure
        return replace(
            failure,
            hint=failure.hint + "; the NRT's nodeTopologyPodsFingerprint does not match the pods the "
            "guard knows on the node, so its amounts may be stale: warned, not refused",
            doubt=FINGERPRINT_MISMATCH,
        )


def smt_alignment(cpus: list[tuple[str, str, int]], threads: int) -> Failure | None:
    """``staticPolicy.Allocate`` with ``full-pcpus-only``: a container's exclusive CPUs must be
    whole cores. Its other refusal (not enough free physical CPUs) needs the cores' state, which
    no API object shows: not predicted."""
    for kind, name, count in cpus:
        if count and count % threads:
            return Failure(
                SMT_ALIGNMENT_ERROR,
                f"SMT Alignment Error: requested {count} cpus not multiple cpus per core = {threads}",
                f"the node's kubelet runs the CPU manager with full-pcpus-only and {threads} threads per "
                f"core: {kind} {name!r} must ask for a multiple of {threads} CPUs",
            )
    return None


def _exclusive_cpus(spec: Mapping[str, Any]) -> list[tuple[str, str, int]]:
    """Each container's exclusive CPUs, in admission order (``guaranteedCPUs``: Guaranteed pods
    without pod-level resources, whole CPUs only; 0 for the others)."""
    guaranteed = qos_class(spec) == "Guaranteed" and not pod_level_resources(spec)
    found = []
    for kind, container, where in pod_containers(spec):
        cpu = container_requests(container, where).get(CPU, 0) if guaranteed else 0
        found.append((kind, str(container.get("name") or ""), cpu // 1000 if cpu % 1000 == 0 else 0))
    return found


def units_on(steps: Footprint, topology: NodeTopology) -> list[Unit]:
    """A pod's container units narrowed to what the node aligns (§5.1), or in pod scope its one
    unit (§4.2)."""
    aligned = topology.resources
    memory_manager = any(is_memory(r) for r in aligned)
    narrowed = [unit.on(aligned, memory_manager) for unit in steps]
    if topology.effective_scope != POD_SCOPE:
        return narrowed
    return [_pod_unit(narrowed)]


def _pod_unit(steps: list[Unit]) -> Unit:
    """The pod scope's request: per resource, the larger of the app containers plus sidecars and
    the peak of each init container over the sidecars before it (``podGuaranteedCPUs``,
    ``getPodRequestedResources``, ``getPodDeviceRequest``). Memory types only init containers ask
    for are dropped, as ``getPodRequestedResources`` iterates the app containers' types."""

    def total(of) -> dict[str, int]:
        long_running: dict[str, int] = {}
        sidecars: dict[str, int] = {}
        init_peak: dict[str, int] = {}
        for unit in steps:
            amounts = of(unit)
            if unit.kind == INIT:
                for r, a in amounts.items():
                    init_peak[r] = max(init_peak.get(r, 0), sidecars.get(r, 0) + a)
                continue
            for r, a in amounts.items():
                long_running[r] = long_running.get(r, 0) + a
                if unit.kind == SIDECAR:
                    sidecars[r] = sidecars.get(r, 0) + a
        return {r: max(a, long_running.get(r, 0)) for r, a in {**long_running, **init_peak}.items()}

    apps = {r for unit in steps if unit.kind != INIT for r in unit.memory}
    memory = {r: a for r, a in total(lambda u: u.memory).items() if r in apps and a > 0}
    cpu = total(lambda u: {CPU: u.cpu}).get(CPU, 0)
    devices = {r: a for r, a in total(lambda u: u.devices).items() if a > 0}
    return Unit(POD, "", cpu, memory, devices)


def unit_amounts(unit: Unit) -> list[tuple[str, int]]:
    return [(r, a) for r, a in ((CPU, unit.cpu), *unit.memory.items(), *unit.devices.items()) if a]


@dataclass(slots=True)
class ZoneState:
    """The node's free amounts per zone while the pod's units are admitted one by one, and what
    this pod's regular init containers hold for later ones to reuse (§5.2): CPUs and devices as
    (zones, amount), memory per exact mask (``getPodReusableMemory``)."""

    topology: NodeTopology
    free: dict[str, list[int]]
    reuse: dict[str, tuple[int, int]] = field(default_factory=dict)
    memory_reuse: dict[int, dict[str, int]] = field(default_factory=dict)

    @classmethod
    def of(cls, topology: NodeTopology) -> ZoneState:
        return cls(topology, {r: list(z.available) for r, z in topology.resources.items()})

    @property
    def all(self) -> int:
        return (1 << len(self.topology.zones)) - 1

    def _amounts(self, resource: str, key: str) -> tuple[int, ...]:
        zone = self.topology.resources.get(resource)
        return getattr(zone, key) if zone is not None else (0,) * len(self.topology.zones)

    def _free(self, resource: str) -> list[int]:
        return self.free.get(resource) or [0] * len(self.topology.zones)

    def hints(self, unit: Unit, complete: bool = False) -> dict[str, Hints]:
        """Every provider's hints for ``unit``, by resource (memory types as one list): only the
        preferred ones, all ``admit`` reads, unless ``complete``."""
        only = not complete
        found: dict[str, Hints] = {}
        if unit.cpu:
            cpu = self.topology.resources[CPU]
            reusable = self.reuse.get(CPU, (0, 0))
            found[CPU] = count_hints(cpu.listed, cpu.capacity, self._free(CPU), unit.cpu, reusable, only)
        if unit.memory:
            found[MEMORY] = memory_hints(
                self.all,
                {t: self._amounts(t, "allocatable") for t in unit.memory},
                {t: self._free(t) for t in unit.memory},
                unit.memory,
                self.memory_reuse,
                only,
            )
        for resource, amount in unit.devices.items():
            found[resource] = count_hints(
                self.all,
                self._amounts(resource, "capacity"),
                self._free(resource),
                amount,
                self.reuse.get(resource, (0, 0)),
                only,
            )
        return found

    def place(self, steps: Footprint) -> None:
        """An earlier pod the NRT does not count yet, placed where the kubelet would have put it
        (the best hint, §3.2: for one zone, the lowest-numbered that fits) and taken from there.
        Only its long-running containers hold anything now (an init container's allocation is
        reused by them, §5.2). Where the placement cannot be predicted (a multi-zone result,
        whose exact zones are ``takeByTopology``'s, §7 notes; or no hint the policy accepts on
        what this view shows), its amounts count against every zone it could be on."""
        for unit in units_on(tuple(u for u in steps if u.kind != INIT), self.topology):
            if unit.empty:
                continue
            ok, mask = admit(self.topology.policy, self.hints(unit), self.all)
            if ok and width(mask) == 1:
                for resource, amount in unit_amounts(unit):
                    self._take(resource, amount, mask)
            else:
                self._charge(unit, mask if ok else self.all)

    def _charge(self, unit: Unit, mask: int) -> None:
        """``unit`` taken whole from each zone of ``mask`` (scheduler-plugins' ``overreserve``
        cache: ``resourceStore.UpdateNRT`` subtracts an assumed pod from every zone)."""
        for resource, amount in unit_amounts(unit):
            free = self.free.setdefault(resource, [0] * len(self.topology.zones))
            for i in range(len(free)):
                if mask >> i & 1:
                    free[i] = max(0, free[i] - amount)

    def allocate(self, unit: Unit, mask: int) -> None:
        """What the providers' ``Allocate`` takes for an admitted container, on ``mask``: this
        pod's reusable amounts first, then the zones' free amounts, lowest zone first (the exact
        CPUs of a multi-zone result are ``takeByTopology``'s: §7 notes)."""
        if unit.kind == POD:
            return  # pod scope: one step, nothing after it to see what it took
        for resource, amount in ((CPU, unit.cpu), *unit.devices.items()):
            if amount:
                self._take_counted(resource, amount, mask, unit.kind)
        for resource, amount in unit.memory.items():
            self._take_memory(resource, amount, mask, unit.kind)

    def _take_counted(self, resource: str, amount: int, mask: int, kind: str) -> None:
        """``updateCPUsToReuse`` / ``devicesToReuse``: a regular init container's allocation is
        added to what the pod can reuse; sidecars and app containers consume it."""
        zones, held = self.reuse.get(resource, (0, 0))
        reused = min(held, amount)
        taken = self._take(resource, amount - reused, mask)
        if kind == INIT:
            self.reuse[resource] = (zones | taken, held + amount - reused)
        else:
            self.reuse[resource] = (zones if held - reused else 0, held - reused)

    def _take_memory(self, resource: str, amount: int, mask: int, kind: str) -> None:
        """``Allocate`` then ``updatePodReusableMemory``: an init container's block is reusable on
        exactly its mask; later containers on that mask take it before free memory."""
        held = self.memory_reuse.get(mask, {}).get(resource, 0)
        self._take(resource, max(0, amount - held), mask)
        on_mask = self.memory_reuse.setdefault(mask, {})
        if kind == INIT:
            on_mask[resource] = max(held, amount)
        elif held:
            on_mask[resource] = max(0, held - amount)

    def _take(self, resource: str, amount: int, mask: int) -> int:
        """Subtract ``amount`` from the zones of ``mask``, lowest first; the zones it came from."""
        free = self.free.setdefault(resource, [0] * len(self.topology.zones))
        used = 0
        for i in range(len(free)):
            if amount <= 0:
                break
            if mask >> i & 1 and free[i] > 0:
                took = min(free[i], amount)
                free[i] -= took
                amount -= took
                used |= 1 << i
        return used

    def detail(self, unit: Unit, topology: NodeTopology) -> str:
        """The guard's words: the policy, what could not be aligned, and each zone's free amount
        of each resource it asked for."""
        asked = [CPU] if unit.cpu else []
        asked += [*unit.memory, *unit.devices]
        zones = "; ".join(
            f"{topology.zone_name(i)}: "
            + ", ".join(f"{r} {format_amount(r, self._free(r)[i])}" for r in asked)
            for i in range(len(topology.zones))
        )
        where = (
            "one NUMA zone"
            if topology.policy == SINGLE_NUMA_NODE
            else "one set of NUMA zones as narrow as each resource needs"
        )
        return (
            f"topology manager policy {topology.policy}, scope {topology.effective_scope}: "
            f"{unit.describe()} cannot be aligned on {where}; free per zone: {zones}"
        )
