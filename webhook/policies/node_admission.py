"""``nodeAdmission``: a Pod created with ``spec.nodeName`` must pass the kubelet's admission.

The scheduler never sees such a pod, so this is the only check before the kubelet on that
node rejects it and marks it Failed.
"""

from __future__ import annotations

from ..checks import kubelet_admission
from ..checks.node_affinity import node_affinity_mismatch
from ..checks.placement import candidates
from ..checks.sysctl import REASON as SYSCTL_FORBIDDEN
from ..checks.sysctl import forbidden_sysctl, pod_sysctls
from ..config import NodeAdmissionConfig
from ..kube.tolerations import untolerated_taint
from ..state import ClusterState
from ..state.model import is_mirror
from . import Finding, Review

NAME = "nodeAdmission"
UNKNOWN_NODE = "UnknownNode"
STATE_UNAVAILABLE = "ClusterStateUnavailable"

# The scheduler's TaintToleration filter (cordoned nodes carry node.kubernetes.io/unschedulable).
_SCHEDULER_TAINT_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
# What the DaemonSet controller adds to every pod it creates (``util.AddOrUpdateDaemonPodTolerations``):
# its pods land on not-ready, unreachable, pressured and cordoned nodes all the same.
DAEMON_TOLERATIONS = tuple(
    {"key": f"node.kubernetes.io/{key}", "operator": "Exists", "effect": effect}
    for key, effect in (
        ("not-ready", "NoExecute"),
        ("unreachable", "NoExecute"),
        ("disk-pressure", "NoSchedule"),
        ("memory-pressure", "NoSchedule"),
        ("pid-pressure", "NoSchedule"),
        ("unschedulable", "NoSchedule"),
        ("network-unavailable", "NoSchedule"),
    )
)


def check(
    review: Review,
    state: ClusterState | None,
    config: NodeAdmissionConfig,
    unavailable: str | None = None,
    fail_open: bool = True,
) -> list[Finding]:
    """``unavailable`` says why live state cannot be trusted (not synced, stale): the check
    is then skipped with a warning, or denied when the guard fails closed."""
    node_name = review.shape.spec.get("nodeName")
    if not node_name:
        return unschedulable_sysctls(review, state, config)
    if review.shape.kind != "Pod" or review.operation != "CREATE":
        return []
    if is_mirror(review.shape.metadata):
        return []  # the kubelet never admits mirror pods: their static pod already runs
    if unavailable is not None:
        return [
            Finding(
                STATE_UNAVAILABLE,
                f"{review.description} sets spec.nodeName={node_name!r}, but the kubelet's "
                f"admission could not be checked: {unavailable}.",
                node=node_name,
                advisory=fail_open,
            )
        ]
    if state is None:
        return [
            Finding(
                "NoClusterState",
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
    failures = kubelet_admission(
        review.pod, node, state.usage(node_name), config.unsafe_sysctls_for(node.labels)
    )
    if not failures:
        return []
    elsewhere = candidates(review.pod, state, skip=(node_name,), config=config).sentence()
    return [
        Finding(
            failure.reason,
            f"the kubelet on {node_name} would reject {review.description}: {failure.reason}: "
            f"{failure.message.rstrip()} ({failure.hint}). Drop spec.nodeName to let the "
            "scheduler place it, or make room first." + (f" {elsewhere}" if i == 0 else ""),
            node=node_name,
        )
        for i, failure in enumerate(failures)
    ]


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
    tolerations = review.shape.spec.get("tolerations")
    if review.shape.kind == "DaemonSet":
        tolerations = [*(tolerations if isinstance(tolerations, list) else []), *DAEMON_TOLERATIONS]
    refused = [
        (node.name, failure)
        for node in state.nodes.values()
        if node_affinity_mismatch(review.pod, node) is None
        and untolerated_taint(node.taints, tolerations, _SCHEDULER_TAINT_EFFECTS) is None
        for failure in (forbidden_sysctl(review.pod, node, config.unsafe_sysctls_for(node.labels)),)
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
