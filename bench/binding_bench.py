"""Binding benchmark (issue 10): bind reviews at a large scheduler's rate, with and without
coordination through the API server.

A fake API server (its own process) serves 1,000 nodes (8 GPUs each) and pending pods, and
Leases with resourceVersion conflicts. One guard (``admit-guard serve --kubeconfig``, 2 workers)
answers ``pods/binding`` reviews sent open-loop at 300 binds/s for 20 s on 8 keep-alive
connections (latency from the scheduled send time): first pods that request only cpu (a
reservation in the replica's local table, no API write), then pods that request a GPU (a
Lease read and replace per bind). Reports p50/p99 and API writes per bind.
Targets: p99 < 5 ms without coordination, < 15 ms with it, on loopback.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from open_loop import report, send  # noqa: E402

from tests.helpers.builders import container, node, pod  # noqa: E402
from tests.helpers.fake_apiserver import Cluster, FakeApiServer, write_kubeconfig  # noqa: E402
from tests.helpers.live_server import live_server  # noqa: E402

NODES, GPUS, RATE, CONNECTIONS = 1000, 8, 300, 8
SECONDS = float(os.environ.get("BIND_BENCH_SECONDS", "20"))


def _node(i: int) -> dict:
    return node(f"node-{i}", cpu="1000", memory="4Ti", pods="5000", extra={"nvidia.com/gpu": str(GPUS)})


def _pod(name: str, requests: dict) -> dict:
    return pod(name, namespace="batch", scheduler="volcano", containers=[container("c", requests=requests)])


def serve_fake(count: int) -> None:
    """Child process: the fake API server; prints its URL, then on stdin EOF the Lease writes."""
    cluster = Cluster(bookmark_every=5.0)
    cluster.load("nodes", (_node(i) for i in range(NODES)))
    pods = [_pod(f"cpu-{i}", {"cpu": "100m"}) for i in range(count)]
    pods += [_pod(f"gpu-{i}", {"cpu": "100m", "nvidia.com/gpu": "1"}) for i in range(count)]
    cluster.load("pods", pods)
    server = FakeApiServer(cluster)
    print(server.url, flush=True)
    sys.stdin.readline()
    print(cluster.lease_writes, cluster.lease_conflicts, flush=True)
    sys.stdin.read()
    server.close()


def review(name: str, node: str, n: int) -> dict:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": f"b-{n}",
            "kind": {"group": "", "version": "v1", "kind": "Binding"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "binding",
            "namespace": "batch",
            "name": name,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:volcano-system:volcano"},
            "object": {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "namespace": "batch", "uid": f"uid-{name}"},
                "target": {"kind": "Node", "name": node},
            },
        },
    }


def run(server, prefix: str) -> tuple[list[float], int, int]:
    """Open loop: bind ``prefix-i`` to node ``i % NODES`` at RATE/s; (latencies, allowed, errors)."""
    return send(
        server,
        int(RATE * SECONDS),
        RATE,
        CONNECTIONS,
        lambda i: review(f"{prefix}-{i}", f"node-{i % NODES}", i),
    )


def _report(label: str, latencies: list[float], allowed: int, errors: int) -> str:
    return report(label, "binds", latencies, allowed, errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve-fake", type=int, metavar="PODS")
    args = parser.parse_args()
    if args.serve_fake:
        serve_fake(args.serve_fake)
        return
    count = int(RATE * SECONDS)
    fake = subprocess.Popen(
        [sys.executable, __file__, "--serve-fake", str(count)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = fake.stdout.readline().strip()
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            kubeconfig = write_kubeconfig(work / "kubeconfig", url, Cluster().token)
            (work / "config.yaml").write_text(
                "policies: {nodeAdmission: {reservations: {namespace: admit-guard}}}\n"
            )
            with live_server(
                work, "--kubeconfig", kubeconfig, "--config", str(work / "config.yaml")
            ) as server:
                time.sleep(2.0)  # both workers listed the pods
                print(f"{NODES} nodes, {2 * count} pending pods; {RATE} binds/s for {SECONDS:.0f} s "
                      "(targets: p99 < 5 ms without coordination, < 15 ms with it)")  # fmt: skip
                print(_report("without coordination (cpu)", *run(server, "cpu")), flush=True)
                gpu = run(server, "gpu")
        fake.stdin.write("\n")
        fake.stdin.flush()
        writes, conflicts = map(int, fake.stdout.readline().split())
        print(_report("with coordination (GPU)", *gpu))
        print(f"API writes per coordinated bind: {writes / len(gpu[0]):.2f} ({conflicts} conflicts)")
    finally:
        fake.stdin.close()
        fake.wait(timeout=30)


if __name__ == "__main__":
    main()
