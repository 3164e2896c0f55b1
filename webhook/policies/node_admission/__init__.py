"""``nodeAdmission``: a Pod created with ``spec.nodeName`` must pass the kubelet's admission.

The scheduler never sees such a pod, so this is the only check before the kubelet on that
node rejects it and marks it Failed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...checks import kubelet_admission
from ...checks.node_affinity import node_affinity_mismatch
from ...checks.sysctl import forbidden_sysctl, pod_sysctls
from ...kube.reasons import SYSCTL_FORBIDDEN
from ...kube.tolerations import untolerated_taint
from ...scheduler.filters import SCHEDULING_EFFECTS, tolerations_of
from ...scheduler.placement import candidates
from ...state.model import FAILED_PODS, PODS, is_mirror
from .. import (
    BINDS,
    NO_CLUSTER_STATE,
    POD_FIELDS,
    AuditScope,
    Bind,
    Context,
    Finding,
    Review,
    device_scheduler,
    template_subject,
)
from ..device_scheduler import DeviceSchedulerConfig, owned_by_others
from .overcommitted import OVERCOMMITTED, overcommitted
from .settings import (
    MODES,
    NodeAdmissionConfig,
    ReservationsConfig,
    TopologyConfig,
    TopologyPool,
    UnsafeSysctls,
    read_settings,
)
from .topology_audit import STALE_TOPOLOGY, TOPOLOGY_REJECTED, stale_topology, topology_rejections

if TYPE_CHECKING:
    from ...state import ClusterState

__all__ = [
    "MODES",
    "NodeAdmissionConfig",
    "ReservationsConfig",
    "TopologyConfig",
    "TopologyPool",
    "UnsafeSysctls",
    "read_settings",
]
NAME = "nodeAdmission"
UNKNOWN_NODE = "UnknownNode"
STATE_UNAVAILABLE = "ClusterStateUnavailable"
# Its own codes; a pod the kubelet would reject is denied with the kubelet's reason
# (``checks.KUBELET_CHECKS``).
REASONS = (UNKNOWN_NODE, STATE_UNAVAILABLE, NO_CLUSTER_STATE, SYSCTL_FORBIDDEN)
READS = POD_FIELDS
STATIC = None  # the kubelet's verdict needs the node's state
# Its mode decides whether the bind guard reserves a node's capacity, and its settings hold the
# coordination's (``reservations``): a bind's own denials (UnknownNode, busy) are its.
COORDINATES = BINDS
AUDITS = (OVERCOMMITTED, TOPOLOGY_REJECTED, STALE_TOPOLOGY)
# The pods the topology manager rejected are Failed pods, which the server's state does not keep.
AUDIT_READS = {OVERCOMMITTED: PODS, TOPOLOGY_REJECTED: FAILED_PODS, STALE_TOPOLOGY: PODS}


Settings = NodeAdmissionConfig


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
