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
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers.builders import cluster_node, cluster_pod
from webhook.config import Config
from webhook.engine import evaluate
from webhook.state import ClusterState, node_from, pod_record
from webhook.state.snapshot import load_snapshot


def build_state(nodes: int, pods: int, seed: int = 1) -> ClusterState:
    rng = random.Random(seed)
    state = ClusterState()
    for i in range(nodes):
        state.set_node(node_from(cluster_node(i)))
    for i in range(pods):
        obj = cluster_pod(i, nodes, rng)
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

    pods = [cluster_pod(10**7 + i, args.nodes, rng) for i in range(args.decisions)]
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
        items = [cluster_node(i) for i in range(args.nodes)] + [
            cluster_pod(i, args.nodes, gen) for i in range(args.pods)
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
