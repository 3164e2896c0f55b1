"""``nodeAdmission``'s settings: unknown nodes, unsafe sysctls, the coordination's reservations
and the topology manager check (per pool), read strictly, each error naming its field."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ...checks.kubelet import KubeletConfig
from ...globs import matches_any
from ...kube.sysctls import namespace_of, normalize
from ...state.model import Node
from ...state.topology import CPU, POLICIES, SCOPES, NodeTopology, is_memory
from .. import NO_FIX, Mode, read_mode

if TYPE_CHECKING:
    from ...formats.reader import Reader

MODES = NO_FIX


@dataclass(frozen=True, slots=True)
class UnsafeSysctls:
    """A kubelet's ``--allowed-unsafe-sysctls`` for the nodes whose labels match ``node_selector``."""

    node_selector: tuple[tuple[str, str], ...]
    sysctls: tuple[str, ...]  # names, or prefixes ending in ``*``

    def applies_to(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.node_selector)


@dataclass(frozen=True, slots=True)
class ReservationsConfig:
    """How allowed binds hold capacity until the watch shows the pod bound."""

    namespace: str = ""  # coordination Leases live here; "" means the guard's own namespace
    ttl_seconds: float = 30.0
    deadline_seconds: float = 1.0  # one API call; slower is an outage (fail open)
    wait_seconds: float = 2.0  # for sibling decisions on the same node; past it, denied Busy
    # One decision, waits and round trips together, ends within this (below the webhooks'
    # timeoutSeconds); past it, denied Busy: a late answer would be the failurePolicy's.
    budget_seconds: float = 4.0
    # Without an authenticated caller (serve --client-ca), a reservation whose pod the state does
    # not show on its node within this many seconds is released: forged reviews hold nothing long.
    confirm_seconds: float = 5.0
    coordinate: tuple[str, ...] | None = None  # None: deviceScheduler.resources

    def coordinated(self, resource: str, device_patterns: tuple[str, ...]) -> bool:
        return matches_any(resource, self.coordinate if self.coordinate is not None else device_patterns)


MANAGER_POLICIES = ("static", "none")  # cpuManagerPolicy; memoryManagerPolicy's Static/None, lowercased


@dataclass(frozen=True, slots=True)
class TopologyPool:
    """What the operator declares of the kubelets of the nodes ``node_selector`` matches, for
    exporters that do not publish it (topology-admission-spec §6.3, §10.1): the topology
    manager's policy and scope (used where the NRT names none), and whether the CPU and memory
    managers are static (``none`` drops the resource from the aligned ones, whatever the zones
    list). None: not declared."""

    node_selector: tuple[tuple[str, str], ...]
    policy: str | None = None
    scope: str | None = None
    cpu_manager: str | None = None
    memory_manager: str | None = None
    smt_threads: int = 0  # threads per core, where the CPU manager runs with full-pcpus-only

    def applies_to(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(key) == value for key, value in self.node_selector)

    def apply(self, topology: NodeTopology) -> NodeTopology:
        """The NRT as this pool's kubelets run: what the NRT publishes wins, the pool fills gaps."""
        resources = {
            r: amounts
            for r, amounts in topology.resources.items()
            if not (r == CPU and self.cpu_manager == "none")
            and not (is_memory(r) and self.memory_manager == "none")
        }
        return replace(
            topology,
            policy=topology.policy or self.policy,
            scope=topology.scope or self.scope,
            resources=resources,
        )


@dataclass(frozen=True, slots=True)
class TopologyConfig:
    """``nodeAdmission.topology``: the topology manager check, on wherever a node has an NRT."""

    enabled: bool = True
    pools: tuple[TopologyPool, ...] = ()

    def pool(self, node: Node) -> TopologyPool | None:
        """The first pool whose ``nodeSelector`` matches the node."""
        return next((p for p in self.pools if p.applies_to(node.labels)), None)

    def for_node(self, node: Node) -> NodeTopology | None:
        """The node's topology manager as the check sees it; None where it does not run."""
        if not self.enabled or node.topology is None:
            return None
        pool = self.pool(node)
        return pool.apply(node.topology) if pool is not None else node.topology

    def smt_threads(self, node: Node) -> int:
        """Threads per core where the node's pool declares ``full-pcpus-only`` (0: not declared)."""
        pool = self.pool(node) if self.enabled else None
        return pool.smt_threads if pool is not None else 0


@dataclass(frozen=True, slots=True)
class NodeAdmissionConfig:
    mode: Mode = Mode.ENFORCE
    unknown_node: str = "deny"
    allowed_unsafe_sysctls: tuple[UnsafeSysctls, ...] = ()
    reservations: ReservationsConfig = field(default_factory=ReservationsConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)

    def kubelet_for(self, node: Node) -> KubeletConfig:
        """What this config says of ``node``'s kubelet, for ``kubelet_admission``."""
        return KubeletConfig(
            self.unsafe_sysctls_for(node.labels),
            self.topology.for_node(node),
            self.topology.smt_threads(node),
        )

    def unsafe_sysctls_for(self, labels: Mapping[str, str]) -> tuple[str, ...]:
        """The unsafe sysctls the kubelet of a node with these labels allows."""
        if not self.allowed_unsafe_sysctls:
            return ()
        return tuple(
            name
            for entry in self.allowed_unsafe_sysctls
            if entry.applies_to(labels)
            for name in entry.sysctls
        )


def read_settings(reader: Reader, data: Any, where: str) -> NodeAdmissionConfig:
    data = reader.mapping(
        data, where, {"mode", "unknownNode", "allowedUnsafeSysctls", "reservations", "topology"}
    )
    unknown = data.get("unknownNode", "deny")
    if unknown not in ("deny", "allow"):
        reader.fail(f"{where}.unknownNode", f"{unknown!r} is not one of deny, allow")
    mode = read_mode(reader, data, where, MODES)
    entries = reader.sequence(data.get("allowedUnsafeSysctls") or [], f"{where}.allowedUnsafeSysctls")
    return NodeAdmissionConfig(
        mode=mode,
        unknown_node=unknown,
        reservations=_reservations(reader, data.get("reservations") or {}, f"{where}.reservations"),
        topology=_topology(reader, data.get("topology"), f"{where}.topology"),
        allowed_unsafe_sysctls=tuple(
            _unsafe_sysctls(reader, entry, f"{where}.allowedUnsafeSysctls[{i}]")
            for i, entry in enumerate(entries)
        ),
    )


def _reservations(reader: Reader, data: Any, where: str) -> ReservationsConfig:
    keys = {"namespace", "ttlSeconds", "deadlineSeconds", "waitSeconds", "budgetSeconds", "confirmSeconds"}
    keys.add("coordinate")
    data = reader.mapping(data, where, keys)
    defaults = ReservationsConfig()
    namespace = data.get("namespace", "")
    if not isinstance(namespace, str):
        reader.fail(f"{where}.namespace", "must be a namespace name")
        namespace = ""
    coordinate = data.get("coordinate")
    return ReservationsConfig(
        namespace=namespace,
        ttl_seconds=reader.number(data.get("ttlSeconds", defaults.ttl_seconds), f"{where}.ttlSeconds", 1),
        deadline_seconds=reader.number(
            data.get("deadlineSeconds", defaults.deadline_seconds), f"{where}.deadlineSeconds", 0.05
        ),
        wait_seconds=reader.number(data.get("waitSeconds", defaults.wait_seconds), f"{where}.waitSeconds", 0),
        budget_seconds=reader.number(
            data.get("budgetSeconds", defaults.budget_seconds), f"{where}.budgetSeconds", 0.1
        ),
        confirm_seconds=reader.number(
            data.get("confirmSeconds", defaults.confirm_seconds), f"{where}.confirmSeconds", 0.5
        ),
        coordinate=None if coordinate is None else reader.strings(coordinate, f"{where}.coordinate"),
    )


def _topology(reader: Reader, data: Any, where: str) -> TopologyConfig:
    """``topology: off`` (YAML reads a bare off as false), ``on``, or ``{mode, pools}``."""
    if data is None:
        return TopologyConfig()
    if not isinstance(data, Mapping):
        return TopologyConfig(enabled=_on_off(reader, data, where))
    data = reader.mapping(data, where, {"mode", "pools"})
    pools = reader.sequence(data.get("pools") or [], f"{where}.pools")
    return TopologyConfig(
        enabled=_on_off(reader, data.get("mode", "on"), f"{where}.mode"),
        pools=tuple(_topology_pool(reader, p, f"{where}.pools[{i}]") for i, p in enumerate(pools)),
    )


def _on_off(reader: Reader, value: Any, where: str) -> bool:
    if value in (False, "off"):
        return False
    if value in (True, "on"):
        return True
    reader.fail(where, f"{value!r} is not one of on, off")
    return True


def _topology_pool(reader: Reader, data: Any, where: str) -> TopologyPool:
    keys = {"nodeSelector", "topologyManagerPolicy", "topologyManagerScope", "cpuManagerPolicy"}
    data = reader.mapping(data, where, keys | {"memoryManagerPolicy", "fullPCPUsOnly", "threadsPerCore"})
    selector = reader.mapping(data.get("nodeSelector") or {}, f"{where}.nodeSelector")
    if not all(isinstance(v, str) for v in selector.values()):
        reader.fail(f"{where}.nodeSelector", "label values must be strings")

    def choice(key: str, allowed: tuple[str, ...], fold: bool = False) -> str | None:
        value = data.get(key)
        if value is None:
            return None
        folded = value.lower() if fold and isinstance(value, str) else value
        if folded not in allowed:
            reader.fail(f"{where}.{key}", f"{value!r} is not one of {', '.join(allowed)}")
            return None
        return folded

    return TopologyPool(
        smt_threads=_smt_threads(reader, data, where),
        node_selector=tuple((str(k), str(v)) for k, v in selector.items()),
        policy=choice("topologyManagerPolicy", POLICIES),
        scope=choice("topologyManagerScope", SCOPES),
        cpu_manager=choice("cpuManagerPolicy", MANAGER_POLICIES, fold=True),
        memory_manager=choice("memoryManagerPolicy", MANAGER_POLICIES, fold=True),
    )


def _smt_threads(reader: Reader, data: Mapping[str, Any], where: str) -> int:
    """``fullPCPUsOnly: true`` (the CPU manager option ``full-pcpus-only``) with ``threadsPerCore``."""
    full = data.get("fullPCPUsOnly", False)
    threads = data.get("threadsPerCore")
    if not isinstance(full, bool):
        reader.fail(f"{where}.fullPCPUsOnly", "must be true or false")
        return 0
    if threads is not None and (not isinstance(threads, int) or isinstance(threads, bool) or threads < 1):
        reader.fail(f"{where}.threadsPerCore", "must be a whole number of threads, at least 1")
        return 0
    if full and threads is None:
        reader.fail(f"{where}.threadsPerCore", "is required with fullPCPUsOnly (the node's threads per core)")
    return threads if full and threads else 0


def _unsafe_sysctls(reader: Reader, data: Any, where: str) -> UnsafeSysctls:
    data = reader.mapping(data, where, {"nodeSelector", "sysctls"})
    selector = reader.mapping(data.get("nodeSelector") or {}, f"{where}.nodeSelector")
    if not all(isinstance(v, str) for v in selector.values()):
        reader.fail(f"{where}.nodeSelector", "label values must be strings")
    sysctls = reader.strings(data.get("sysctls") or [], f"{where}.sysctls")
    for name in sysctls:
        # The kubelet refuses to start with a sysctl that no pod namespace isolates.
        if namespace_of(normalize(name).removesuffix("*")) is None:
            reader.fail(f"{where}.sysctls", f"{name!r} is not a namespaced sysctl (kubelets refuse it)")
    return UnsafeSysctls(tuple((str(k), str(v)) for k, v in selector.items()), sysctls)
