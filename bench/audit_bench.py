"""Audit benchmark: a synthetic 5,000-node / 150,000-pod cluster with its workloads, written as
one ``kubectl get ... -A -o json`` List, then read and audited as ``admit-guard audit`` does.

The cluster holds every finding type: pinned Deployments, a 3,000-pod admission storm,
GPU nodes shared by two schedulers, and overcommitted nodes. Reports read time, audit time,
their sum (target, issue 12: <= 10 s), findings by type, and peak RSS.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.builders import node  # noqa: E402
from webhook.audit import (  # noqa: E402
    NODES_PER_CHUNK,
    node_findings,
    run_audit,
)
from webhook.config import Config  # noqa: E402
from webhook.state.inventory import read_inventory  # noqa: E402


def gpu_node(i: int, gpus: int) -> dict:
    devices = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return node(f"node-{i}", cpu="32", memory="128Gi", extra={"ephemeral-storage": "500Gi", **devices})


def template(app: str, requests: dict, node_name: str = "") -> dict:
    spec: dict = {"containers": [{"name": "app", "image": "img:1", "resources": {"requests": requests}}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"labels": {"app": app}}, "spec": spec}


def owner(kind: str, name: str, uid: str, api_version: str = "apps/v1") -> list[dict]:
    return [{"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True}]


def cluster(nodes: int, pods: int) -> list[dict]:
    items: list[dict] = []
    gpu_nodes = nodes // 10
    items += [gpu_node(i, 8 if i < gpu_nodes else 0) for i in range(nodes)]
    apps = nodes  # one Deployment (and ReplicaSet) per 30 pods
    per_app = max(1, pods // apps)
    for a in range(apps):
        ns = f"team-{a % 50}"
        pinned = f"node-{a}" if a % 250 == 0 else ""
        requests = {"cpu": "100m", "memory": "256Mi"}
        items.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": f"app-{a}", "namespace": ns, "uid": f"dep-{a}"},
                "spec": {"replicas": per_app, "template": template(f"app-{a}", requests, pinned)},
            }
        )
        items.append(
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "metadata": {
                    "name": f"app-{a}-h",
                    "namespace": ns,
                    "uid": f"rs-{a}",
                    "ownerReferences": owner("Deployment", f"app-{a}", f"dep-{a}"),
                },
                "spec": {"replicas": per_app, "template": template(f"app-{a}", requests, pinned)},
            }
        )
    for p in range(pods):
        a = p % apps
        node_index = p % nodes
        requests = {"cpu": "100m", "memory": "256Mi"}
        scheduler = "default-scheduler"
        if node_index < gpu_nodes and p // nodes < 4:
            requests["nvidia.com/gpu"] = "2"
            # a few GPU nodes get pods from a second scheduler (and one GPU too many)
            if node_index % 50 == 7 and p // nodes == 3:
                scheduler, requests["nvidia.com/gpu"] = "volcano", "3"
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"app-{a}-h-{p}",
                    "namespace": f"team-{a % 50}",
                    "uid": f"pod-{p}",
                    "labels": {"app": f"app-{a}", "pod-template-hash": "h"},
                    "ownerReferences": owner("ReplicaSet", f"app-{a}-h", f"rs-{a}"),
                },
                "spec": {
                    "nodeName": f"node-{node_index}",
                    "schedulerName": scheduler,
                    "containers": [{"name": "app", "image": "img:1", "resources": {"requests": requests}}],
                },
                "status": {"phase": "Running"},
            }
        )
    for s in range(3000):  # a storm: Failed pods of app-0 the kubelet rejected
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"app-0-h-storm-{s}",
                    "namespace": "team-0",
                    "uid": f"storm-{s}",
                    "creationTimestamp": f"2026-11-23T10:{s // 60 % 60:02d}:{s % 60:02d}Z",
                    "labels": {"app": "app-0", "pod-template-hash": "h"},
                    "ownerReferences": owner("ReplicaSet", "app-0-h", "rs-0"),
                },
                "spec": {"nodeName": "node-0", "containers": [{"name": "app", "image": "img:1"}]},
                "status": {
                    "phase": "Failed",
                    "reason": "OutOfcpu",
                    "message": "Pod was rejected: Node didn't have enough resource: cpu",
                },
            }
        )
    return items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster.json"
        objects = cluster(args.nodes, args.pods)
        path.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
        size = path.stat().st_size
        workloads = sum(o["kind"] in ("Deployment", "ReplicaSet") for o in objects)
        del objects
        started = time.perf_counter()
        inventory = read_inventory([str(path)])
        read = time.perf_counter() - started
        started = time.perf_counter()
        report = run_audit(inventory, Config(), time.time())
        audited = time.perf_counter() - started
        chunks = chunk_times(inventory.state)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"cluster: {args.nodes} nodes, {args.pods} pods + 3000 rejected, {workloads} workloads "
        f"({size / 2**20:.0f} MiB JSON)"
    )
    print(
        f"read snapshot: {read:5.2f} s   audit: {audited:5.2f} s   "
        f"total: {read + audited:5.2f} s (target <= 10 s)"
    )
    print(f"findings: {report.summary['byType']}   peak RSS: {peak:.0f} MiB")
    print(
        f"periodic (server) audit: {sum(chunks) * 1000:.0f} ms in {len(chunks)} chunks of "
        f"{NODES_PER_CHUNK} nodes, longest chunk (state lock held) {max(chunks) * 1000:.1f} ms"
    )


def chunk_times(state) -> list[float]:
    """What ``serve --audit-interval`` does: node findings, one state-lock hold per chunk."""
    names, times = list(state.nodes), []
    for start in range(0, len(names), NODES_PER_CHUNK):
        began = time.perf_counter()
        node_findings(state, Config(), names[start : start + NODES_PER_CHUNK])
        times.append(time.perf_counter() - began)
    return times


if __name__ == "__main__":
    main()
