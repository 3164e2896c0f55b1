"""kube-scheduler's ``DynamicResources`` filter, as far as the cluster state shows it.

A pod with ResourceClaims goes only where its claims can be satisfied
(``pkg/scheduler/framework/plugins/dynamicresources``, Kubernetes v1.35): an allocated claim
only on the nodes its ``allocation.nodeSelector`` selects ("resourceclaim not available on the
node"; the scheduler never moves an allocated claim), an unallocated one (or one a
ResourceClaimTemplate will create) only where free devices are left to allocate ("cannot
allocate all claims"). Device classes' CEL selectors are not evaluated: one free device the
node can use per unallocated claim is taken as enough, so a node this filter rejects, the
scheduler rejects too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..state.model import ClusterState, Node

NOT_AVAILABLE = "resourceclaim not available on the node"
CANNOT_ALLOCATE = "cannot allocate all claims"


def claim_names(spec: Mapping[str, Any]) -> list[str | None]:
    """The ResourceClaim each entry of ``spec.resourceClaims`` names; None for one a template
    creates (or that names nothing readable: the engine reports the field)."""
    entries = spec.get("resourceClaims")
    if not isinstance(entries, list):
        return []
    names: list[str | None] = []
    for entry in entries:
        name = entry.get("resourceClaimName") if isinstance(entry, Mapping) else None
        names.append(name if isinstance(name, str) and name else None)
    return names


def dynamic_resources(spec: Mapping[str, Any], namespace: str, node: Node, state: ClusterState) -> str | None:
    """Why the scheduler would not place the pod on ``node`` for its claims, or None. Without
    DRA state (no ResourceSlices or claims were read) nothing can be said: None."""
    names = claim_names(spec)
    if not names or state.devices is None:
        return None
    needed = 0
    for name in names:
        known = state.devices.named(namespace, name) if name else None
        allocation = known[1] if known is not None else None
        if allocation is None:
            needed += 1  # to be allocated: on this node, from its free devices
        elif allocation.node_selector is not None and not allocation.node_selector.matches(
            node.labels, node.name
        ):
            return NOT_AVAILABLE
    if needed and state.devices.free_devices_on(node.name, node.labels, needed) < needed:
        return CANNOT_ALLOCATE
    return None
