"""``nodename.Fits``: the pod's nodeName, if set, must be this node. kubelet-admission-spec §6."""

from __future__ import annotations

from ..kube.reasons import NODE_NAME
from .failure import Failure, predicate_failure


def node_name_mismatch(pod, node, usage=None, kubelet=None) -> Failure | None:
    wanted = pod.spec.get("nodeName")
    if not wanted or wanted == node.name:
        return None
    return predicate_failure(
        NODE_NAME,
        "node(s) didn't match the requested node name",
        f"spec.nodeName is {wanted}, not {node.name}",
    )
