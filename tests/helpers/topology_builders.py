"""Builders for NodeResourceTopology objects, so each topology test shows only its zones."""

from __future__ import annotations

from typing import Any

from tests.helpers.builders import container, pod

Amounts = tuple[Any, Any, Any] | Any  # (capacity, allocatable, available), or one value for all three


def nrt(
    name: str = "node-1",
    zones: list[dict[str, Amounts]] | None = None,
    *,
    policy: str | None = "single-numa-node",
    scope: str | None = None,
    legacy: list[str] | None = None,
    attributes: dict[str, str] | None = None,
    ids: list[int] | None = None,
) -> dict[str, Any]:
    """A v1alpha2 NodeResourceTopology; zone ``i`` is ``node-<ids[i]>`` (``node-<i>`` by default)."""
    attrs = dict(attributes or {})
    if policy is not None:
        attrs["topologyManagerPolicy"] = policy
    if scope is not None:
        attrs["topologyManagerScope"] = scope
    obj: dict[str, Any] = {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": name},
        "attributes": [{"name": k, "value": v} for k, v in attrs.items()],
        "zones": [
            {
                "name": f"node-{ids[i] if ids else i}",
                "type": "Node",
                "resources": [
                    {"name": r, **dict(zip(("capacity", "allocatable", "available"), _three(a), strict=True))}
                    for r, a in zone.items()
                ],
            }
            for i, zone in enumerate(zones or [])
        ],
    }
    if legacy is not None:
        obj["topologyPolicies"] = legacy
    return obj


def _three(amounts: Amounts) -> tuple[Any, Any, Any]:
    return tuple(amounts) if isinstance(amounts, tuple) else (amounts, amounts, amounts)


def guaranteed(cpu="6", memory="1Gi", name="app", **extra) -> dict:
    """A Guaranteed container: requests equal limits."""
    amounts = {"cpu": cpu, "memory": memory, **extra}
    return container(name, requests=dict(amounts), limits=dict(amounts))


def guaranteed_pod(name: str, cpu: str = "10", node_name: str | None = None) -> dict:
    """A pod in namespace ml of one Guaranteed container asking ``cpu`` CPUs and 1Gi."""
    return pod(name, namespace="ml", node_name=node_name, containers=[guaranteed(cpu=cpu)])
