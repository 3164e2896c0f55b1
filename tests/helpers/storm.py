"""Pods of one ReplicaSet, and their kubelet rejections: a storm breaker's input."""

from __future__ import annotations

from tests.helpers.builders import pod
from webhook.kube.rejection import Owner

OWNER = Owner("rs-uid", "ReplicaSet", "trainer-7d9f", "ml")


REF = {
    "apiVersion": "apps/v1",
    "kind": "ReplicaSet",
    "name": "trainer-7d9f",
    "uid": "rs-uid",
    "controller": True,
}


def owned(name: str, **kwargs) -> dict:
    obj = pod(name, namespace="ml", **kwargs)
    obj["metadata"]["ownerReferences"] = [REF]
    obj["metadata"]["labels"] = {"app": "trainer", "pod-template-hash": "7d9f"}
    return obj


def rejected(
    name: str, reason: str = "OutOfnvidia.com/gpu", created: str | None = None, node_name: str = "gpu-1"
) -> dict:
    obj = owned(name, node_name=node_name)
    obj["status"] = {"phase": "Failed", "reason": reason, "message": f"Pod was rejected: {reason}"}
    if created:
        obj["metadata"]["creationTimestamp"] = created
    return obj
