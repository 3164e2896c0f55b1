"""``rejectPodAdmissionBasedOnSupplementalGroupsPolicy`` (GA in v1.35). kubelet-admission-spec §3.4."""

from __future__ import annotations

from ..kube.reasons import SUPPLEMENTAL_GROUPS_POLICY_NOT_SUPPORTED
from .failure import Failure


def supplemental_groups_unsupported(pod, node, usage=None, kubelet=None) -> Failure | None:
    """``supplementalGroupsPolicy: Strict`` needs ``status.features.supplementalGroupsPolicy``."""
    security_context = pod.spec.get("securityContext") or {}
    if security_context.get("supplementalGroupsPolicy") != "Strict" or node.supplemental_groups_policy:
        return None
    return Failure(
        SUPPLEMENTAL_GROUPS_POLICY_NOT_SUPPORTED,
        "SupplementalGroupsPolicy=Strict is not supported in this node",
        f"node {node.name} does not report status.features.supplementalGroupsPolicy=true",
    )
