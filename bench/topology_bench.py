"""Topology benchmark (issue 27 item 4): the NRT index of 5,000 nodes x 8 NUMA zones, the time
to build it, and what the topology manager check adds to one decision.

- Memory: 5,000 NodeResourceTopology objects of 8 ``type: Node`` zones (cpu, memory,
  hugepages-1Gi, nvidia.com/gpu each), fed to the state one at a time as JSON the way the
  informer does (``topology_from`` then ``ClusterState.set_topology``), traced with tracemalloc:
  what the index keeps. Target: 40 MiB.
- Ready: the time the informer's NRT list adds before the state is ready, measured as building
  the state from the list (parse, ``topology_from``, ``set_topology``): the live informer's
  paging and HTTP are the same as for every other kind and are not measured here. Target: 1 s.
- Decision: ``kubelet_admission`` of a Guaranteed pod asking cpu, memory and a GPU on an 8-zone
  node, with the node's NRT (``single-numa-node`` and ``restricted``) minus without it: on a
  fresh NRT, and with 1 and 8 Guaranteed pods bound after it, each placed first (the staleness
  rule). Target: 100 µs p99 added.

Medians of one run; each figure is measured ``ROUNDS`` times.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from webhook.checks import PodUnderReview, kubelet_admission
from webhook.checks.kubelet import KubeletConfig
from webhook.kube.workloads import pod_shape
from webhook.state import ClusterState, node_from, pod_record
from webhook.state.topology import topology_from

NODES = 5_000
ZONES = 8
ROUNDS = 5
DECISIONS = 2_000
MIB = 1 << 20


def nrt(i: int, policy: str = "single-numa-node") -> dict:
    zone = [
        {"name": "cpu", "capacity": "24", "allocatable": "22", "available": str(4 + i % 18)},
        {"name": "memory", "capacity": "128Gi", "allocatable": "120Gi", "available": "64Gi"},
        {"name": "hugepages-1Gi", "capacity": "16Gi", "allocatable": "16Gi", "available": "8Gi"},
        {"name": "nvidia.com/gpu", "capacity": "1", "allocatable": "1", "available": str(i % 2)},
    ]
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha2",
        "kind": "NodeResourceTopology",
        "metadata": {"name": f"node-{i:05d}", "resourceVersion": str(1000 + i)},
        "attributes": [
            {"name": "topologyManagerPolicy", "value": policy},
            {"name": "topologyManagerScope", "value": "container"},
        ],
        "zones": [
            {"name": f"node-{z}", "type": "Node", "costs": [], "resources": zone} for z in range(ZONES)
        ],
    }


def node(name: str) -> dict:
    amounts = {"cpu": "192", "memory": "1Ti", "pods": "110", "nvidia.com/gpu": "8"}
    return {"metadata": {"name": name, "labels": {}}, "status": {"allocatable": amounts, "capacity": amounts}}


def guaranteed_pod(name: str, node_name: str | None, cpu: str = "8", gpu: str = "1") -> dict:
    amounts = {"cpu": cpu, "memory": "16Gi", "nvidia.com/gpu": gpu}
    container = {"name": "app", "image": "img", "resources": {"requests": amounts, "limits": amounts}}
    spec: dict = {"containers": [container]}
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
        "spec": spec,
    }


def build(objects: list[bytes]) -> ClusterState:
    state = ClusterState()
    for raw in objects:
        topology = topology_from(orjson.loads(raw))
        state.set_topology(topology.node, topology)
    return state


def index_memory(objects: list[bytes]) -> tuple[float, float]:
    """(traced MiB the index keeps, seconds to build it)."""
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    state = build(objects)
    kept = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del state
    gc.collect()
    start = time.perf_counter()
    build(objects)
    return kept / MIB, time.perf_counter() - start


def decision_cost(policy: str, since: int) -> tuple[float, float]:
    """µs ``kubelet_admission`` takes with the node's NRT minus without it: (median of each, p99
    of each)."""
    state = ClusterState()
    state.set_node(node_from(node("node-00001")))
    state.set_topology("node-00001", topology_from(nrt(1, policy)))
    state.topology_age_known = True
    for k in range(since):  # bound after the NRT: placed before the pod under review
        bound = guaranteed_pod(f"bound-{k}", "node-00001", cpu="1", gpu="0")
        state.set_pod(bound["metadata"]["uid"], pod_record(bound))
    review = PodUnderReview.from_shape(pod_shape(guaranteed_pod("new", "node-00001")))
    target = state.nodes["node-00001"]
    usage = state.usage("node-00001")
    with_nrt, without = KubeletConfig(topology=target.topology), KubeletConfig()
    timed: dict[bool, list[float]] = {True: [], False: []}
    for i in range(2 * DECISIONS):  # interleaved, so that a busy moment falls on both
        topology = i % 2 == 0
        start = time.perf_counter()
        kubelet_admission(review, target, usage, with_nrt if topology else without)
        timed[topology].append((time.perf_counter() - start) * 1e6)
    for times in timed.values():
        times.sort()
    p99 = int(DECISIONS * 0.99)
    return (
        statistics.median(timed[True]) - statistics.median(timed[False]),
        timed[True][p99] - timed[False][p99],
    )


def main() -> None:
    objects = [orjson.dumps(nrt(i)) for i in range(NODES)]
    memory, seconds = zip(*(index_memory(objects) for _ in range(ROUNDS)), strict=True)
    print(f"NRT index, {NODES} nodes x {ZONES} zones: {statistics.median(memory):.1f} MiB (target 40)")
    print(f"building it from the NRT list: {statistics.median(seconds):.3f} s (target 1)")
    for policy in ("single-numa-node", "restricted"):
        for since in (0, 1, 8):
            medians, p99s = zip(*(decision_cost(policy, since) for _ in range(ROUNDS)), strict=True)
            print(
                f"{policy}, {since} pod(s) bound since the NRT: a cpu+memory+GPU pod on an 8-zone node "
                f"adds {statistics.median(medians):.1f} µs median, {statistics.median(p99s):.1f} µs p99 "
                "(target 100 p99)"
            )


if __name__ == "__main__":
    main()
