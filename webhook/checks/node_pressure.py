"""Eviction-manager admission (``eviction_manager.go`` ``managerImpl.Admit``). kubelet-admission-spec §10."""

from __future__ import annotations

from ..kube.reasons import EVICTED
from ..kube.resources import qos_class
from ..kube.tolerations import Taint, untolerated_taint
from .failure import Failure

_MEMORY_PRESSURE_TAINT = Taint("node.kubernetes.io/memory-pressure", "", "NoSchedule")


def node_pressure(pod, node, usage=None, kubelet=None) -> Failure | None:
    """Reject non-critical pods on a node under pressure, as the eviction manager does.

    Under MemoryPressure alone only BestEffort pods without a memory-pressure toleration are
    refused; any other pressure refuses every non-critical pod.
    """
    if not node.pressure or pod.record.critical:
        return None
    if node.pressure == ("MemoryPressure",):
        if qos_class(pod.spec) != "BestEffort":
            return None
        if (
            untolerated_taint(
                (_MEMORY_PRESSURE_TAINT,), pod.spec.get("tolerations"), frozenset({"NoSchedule"})
            )
            is None
        ):
            return None
    conditions = " ".join(node.pressure)
    return Failure(
        EVICTED,
        f"The node had condition: [{conditions}]. ",
        f"node {node.name} reports {', '.join(node.pressure)}; the kubelet refuses new pods "
        "until the condition clears",
    )
