"""Reviews of binds and pinned pods, and a bind guard's app over a fixed state."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.builders import pod
from webhook.admission import parse_review
from webhook.binding import BindGuard
from webhook.config import config_from_dict
from webhook.coordination.reservations import Reservation, node_table
from webhook.coordination.table import LocalTable
from webhook.serve.app import create_app
from webhook.state import ClusterState, node_from, pod_record
from webhook.state.source import FixedState

SCHEDULER = "system:serviceaccount:volcano-system:volcano-scheduler"


def gpu_pod(name: str, **kwargs) -> dict:
    return pod(name, namespace="ml", requests={"nvidia.com/gpu": "1", "cpu": "100m"}, **kwargs)


def reserve(table: LocalTable, new: Reservation, decide, keep, *, deadline: float) -> bool:
    """``decide`` over the node's records in the table, and store ``new`` beside the ``keep``
    ones when it fits: one table decision, without the Leases."""
    with table.locked(new.node, deadline) as held:
        fits = decide(held.entries)
        if fits:
            held.store([*(r for r in held.entries if r.pod != new.pod and keep(r)), new])
        return fits


def state_with(*objects: dict) -> ClusterState:
    state = ClusterState()
    for obj in objects:
        if obj["kind"] == "Node":
            state.set_node(node_from(obj))
        else:
            state.set_pod(obj["metadata"]["uid"], pod_record(obj))
    return state


def binding(
    name: str, node_name: str, *, uid: str | None = None, dry_run: bool = False, user=SCHEDULER
) -> dict:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"bind-{name}",
            "kind": {"group": "", "version": "v1", "kind": "Binding"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "binding",
            "namespace": "ml",
            "name": name,
            "operation": "CREATE",
            "userInfo": {"username": user},
            "dryRun": dry_run,
            "object": {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "namespace": "ml", "uid": uid or f"uid-{name}"},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node_name},
            },
        },
    }


def pod_create(obj: dict) -> dict:
    """The review of a Pod CREATE in namespace ml (with ``spec.nodeName``, it reserves like a bind)."""
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "c", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": "ml",
                    "operation": "CREATE", "object": obj},
    }  # fmt: skip


def client_for(state: ClusterState, tmp_path: Path, config: dict | None = None, **guard) -> object:
    conf = config_from_dict(config or {})
    bind_guard = BindGuard(conf, node_table(tmp_path / "reservations"), **guard)
    return create_app(conf, FixedState(state), bind_guard=bind_guard).test_client()


def review_of(review: dict):
    return parse_review(json.dumps(review).encode())
