"""Builders for resource.k8s.io/v1 objects, so each DRA test shows only what it is about."""

from __future__ import annotations

from typing import Any

DRIVER = "gpu.example.com"


def device(
    name: str,
    *,
    capacity: dict[str, Any] | None = None,
    multi: bool = False,
    consumes: dict[str, dict[str, str]] | None = None,
    taints: list[dict[str, str]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """``capacity``: ``{name: "40Gi"}`` or ``{name: {"value": ..., "requestPolicy": ...}}``;
    ``consumes``: ``{counter set: {counter: quantity}}``."""
    body: dict[str, Any] = {"name": name, **extra}
    if capacity:
        body["capacity"] = {k: v if isinstance(v, dict) else {"value": v} for k, v in capacity.items()}
    if multi:
        body["allowMultipleAllocations"] = True
    if consumes:
        body["consumesCounters"] = [
            {"counterSet": s, "counters": {c: {"value": v} for c, v in counters.items()}}
            for s, counters in consumes.items()
        ]
    if taints:
        body["taints"] = taints
    return body


def resource_slice(
    name: str = "node-1-gpus",
    *,
    pool: str = "node-1",
    driver: str = DRIVER,
    generation: int = 1,
    count: int = 1,
    devices: list[dict[str, Any]] | None = None,
    counters: dict[str, dict[str, str]] | None = None,
    node_name: str | None = "node-1",
    **spec: Any,
) -> dict[str, Any]:
    """``counters``: ``{counter set: {counter: quantity}}`` for ``sharedCounters``."""
    body: dict[str, Any] = {
        "driver": driver,
        "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
        **spec,
    }
    if node_name and "allNodes" not in spec and "nodeSelector" not in spec:
        body["nodeName"] = node_name
    if devices is not None:
        body["devices"] = devices
    if counters:
        body["sharedCounters"] = [
            {"name": s, "counters": {c: {"value": v} for c, v in values.items()}}
            for s, values in counters.items()
        ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": body,
    }


def gpus(*names: str, **kwargs: Any) -> list[dict[str, Any]]:
    return [device(n, **kwargs) for n in names]


def request(name: str = "gpu", **exactly: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": "gpu.example.com", **exactly}}


def result(
    dev: str,
    *,
    pool: str = "node-1",
    driver: str = DRIVER,
    req: str = "gpu",
    admin: bool = False,
    share_id: str | None = None,
    consumed: dict[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"request": req, "driver": driver, "pool": pool, "device": dev, **extra}
    if admin:
        body["adminAccess"] = True
    if share_id:
        body["shareID"] = share_id
    if consumed is not None:
        body["consumedCapacity"] = consumed
    return body


def claim(
    name: str = "c",
    *,
    namespace: str = "default",
    uid: str | None = None,
    requests: list[dict[str, Any]] | None = None,
    results: list[dict[str, Any]] | None = None,
    node: str | None = "node-1",
    reserved_for: list[str] = (),
) -> dict[str, Any]:
    """A claim; with ``results`` it is allocated (pinned to ``node`` when given)."""
    status: dict[str, Any] = {}
    if results is not None:
        allocation: dict[str, Any] = {"devices": {"results": results}}
        if node:
            allocation["nodeSelector"] = {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                ]
            }
        status["allocation"] = allocation
        if reserved_for:
            status["reservedFor"] = [{"resource": "pods", "name": p, "uid": f"uid-{p}"} for p in reserved_for]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"uid-{namespace}-{name}"},
        "spec": {"devices": {"requests": requests if requests is not None else [request()]}},
        "status": status,
    }
