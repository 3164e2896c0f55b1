"""Required node affinity and nodeSelector (``nodeaffinity`` plugin). kubelet-admission-spec §5."""

from __future__ import annotations

from ..kube.reasons import NODE_AFFINITY
from ..kube.selectors import matches_node_selector_and_affinity
from .failure import Failure, predicate_failure


def node_affinity_mismatch(pod, node, usage=None, kubelet=None) -> Failure | None:
    if matches_node_selector_and_affinity(pod.spec, node.labels, node.name):
        return None
    return predicate_failure(
        NODE_AFFINITY,
        "node(s) didn't match Pod's node affinity/selector",
        f"node {node.name}'s labels do not satisfy spec.nodeSelector / required node affinity",
    )
