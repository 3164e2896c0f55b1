"""``nodeAdmission`` in the audit: nodes whose active pods already request more than the node
has allocatable, so the kubelet rejects every new pod that asks for that resource."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ...kube.quantity import format_amount
from ...kube.resources import is_extended_resource
from .. import Finding, Subject

if TYPE_CHECKING:
    from ...state.model import Node, NodeUsage

OVERCOMMITTED = "Overcommitted"


def overcommitted(node: Node, usage: NodeUsage) -> list[Finding]:
    """One finding per resource ``node``'s active pods request more of than is allocatable."""
    requested: Mapping[str, int] = {**usage.requested, "pods": usage.pod_count}
    findings = []
    for resource, amount in sorted(requested.items()):
        if is_extended_resource(resource) and resource not in node.allocatable:
            continue  # the kubelet ignores extended resources a node does not report
        allocatable = node.allocatable.get(resource, 0)
        if amount <= allocatable:
            continue
        holders = (
            usage.pod_count
            if resource == "pods"
            else sum(1 for r in usage.pods.values() if r.requests.get(resource, 0) > 0)
        )
        fmt = lambda n, r=resource: format_amount(r, n)  # noqa: E731
        device = resource == "pods" or is_extended_resource(resource)
        findings.append(
            Finding(
                OVERCOMMITTED,
                f"node {node.name}: active pods request {fmt(amount)} {resource}, but only "
                f"{fmt(allocatable)} is allocatable; the kubelet rejects every new pod that asks for "
                f"{resource} (OutOf{resource}) until some leave. Allocatable shrank under running pods "
                f"(a device lost, reservations raised) or pods bypassed the scheduler.",
                node=node.name,
                severity="high" if device else "medium",
                subject=Subject("", "Node", node.name, "v1"),
                resource=resource,
                count=holders,
            )
        )
    return findings
