"""The kubelet's admission of one pod on one node, in the kubelet's order
(kubelet-admission-spec §14; the topology manager: topology-admission-spec §1.1)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..kube.reasons import (
    EVICTED,
    NODE_AFFINITY,
    NODE_NAME,
    NODE_PORTS,
    POD_OS_NOT_SUPPORTED,
    POD_OS_SELECTOR_NODE_LABEL_DOES_NOT_MATCH,
    SMT_ALIGNMENT_ERROR,
    SUPPLEMENTAL_GROUPS_POLICY_NOT_SUPPORTED,
    SYSCTL_FORBIDDEN,
    TAINT_TOLERATION,
    TOPOLOGY_AFFINITY_ERROR,
    UNEXPECTED_ADMISSION_ERROR,
    out_of,
)
from ..state.model import Node, NodeUsage, PodUnderReview
from ..state.topology import NodeTopology
from .failure import Failure
from .node_affinity import node_affinity_mismatch
from .node_name import node_name_mismatch
from .node_ports import host_port_conflict
from .node_pressure import node_pressure
from .operating_system import os_field_mismatch, os_label_mismatch
from .preemption import critical_pod_failures
from .resource_fit import insufficient_resources
from .supplemental_groups import supplemental_groups_unsupported
from .sysctl import forbidden_sysctl
from .taint_toleration import untolerated_no_execute_taint
from .topology import topology_affinity


@dataclass(frozen=True, slots=True)
class KubeletConfig:
    """What a node's kubelet runs with that its Node object does not say, as the guard's config
    and the node's NodeResourceTopology tell it: ``--allowed-unsafe-sysctls``, the topology
    manager (zones and policy; None where the check does not run for the node), and the threads
    per core where the CPU manager runs with ``full-pcpus-only`` (0: not declared)."""

    unsafe_sysctls: tuple[str, ...] = ()
    topology: NodeTopology | None = None
    smt_threads: int = 0

    @classmethod
    def published(cls, node: Node) -> KubeletConfig:
        """No config: no unsafe sysctls, the topology manager as the node's NRT says, no SMT rule."""
        return cls((), node.topology)


@dataclass(frozen=True, slots=True)
class Check:
    """One of the kubelet's admission checks: what it is called, the reasons it rejects with
    (``kube.reasons``), and the check itself. Every check takes the same arguments (most
    read only the first two): the pod, the node, the node's usage without this pod, and the
    node kubelet's ``KubeletConfig``."""

    name: str
    reasons: tuple[str, ...]
    run: Callable[[PodUnderReview, Node, NodeUsage, KubeletConfig], Failure | list[Failure] | None]
    # Part of the predicate handler's ``generalFilter``: only its failures go through the
    # critical-pod handler (kubelet-side preemption).
    general_filter: bool = False
    # The kubelet stops at the first handler that refuses (``canAdmitPod``). The guard reports the
    # other handlers' reasons together, but a check that allocates as it admits (the topology
    # manager) runs only when every earlier one admitted, and its refusal is the only one
    # reported: the kubelet reports exactly that (topology-admission-spec §1.1).
    alone: bool = False


# The kubelet's handlers in its order (kubelet-admission-spec §1, §14): eviction manager,
# sysctls, the topology manager, then the predicate handler: OS label, OS field, supplemental
# groups, and the general filter. The first failure is what the kubelet reports.
KUBELET_CHECKS = (
    Check("eviction manager", (EVICTED,), node_pressure),
    Check("sysctl allowlist", (SYSCTL_FORBIDDEN,), forbidden_sysctl),
    Check("topology manager", (TOPOLOGY_AFFINITY_ERROR, SMT_ALIGNMENT_ERROR), topology_affinity, alone=True),
    Check("OS label", (POD_OS_SELECTOR_NODE_LABEL_DOES_NOT_MATCH,), os_label_mismatch),
    Check("OS field", (POD_OS_NOT_SUPPORTED,), os_field_mismatch),
    Check(
        "supplemental groups policy",
        (SUPPLEMENTAL_GROUPS_POLICY_NOT_SUPPORTED,),
        supplemental_groups_unsupported,
    ),
    Check("resource fit", (out_of("*"),), insufficient_resources, general_filter=True),
    Check(NODE_AFFINITY, (NODE_AFFINITY,), node_affinity_mismatch, general_filter=True),
    Check(NODE_NAME, (NODE_NAME,), node_name_mismatch, general_filter=True),
    Check(NODE_PORTS, (NODE_PORTS,), host_port_conflict, general_filter=True),
    Check(TAINT_TOLERATION, (TAINT_TOLERATION,), untolerated_no_execute_taint, general_filter=True),
)
# What the critical-pod handler answers when evicting lower-priority pods would not make room.
CRITICAL_POD_REASONS = (UNEXPECTED_ADMISSION_ERROR,)


def kubelet_admission(
    pod: PodUnderReview, node: Node, usage: NodeUsage, kubelet: KubeletConfig | None = None
) -> list[Failure]:
    """Every reason the kubelet on ``node`` would reject ``pod``; the first is what it reports.

    ``kubelet``: what the config says of the node's kubelet (``KubeletConfig.published`` when
    None). The checks run in ``KUBELET_CHECKS`` order, with the critical-pod rule applied to the
    general filter's failures only, as ``predicateAdmitHandler.Admit`` does; a check that
    refuses ``alone`` ends the admission.
    """
    kubelet = kubelet if kubelet is not None else KubeletConfig.published(node)
    usage = usage.without(pod.record.key)
    failures: list[Failure] = []
    general: list[Failure] = []
    for check in KUBELET_CHECKS:
        if check.alone and failures:
            continue
        found = check.run(pod, node, usage, kubelet)
        if found and check.alone:
            found = found if isinstance(found, list) else [found]
            if not all(f.doubt for f in found):
                return found
            failures.extend(found)  # only doubted: said, and the later handlers still judge
            continue
        if found:
            found_in = general if check.general_filter else failures
            if isinstance(found, list):
                found_in.extend(found)
            else:
                found_in.append(found)
    return failures + critical_pod_failures(pod.record, general, usage.pods.values())
