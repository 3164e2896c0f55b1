"""DRA index benchmark: build time, memory and the cost of judging one allocation (issue 19).

The cluster: 5,000 nodes x 8 GPUs, one pool (one ResourceSlice) per node; 125 of the nodes have
partitionable GPUs (1,000 GPUs, 7 partitions each, counters in a second slice: the 1.35 layout);
40,000 ResourceClaims of which 30,000 are allocated. Objects are fed to the index one at a time
as JSON, the way the informer does, so the traced memory is what the index keeps (strings
included), not the source objects. Target: the index under 64 MiB.
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

from webhook.dra.judge import judge_allocation
from webhook.kube import dra
from webhook.kube.dra import resource_claim_from
from webhook.state.devices import DeviceIndex
from webhook.state.gc_pause import collector_paused

DRIVER = "gpu.nvidia.com"
NODES = 5_000
GPUS = 8
PARTITIONABLE_NODES = 125  # x 8 GPUs = 1,000 partitionable GPUs
PARTITIONS = 7
CLAIMS = 40_000
ALLOCATED_PER_NODE = 6  # 30,000 allocated claims


def node(i: int) -> str:
    return f"node-{i:05d}"


def gpu(name: str, uuid: str, extra: dict | None = None) -> dict:
    return {
        "name": name,
        "attributes": {"uuid": {"string": uuid}, "productName": {"string": "NVIDIA H100 80GB HBM3"}},
        "capacity": {"memory": {"value": "80Gi"}},
        **(extra or {}),
    }


def slices(i: int) -> list[dict]:
    pool = {"name": node(i), "generation": 1}
    if i >= PARTITIONABLE_NODES:
        devices = [gpu(f"gpu-{g}", f"GPU-{i}-{g}") for g in range(GPUS)]
        spec = {
            "driver": DRIVER,
            "nodeName": node(i),
            "pool": {**pool, "resourceSliceCount": 1},
            "devices": devices,
        }
        return [{"metadata": {"name": f"{node(i)}-gpus"}, "spec": spec}]
    devices, counters = [], []
    for g in range(GPUS):
        counter_set = f"gpu-{g}-counters"
        counters.append(
            {"name": counter_set, "counters": {"memory": {"value": "80Gi"}, "slices": {"value": "7"}}}
        )
        whole = {
            "counterSet": counter_set,
            "counters": {"memory": {"value": "80Gi"}, "slices": {"value": "7"}},
        }
        devices.append(gpu(f"gpu-{g}", f"GPU-{i}-{g}", {"consumesCounters": [whole]}))
        for p in range(PARTITIONS):
            part = {
                "counterSet": counter_set,
                "counters": {"memory": {"value": "10Gi"}, "slices": {"value": "1"}},
            }
            devices.append(gpu(f"gpu-{g}-mig-{p}", f"MIG-{i}-{g}-{p}", {"consumesCounters": [part]}))
    pool = {**pool, "resourceSliceCount": 2}
    return [
        {
            "metadata": {"name": f"{node(i)}-counters"},
            "spec": {"driver": DRIVER, "nodeName": node(i), "pool": pool, "sharedCounters": counters},
        },
        {
            "metadata": {"name": f"{node(i)}-gpus"},
            "spec": {"driver": DRIVER, "nodeName": node(i), "pool": pool, "devices": devices},
        },
    ]


def claim(n: int, device: str | None, node_name: str | None) -> dict:
    name = f"job-{n:05d}-gpu"
    obj = {
        "metadata": {"name": name, "namespace": f"team-{n % 40}", "uid": f"00000000-0000-4000-8000-{n:012d}"},
        "spec": {
            "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}
        },
        "status": {},
    }
    if device is not None:
        obj["status"] = {
            "allocation": {
                "devices": {
                    "results": [{"request": "gpu", "driver": DRIVER, "pool": node_name, "device": device}]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node_name]}]}
                    ]
                },
            },
            "reservedFor": [
                {"resource": "pods", "name": f"job-{n:05d}-0", "uid": f"10000000-0000-4000-8000-{n:012d}"}
            ],
        }
    return obj


def claims() -> list[dict]:
    found = []
    for i in range(NODES):
        for g in range(ALLOCATED_PER_NODE):
            device = f"gpu-{g}-mig-0" if i < PARTITIONABLE_NODES else f"gpu-{g}"
            found.append(claim(len(found), device, node(i)))
    while len(found) < CLAIMS:
        found.append(claim(len(found), None, None))
    return found


def build(slice_json: list[bytes], claim_json: list[bytes]) -> tuple[DeviceIndex, float, float]:
    """The index fed one object at a time, as an informer's list and watch events would."""
    started = time.perf_counter()
    index = DeviceIndex()
    for raw in slice_json:
        index.set_slice(orjson.loads(raw))
    sliced = time.perf_counter()
    for raw in claim_json:
        index.set_claim(orjson.loads(raw))
    return index, sliced - started, time.perf_counter() - sliced


def cold() -> None:
    """Forget the devices and node selectors parsed so far: each build starts as a new process."""
    dra.slices._devices.clear()
    dra.node_selection._selectors.clear()
    gc.collect()


def timed(call, runs: int = 200) -> float:
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1e6


def main() -> None:
    slice_json = [orjson.dumps(s) for i in range(NODES) for s in slices(i)]
    claim_json = [orjson.dumps(c) for c in claims()]
    devices = sum(len(orjson.loads(s)["spec"].get("devices", ())) for s in slice_json)
    print(f"cluster: {len(slice_json):,} ResourceSlices, {devices:,} devices, {len(claim_json):,} claims")

    gc.collect()
    tracemalloc.start()
    index, _, _ = build(slice_json, claim_json)
    gc.collect()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        f"traced memory of the index: {current / 2**20:.1f} MiB "
        f"(peak while building {peak / 2**20:.1f} MiB; target < 64 MiB)"
    )
    cold()
    _, sliced, claimed = build(slice_json, claim_json)
    cold()
    with collector_paused():
        _, paused_sliced, paused_claimed = build(slice_json, claim_json)
    print(
        f"build from JSON: slices {sliced * 1000:.0f} ms + claims {claimed * 1000:.0f} ms; "
        f"with the collector paused (as the snapshot loader does): "
        f"{paused_sliced * 1000:.0f} ms + {paused_claimed * 1000:.0f} ms; "
        f"{len(index.claims()):,} allocated claims, {len(index.uses()):,} devices in use"
    )

    free = claim(99_001, "gpu-7", node(4_000))
    taken = claim(99_002, "gpu-0", node(4_000))
    partition = claim(99_003, "gpu-7-mig-3", node(3))
    whole_over_partition = claim(99_004, "gpu-0", node(3))
    for label, obj in (
        ("free GPU (allowed)", free),
        ("held GPU (DeviceAlreadyAllocated)", taken),
        ("free partition, counters checked (allowed)", partition),
        ("whole GPU over a held partition (DeviceCountersExceeded)", whole_over_partition),
    ):
        parsed = resource_claim_from(obj)
        verdict = ",".join(f.reason for f in judge_allocation(parsed, index)) or "allow"
        judge = timed(lambda parsed=parsed: judge_allocation(parsed, index))
        with_parse = timed(lambda obj=obj: judge_allocation(obj, index))
        print(f"judge {label}: {judge:.1f} us ({with_parse:.1f} us with parsing the claim) -> {verdict}")

    event = claim(99_005, "gpu-7", node(4_001))
    cleared = claim(99_005, None, None)
    per_event = timed(lambda: (index.set_claim(event), index.set_claim(cleared)), runs=2_000) / 2
    bumped = [orjson.loads(slice_json[-1]) for _ in range(2)]
    bumped[1]["spec"]["pool"]["generation"] = 2
    turn = iter(range(10**9))
    per_slice = timed(lambda: index.set_slice(bumped[next(turn) % 2]))
    print(f"one claim watch event: {per_event:.1f} us; one slice event (generation bump): {per_slice:.1f} us")


if __name__ == "__main__":
    main()
