"""The kubelet's taint check: only ``NoExecute`` taints (``predicate.go`` ``generalFilter``).
kubelet-admission-spec §8."""

from __future__ import annotations

from ..kube.reasons import TAINT_TOLERATION
from ..kube.tolerations import untolerated_taint
from .failure import Failure, predicate_failure

_NO_EXECUTE = frozenset({"NoExecute"})


def untolerated_no_execute_taint(pod, node, usage=None, kubelet=None) -> Failure | None:
    taint = untolerated_taint(node.taints, pod.spec.get("tolerations"), _NO_EXECUTE)
    if taint is None:
        return None
    return predicate_failure(
        TAINT_TOLERATION,
        "node(s) had taints that the pod didn't tolerate",
        f"node {node.name} has taint {taint} and the pod has no matching toleration",
    )
