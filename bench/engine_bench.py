"""Engine benchmark: decision latency and state cost for a 5,000-node / 150,000-pod cluster.

Reports (one run, same machine): p50/p99 decision time for a Pod created with nodeName and
for a Deployment review; snapshot load time from a `kubectl get -o json`-shaped file;
retained bytes per pod record (tracemalloc); process peak RSS.
Targets (issue 2): p99 decision < 200 us; per-pod state < 1 KiB.
"""

from __future__ import annotations

import argparse
import gc
import random
import resource
import statistics
import tempfile
import time
import tracemalloc
from pathlib import Path

import orjson

from webhook.config import Config
from webhook.engine import evaluate
from webhook.state import ClusterState, node_from, pod_record
from webhook.state.snapshot import load_snapshot

SCHEDULERS = ("default-scheduler", "volcano")


def make_node(i: int) -> dict:
    gpu = i % 10 == 0
    allocatable = {"cpu": "63500m", "memory": "250Gi", "pods": "110", "ephemeral-storage": "900Gi"}
    if gpu:
        allocatable["nvidia.com/gpu"] = "8"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": f"node-{i:05d}",
            "uid": f"node-uid-{i}",
            "labels": {
                "kubernetes.io/hostname": f"node-{i:05d}",
                "kubernetes.io/os": "linux",
                "topology.kubernetes.io/zone": f"zone-{i % 3}",
            },
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}] if gpu else []},
        "status": {
            "allocatable": allocatable,
            "capacity": allocatable,
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "MemoryPressure", "status": "False"},
            ],
            "nodeInfo": {"operatingSystem": "linux", "kubeletVersion": "v1.35.0"},
        },
    }


def make_pod(i: int, nodes: int, rng: random.Random) -> dict:
    node = rng.randrange(nodes)
    requests = {"cpu": f"{rng.choice((100, 250, 500, 1000))}m", "memory": f"{rng.choice((128, 256, 512))}Mi"}
    limits = {"memory": requests["memory"]}
    if node % 10 == 0 and rng.random() < 0.2:
        limits["nvidia.com/gpu"] = "1"
    containers = [
        {
            "name": "app",
            "image": "registry.example/app:1",
            "resources": {"requests": requests, "limits": limits},
        }
    ]
    if i % 7 == 0:
        containers.append(
            {
                "name": "sidecar",
                "image": "registry.example/proxy:1",
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
                "ports": [{"containerPort": 15090, "hostPort": 15090 + i % 5}],
            }
        )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"app-{i}-x7k2p",
            "namespace": f"team-{i % 40}",
            "uid": f"7d5c2a9e-{i:08d}-4b1f-9a3e-5c2d1e0f{i % 10000:04d}",
        },
        "spec": {
            "nodeName": f"node-{node:05d}",
            "schedulerName": SCHEDULERS[i % 11 == 0],
            "priority": 0,
            "containers": containers,
        },
        "status": {"phase": "Running"},
    }


def build_state(nodes: int, pods: int, seed: int = 1) -> ClusterState:
    rng = random.Random(seed)
    state = ClusterState()
    for i in range(nodes):
        state.set_node(node_from(make_node(i)))
    for i in range(pods):
        obj = make_pod(i, nodes, rng)
        state.set_pod(obj["metadata"]["uid"], pod_record(obj))
    return state


def percentile(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=1000)[int(q * 1000) - 1]


def time_decisions(state: ClusterState, objects: list[dict]) -> list[float]:
    config = Config()
    for obj in objects[:200]:
        evaluate(obj, "CREATE", state, config)  # warm caches
    samples = []
    for obj in objects:
        start = time.perf_counter_ns()
        evaluate(obj, "CREATE", state, config)
        samples.append((time.perf_counter_ns() - start) / 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--decisions", type=int, default=20_000)
    args = parser.parse_args()
    rng = random.Random(7)

    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    nodes_only = build_state(args.nodes, 0)
    with_nodes = tracemalloc.get_traced_memory()[0]
    state = build_state(args.nodes, args.pods)
    gc.collect()
    full = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del nodes_only
    # The second state holds its own nodes too: subtract them once more.
    per_pod = ((full - with_nodes) - (with_nodes - base)) / args.pods

    pods = [make_pod(10**7 + i, args.nodes, rng) for i in range(args.decisions)]
    for p in pods:
        p.pop("status")
    deployments = []
    for p in pods[: args.decisions // 4]:
        deployments.append(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": p["metadata"]["name"], "namespace": "team-1"},
                "spec": {"template": {"metadata": {"labels": {"app": "x"}}, "spec": p["spec"]}},
            }
        )
    pod_samples = time_decisions(state, pods)
    deploy_samples = time_decisions(state, deployments)

    with tempfile.TemporaryDirectory() as tmp:
        snapshot = Path(tmp) / "cluster.json"
        gen = random.Random(1)
        items = [make_node(i) for i in range(args.nodes)] + [
            make_pod(i, args.nodes, gen) for i in range(args.pods)
        ]
        snapshot.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        size_mb = snapshot.stat().st_size / 2**20
        del items
        gc.collect()
        start = time.perf_counter()
        loaded = load_snapshot([str(snapshot)])
        load_seconds = time.perf_counter() - start
    assert len(loaded.pods) == len(state.pods)

    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"state: {args.nodes} nodes, {len(state.pods)} active pods")
    print(
        f"decision, Pod with nodeName:  p50 {percentile(pod_samples, 0.5):7.1f} us   "
        f"p99 {percentile(pod_samples, 0.99):7.1f} us   (n={len(pod_samples)}; target p99 < 200 us)"
    )
    print(
        f"decision, Deployment review:  p50 {percentile(deploy_samples, 0.5):7.1f} us   "
        f"p99 {percentile(deploy_samples, 0.99):7.1f} us   (n={len(deploy_samples)})"
    )
    print(f"state memory per pod record:  {per_pod:7.0f} bytes (tracemalloc, retained; target < 1 KiB)")
    print(f"snapshot load ({size_mb:.0f} MiB JSON): {load_seconds:5.2f} s")
    print(f"process peak RSS: {peak_rss:.0f} MiB")


if __name__ == "__main__":
    main()
