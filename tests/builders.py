"""Small builders for Node and Pod objects, so each test shows only what it is about."""

from __future__ import annotations

from typing import Any


def node(
    name: str = "node-1",
    *,
    cpu: str = "4",
    memory: str = "8Gi",
    pods: str = "110",
    labels: dict | None = None,
    taints: list | None = None,
    conditions: list[str] = (),
    extra: dict | None = None,
    os: str = "linux",
) -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": memory, "pods": pods, "ephemeral-storage": "50Gi", **(extra or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": taints or []},
        "status": {
            "allocatable": allocatable,
            "conditions": [{"type": c, "status": "True"} for c in conditions],
            "nodeInfo": {"operatingSystem": os},
        },
    }


def container(
    name: str = "app", requests: dict | None = None, limits: dict | None = None, **extra: Any
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": name, "image": "img", "resources": resources, **extra}


def pod(
    name: str = "p",
    *,
    node_name: str | None = None,
    requests: dict | None = None,
    containers: list | None = None,
    namespace: str = "default",
    uid: str | None = None,
    phase: str | None = None,
    scheduler: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": containers or [container(requests=requests or {})], **spec}
    if node_name:
        body["nodeName"] = node_name
    if scheduler:
        body["schedulerName"] = scheduler
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"}
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def deployment(spec: dict[str, Any], name: str = "web", namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }
