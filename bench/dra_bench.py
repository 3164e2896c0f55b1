"""DRA through the server (issue 19): what the device objects add to a live guard's start, and
allocation reviews at a large scheduler's rate.

The cluster is bench/dra_index_bench.py's: 5,000 nodes x 8 GPUs (one pool per node), 1,000
partitionable GPUs with 7 partitions each, 40,000 ResourceClaims (30,000 allocated). A fake API
server (its own process) serves it. Reported, in one run:

- a live guard (``serve --kubeconfig``, 2 workers): time to ready and a worker's RSS, with and
  without the cluster serving resource.k8s.io/v1 (targets: DRA adds <= 3 s to ready);
- allocation reviews (``resourceclaims/status``, each a free GPU for one of the 10,000
  unallocated claims) sent open-loop at 300 writes/s for 10 s on 8 keep-alive connections:
  p50/p99 from the scheduled send time, without coordination (the guard serving the same
  cluster as a snapshot: the replica's table only) and with it (live: a Lease per pool), and
  API writes per allocation (targets: p99 < 5 ms without, < 15 ms with).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from dra_index_bench import GPUS, NODES, PARTITIONABLE_NODES, claim, claims, node, slices  # noqa: E402
from open_loop import report, send  # noqa: E402

from tests.helpers.claims import status_update  # noqa: E402
from tests.helpers.fake_apiserver import Cluster, FakeApiServer, write_kubeconfig  # noqa: E402
from tests.helpers.live_server import live_server  # noqa: E402

RATE, CONNECTIONS = 300, 8
SECONDS = float(os.environ.get("DRA_BENCH_SECONDS", "10"))
FIRST_FREE = 30_000  # claims from here on are unallocated


def objects() -> dict[str, list[dict]]:
    def typed(kind: str, obj: dict) -> dict:
        return {"apiVersion": "resource.k8s.io/v1", "kind": kind, **obj}

    nodes = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": node(i), "labels": {"kubernetes.io/hostname": node(i)}},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"}},
        }
        for i in range(NODES)
    ]
    return {
        "nodes": nodes,
        "resourceslices": [typed("ResourceSlice", s) for i in range(NODES) for s in slices(i)],
        "resourceclaims": [typed("ResourceClaim", c) for c in claims()],
    }


def serve_fake(dra: bool) -> None:
    """Child process: the fake API server; prints its URL, then on a stdin line the Lease writes."""
    cluster = Cluster(bookmark_every=5.0, serves_dra=dra)
    for resource, items in objects().items():
        cluster.load(resource, items)
    cluster.load("pods", [])
    cluster.load("deviceclasses", [])
    server = FakeApiServer(cluster)
    print(server.url, flush=True)
    sys.stdin.readline()
    print(cluster.lease_writes, cluster.lease_conflicts, flush=True)
    sys.stdin.read()
    server.close()


def review(n: int, version: str) -> bytes:
    """Allocate a free GPU (gpu-6 or gpu-7 of a whole-GPU node) to unallocated claim ``n``."""
    slot = n - FIRST_FREE
    where = node(PARTITIONABLE_NODES + (slot // 2) % (NODES - PARTITIONABLE_NODES))
    new = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        **claim(n, f"gpu-{GPUS - 1 - slot % 2}", where),
    }
    return orjson.dumps(status_update(new, version=version))


def run(server, versions: dict[int, str]) -> tuple[list[float], int, int]:
    """Open loop at RATE/s; an allocation counts as allowed only when checked (no warning)."""

    def checked(response: dict) -> bool:
        return response["allowed"] and not response.get("warnings")

    def body(i: int) -> bytes:
        return review(FIRST_FREE + i, versions.get(FIRST_FREE + i, ""))

    return send(server, int(RATE * SECONDS), RATE, CONNECTIONS, body, allowed=checked)


def report_writes(label: str, latencies: list[float], allowed: int, errors: int) -> str:
    return report(label, "writes", latencies, allowed, errors)


def worker_rss(server) -> float:
    """The largest worker's RSS in MiB (the workers are the server process's children)."""
    children = Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children").read_text().split()
    sizes = []
    for pid in children:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                sizes.append(int(line.split()[1]) / 1024)
    return max(sizes, default=0.0)


def live(work: Path, dra: bool, measure) -> tuple[float, float, object]:
    fake = subprocess.Popen(
        [sys.executable, __file__, "--serve-fake", "dra" if dra else "plain"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = fake.stdout.readline().strip()
        kubeconfig = write_kubeconfig(work / "kubeconfig", url, Cluster().token)
        started = time.monotonic()
        with live_server(
            work, "--kubeconfig", kubeconfig, "--config", str(work.parent / "config.yaml")
        ) as server:
            ready = time.monotonic() - started
            time.sleep(3.0)  # both workers listed everything
            rss = worker_rss(server)
            result = measure(server) if measure else None
        fake.stdin.write("\n")
        fake.stdin.flush()
        writes, _ = map(int, fake.stdout.readline().split())
        return ready, rss, (result, writes)
    finally:
        fake.stdin.close()
        fake.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve-fake", choices=["dra", "plain"])
    args = parser.parse_args()
    if args.serve_fake:
        serve_fake(args.serve_fake == "dra")
        return
    cluster = objects()
    # The fake server numbers objects as it loads them (nodes, slices, claims): the stored
    # claim's resourceVersion is what the API server puts in oldObject.
    first = Cluster().rv + len(cluster["nodes"]) + len(cluster["resourceslices"]) + 1
    versions = {n: str(first + n) for n in range(FIRST_FREE, FIRST_FREE + int(RATE * SECONDS))}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "config.yaml").write_text(
            "policies: {nodeAdmission: {reservations: {namespace: admit-guard}}}\n"
        )
        print(
            f"{NODES} nodes, {len(cluster['resourceslices'])} ResourceSlices, "
            f"{len(cluster['resourceclaims'])} claims; {RATE} allocation writes/s for {SECONDS:.0f} s"
        )
        for name in ("plain", "dra", "snap"):
            (work / name).mkdir()
        plain_ready, plain_rss, _ = live(work / "plain", False, None)
        dra_ready, dra_rss, (coordinated, writes) = live(
            work / "dra", True, lambda server: run(server, versions)
        )
        print(f"live guard ready: {plain_ready:.2f} s without DRA, {dra_ready:.2f} s with "
              f"(+{dra_ready - plain_ready:.2f} s; target <= 3 s); worker RSS {plain_rss:.0f} -> "
              f"{dra_rss:.0f} MiB (+{dra_rss - plain_rss:.0f} MiB)")  # fmt: skip
        snapshot = work / "snapshot.json"
        items = [*cluster["nodes"], *cluster["resourceslices"], *cluster["resourceclaims"]]
        snapshot.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
        with live_server(
            work / "snap", "--cluster", str(snapshot), "--config", str(work / "config.yaml")
        ) as server:
            time.sleep(1.0)
            alone = run(server, versions)
        print(report_writes("without coordination (snapshot)", *alone))
        print(report_writes("with coordination (Lease/pool)", *coordinated))
        print(f"API writes per allocation: {writes / len(coordinated[0]):.2f}")


if __name__ == "__main__":
    main()
