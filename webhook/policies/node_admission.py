"""``nodeAdmission``: a Pod created with ``spec.nodeName`` must pass the kubelet's admission.

The scheduler never sees such a pod, so this is the only check before the kubelet on that
node rejects it and marks it Failed.
"""

from __future__ import annotations

from ..checks import kubelet_admission
from ..checks.placement import candidates
from ..config import NodeAdmissionConfig
from ..state import ClusterState
from ..state.model import MIRROR_ANNOTATION
from . import Finding, Review

NAME = "nodeAdmission"
UNKNOWN_NODE = "UnknownNode"
STATE_UNAVAILABLE = "ClusterStateUnavailable"


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
    if review.shape.kind != "Pod" or review.operation != "CREATE" or not node_name:
        return []
    if MIRROR_ANNOTATION in (review.shape.metadata.get("annotations") or {}):
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
    failures = kubelet_admission(review.pod, node, state.usage(node_name))
    if not failures:
        return []
    elsewhere = candidates(review.pod, state, skip=(node_name,)).sentence()
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
