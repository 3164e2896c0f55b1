"""The kubelet's OS checks (``predicate.go`` ``rejectPodAdmissionBasedOnOS*``).
kubelet-admission-spec §3.2-3.3."""

from __future__ import annotations

from ..kube.reasons import POD_OS_NOT_SUPPORTED, POD_OS_SELECTOR_NODE_LABEL_DOES_NOT_MATCH
from .failure import Failure

OS_LABEL = "kubernetes.io/os"


def os_label_mismatch(pod, node, usage=None, kubelet=None) -> Failure | None:
    """The pod's ``kubernetes.io/os`` *label* must name the node's real OS."""
    wanted = (pod.metadata.get("labels") or {}).get(OS_LABEL)
    if wanted is None or wanted == node.operating_system:
        return None
    return Failure(
        POD_OS_SELECTOR_NODE_LABEL_DOES_NOT_MATCH,
        "Failed to admit pod as the `kubernetes.io/os` label doesn't match node label",
        f"pod label {OS_LABEL}={wanted}, node {node.name} runs {node.operating_system}",
    )


def os_field_mismatch(pod, node, usage=None, kubelet=None) -> Failure | None:
    """``spec.os.name`` must name the node's real OS."""
    os_field = pod.spec.get("os")
    if not isinstance(os_field, dict) or os_field.get("name") in (None, node.operating_system):
        return None
    return Failure(
        POD_OS_NOT_SUPPORTED,
        "Failed to admit pod as the OS field doesn't match node OS",
        f"spec.os.name={os_field.get('name')}, node {node.name} runs {node.operating_system}",
    )
