"""ResourceClaim status writes as the API server sends them, and an allocation guard's app over a
fixed state."""

from __future__ import annotations

import copy

from tests.helpers.builders import node
from tests.helpers.dra_builders import claim, gpus, resource_slice, result
from webhook.allocation import AllocationGuard
from webhook.config import config_from_dict
from webhook.coordination.allocations import pool_table
from webhook.serve.app import create_app
from webhook.state import ClusterState, node_from
from webhook.state.devices import index_of
from webhook.state.source import FixedState

SCHEDULER = "system:serviceaccount:kube-system:kube-scheduler"


def state_with(*, slices=(), claims=(), nodes=("node-1",)) -> ClusterState:
    state = ClusterState()
    for name in nodes:
        state.set_node(node_from(node(name)))
    state.devices = index_of(slices=slices, claims=claims)
    return state


def one_gpu_left() -> ClusterState:
    """node-1's pool has two GPUs; gpu-0 is held by ml/holder."""
    holder = claim("holder", namespace="ml", results=[result("gpu-0")])
    return state_with(slices=[resource_slice(devices=gpus("gpu-0", "gpu-1"))], claims=[holder])


def status_update(new: dict, *, user: str = SCHEDULER, dry_run: bool = False, version: str = "41") -> dict:
    """The API server's review of a status write setting ``new``'s allocation; ``version``: the
    stored claim's resourceVersion (the oldObject's)."""
    old = copy.deepcopy(new)
    old["status"] = {}
    old["metadata"]["resourceVersion"] = version
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"u-{new['metadata']['name']}",
            "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
            "resource": {"group": "resource.k8s.io", "version": "v1", "resource": "resourceclaims"},
            "subResource": "status",
            "namespace": new["metadata"]["namespace"],
            "name": new["metadata"]["name"],
            "operation": "UPDATE",
            "userInfo": {"username": user},
            "dryRun": dry_run,
            "object": new,
            "oldObject": old,
        },
    }


def client_for(state: ClusterState, tmp_path, config: dict | None = None, **kwargs):
    conf = config_from_dict(config or {})
    guard = AllocationGuard(conf, pool_table(tmp_path / "allocations"), **kwargs)
    return create_app(conf, FixedState(state), allocation_guard=guard).test_client()
