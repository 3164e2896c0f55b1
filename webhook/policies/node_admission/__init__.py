"""``nodeAdmission``: a Pod created with ``spec.nodeName`` must pass the kubelet's admission.

The scheduler never sees such a pod, so this is the only check before the kubelet on that
node rejects it and marks it Failed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ...checks import kubelet_admission
from ...checks.kubelet import KubeletConfig
from ...checks.node_affinity import node_affinity_mismatch
from ...checks.sysctl import forbidden_sysctl, pod_sysctls
from ...globs import matches_any
from ...kube.reasons import SYSCTL_FORBIDDEN
from ...kube.sysctls import namespace_of, normalize
from ...kube.tolerations import untolerated_taint
from ...scheduler.filters import SCHEDULING_EFFECTS, tolerations_of
from ...scheduler.placement import candidates
from ...state.model import FAILED_PODS, PODS, Node, is_mirror
from ...state.topology import CPU, POLICIES, SCOPES, NodeTopology, is_memory
from .. import (
    BINDS,
    NO_CLUSTER_STATE,
    NO_FIX,
    POD_FIELDS,
    AuditScope,
    Bind,
    Context,
    Finding,
    Mode,
    Review,
    device_scheduler,
    read_mode,
    template_subject,
)
from ..device_scheduler import DeviceSchedulerConfig, owned_by_others
from .overcommitted import OVERCOMMITTED, overcommitted
from .topology_audit import STALE_TOPOLOGY, TOPOLOGY_REJECTED, stale_topology, topology_rejections

if TYPE_CHECKING:
    from ...formats.reader import Reader
    from ...state import ClusterState

NAME = "nodeAdmission"
UNKNOWN_NODE = "UnknownNode"
STATE_UNAVAILABLE = "ClusterStateUnavailable"
# Its own codes; a pod the kubelet would reject is denied with the kubelet's reason
# (``checks.KUBELET_CHECKS``).
REASONS = (UNKNOWN_NODE, STATE_UNAVAILABLE, NO_CLUSTER_STATE, SYSCTL_FORBIDDEN)
MODES = NO_FIX
READS = POD_FIELDS
STATIC = None  # the kubelet's verdict needs the node's state
# Its mode decides whether the bind guard reserves a node's capacity, and its settings hold the
# coordination's (``reservations``): a bind's own denials (UnknownNode, busy) are its.
COORDINATES = BINDS
AUDITS = (OVERCOMMITTED, TOPOLOGY_REJECTED, STALE_TOPOLOGY)
# The pods the topology manager rejected are Failed pods, which the server's state does not keep.
AUDIT_READS = {OVERCOMMITTED: PODS, TOPOLOGY_REJECTED: FAILED_PODS, STALE_TOPOLOGY: PODS}


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


Settings = NodeAdmissionConfig


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


def check(review: Review, context: Context) -> list[Finding]:
    """``context.unavailable`` says why live state cannot be trusted (not synced, stale): the
    check is then skipped with a warning, or denied when the guard fails closed."""
    state, config = context.state, context.config.policy(NAME)
    node_name = review.shape.spec.get("nodeName")
    if not node_name:
        return unschedulable_sysctls(review, state, config)
    if review.shape.kind != "Pod" or review.operation != "CREATE":
        return []
    if is_mirror(review.shape.metadata):
        return []  # the kubelet never admits mirror pods: their static pod already runs
    if context.unavailable is not None:
        return [
            Finding(
                STATE_UNAVAILABLE,
                f"{review.description} sets spec.nodeName={node_name!r}, but the kubelet's "
                f"admission could not be checked: {context.unavailable}.",
                node=node_name,
                advisory=context.config.fail_open,
            )
        ]
    if state is None:
        return [
            Finding(
                NO_CLUSTER_STATE,
                f"{review.description} sets spec.nodeName={node_name!r}, "
                "but no cluster state was given, so the kubelet's admission was not checked.",
                node=node_name,
                advisory=True,
            )
        ]
    node = state.nodes.get(node_name)
    if node is None:
        if config.unknown_node == "allow":
            return []
        return [
            Finding(
                UNKNOWN_NODE,
                f"{review.description} sets spec.nodeName={node_name!r}, a "
                "node that does not exist: no kubelet will ever run it. Fix the node name "
                "(or set nodeAdmission.unknownNode: allow).",
                node=node_name,
            )
        ]
    failures = kubelet_admission(review.pod, node, state.usage(node_name), config.kubelet_for(node))
    if not failures:
        return []
    elsewhere = fits_elsewhere(review, state, node_name, config, context.config.policy(device_scheduler.NAME))
    return [
        Finding(
            failure.reason,
            f"the kubelet on {node_name} would reject {review.description}: {failure.reason}: "
            f"{failure.message.rstrip()} ({failure.hint}). Drop spec.nodeName to let the "
            "scheduler place it, or make room first." + (f" {elsewhere}" if i == 0 else ""),
            node=node_name,
            advisory=bool(failure.doubt),
            doubt=failure.doubt,
        )
        for i, failure in enumerate(failures)
    ]


def check_bind(bind: Bind, context: Context) -> list[Finding]:
    """The kubelet's admission on the bound node, the binds in flight counted: one finding per
    handler that would refuse the pod."""
    config = context.config.policy(NAME)
    failures = kubelet_admission(bind.pod, bind.node, bind.usage, config.kubelet_for(bind.node))
    if bind.created:
        who, then = (
            f"created with spec.nodeName by {bind.who or 'an unknown user'}",
            ("Drop spec.nodeName to let the scheduler place it."),
        )
    else:
        who, then = f"bound by {bind.who or 'an unknown binder'}", "The scheduler will retry it elsewhere."
    return [
        Finding(
            failure.reason,
            f"the kubelet on {bind.node.name} would reject {bind.pod_name}, {who}: {failure.reason}: "
            f"{failure.message.rstrip()} ({failure.hint}). Capacity reserved for binds not yet visible "
            f"counts. {then}",
            node=bind.node.name,
            advisory=bool(failure.doubt),
            doubt=failure.doubt,
        )
        for failure in failures
    ]


def audit(scope: AuditScope, context: Context) -> list[Finding]:
    """Per node: active pods that already request more than is allocatable, and an NRT that
    does not count the pods on the node. For the whole inventory (not a chunk of nodes), the
    Failed pods the topology manager rejected, by owner."""
    state = scope.inventory.state
    topology = context.config.policy(NAME).topology
    findings: list[Finding] = []
    for name in scope.node_names():
        node = state.nodes.get(name)
        if node is None:
            continue
        usage = state.usage(name)
        if usage.pods:
            findings += overcommitted(node, usage)
        findings += stale_topology(node, usage, topology)
    if scope.nodes is None:
        findings += topology_rejections(scope.inventory, context, topology)
    return findings


def check_stateless(review: Review, context: Context) -> list[Finding]:
    """Without cluster state the nodes' sysctl allowlists are unknown: a pod that sets sysctls
    and names no node is not checked (one that names its node warns from ``check``)."""
    sysctls = pod_sysctls(review.shape.spec)
    if review.shape.spec.get("nodeName") or not sysctls:
        return []
    message = (
        f"{template_subject(review)} sets sysctls ({', '.join(sysctls)}), but no cluster state was "
        "given, so the nodes' sysctl allowlists were not checked (give --cluster)."
    )
    return [Finding(NO_CLUSTER_STATE, message, advisory=True)]


def fits_elsewhere(
    review: Review,
    state: ClusterState,
    node_name: str,
    config: NodeAdmissionConfig | None,
    owners: DeviceSchedulerConfig | None = None,
) -> str:
    """Where the pod fits instead of ``node_name``, as a sentence: the scheduler's filters (its
    claims' devices included), the kubelet's admission, and no other scheduler owning its
    devices there."""
    return candidates(
        review.pod,
        state,
        skip=(node_name,),
        config=config,
        tolerations=tolerations_of(review.shape),
        namespace=review.namespace,
        refused=owned_by_others(review.pod.record.requests, review.scheduler, state, owners),
    ).sentence()


def unschedulable_sysctls(
    review: Review, state: ClusterState | None, config: NodeAdmissionConfig
) -> list[Finding]:
    """A template or unbound pod with sysctls, against every node it could be scheduled to.

    The scheduler does not know the kubelets' sysctl allowlists: it would send the pod to a
    node whose kubelet then rejects it (``SysctlForbidden``), again and again. Deny when any
    node the scheduler could choose (the pod's nodeSelector and required node affinity allow it,
    and it has no NoSchedule or NoExecute taint the pod does not tolerate: cordoned and
    control-plane nodes are out) would refuse its sysctls.
    """
    if state is None or review.operation not in ("CREATE", "UPDATE") or not pod_sysctls(review.shape.spec):
        return []
    if review.old_shape is not None and pod_sysctls(review.old_shape.spec) == pod_sysctls(review.shape.spec):
        return []  # unchanged sysctls: the object stays updatable
    tolerations = tolerations_of(review.shape)
    refused = [
        (node.name, failure)
        for node in state.nodes.values()
        if node_affinity_mismatch(review.pod, node) is None
        and untolerated_taint(node.taints, tolerations, SCHEDULING_EFFECTS) is None
        for failure in (forbidden_sysctl(review.pod, node, None, config.kubelet_for(node)),)
        if failure is not None
    ]
    if not refused:
        return []
    names = ", ".join(name for name, _ in refused[:5]) + (
        f" and {len(refused) - 5} more" if len(refused) > 5 else ""
    )
    first_node, first = refused[0]
    return [
        Finding(
            SYSCTL_FORBIDDEN,
            f"the kubelets of {len(refused)} node(s) {review.description} could be scheduled to would "
            f"reject it: {first.message} (on {first_node}; refusing nodes: {names}). The scheduler does "
            "not know sysctl allowlists and would send it there. Allow the sysctl on those kubelets "
            "(--allowed-unsafe-sysctls, and nodeAdmission.allowedUnsafeSysctls), keep the pod off them "
            "with a nodeSelector or node affinity, or drop the sysctl.",
            node=first_node,
        )
    ]
