"""End-to-end webhook benchmark: HTTPS with keep-alive against the real gunicorn server.

The server runs as ``admit-guard serve`` (2 gthread workers) on loopback with a synthetic
5,000-node / 150,000-pod snapshot. The load is open-loop: requests are scheduled at a fixed
rate and latency is measured from the scheduled send time, so a stalled server shows up as
latency instead of as a slower request rate. Then a closed loop measures the maximum
sustained throughput. Client and server share this machine's cores.
Target (issue 3): p99 < 5 ms at 500 req/s with zero errors.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers.builders import cluster_node, cluster_pod
from tests.helpers.live_server import live_server

CONNECTIONS = 8


def review(obj: dict, uid: int) -> bytes:
    kind = obj["kind"]
    group, version = ("apps", "v1") if kind == "Deployment" else ("", "v1")
    return orjson.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": f"bench-{uid}",
                "kind": {"group": group, "version": version, "kind": kind},
                "namespace": obj["metadata"]["namespace"],
                "name": obj["metadata"]["name"],
                "operation": "CREATE",
                "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
                "object": obj,
                "dryRun": False,
            },
        }
    )


def workloads(nodes: int) -> dict[str, bytes]:
    rng = random.Random(11)
    pod = cluster_pod(10**7, nodes, rng)
    pod.pop("status")
    pod["metadata"]["namespace"] = "team-1"
    template_spec = {k: v for k, v in pod["spec"].items() if k != "nodeName"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": "team-1"},
        "spec": {"replicas": 3, "template": {"metadata": {"labels": {"app": "web"}}, "spec": template_spec}},
    }
    return {"Pod with nodeName": review(pod, 1), "Deployment": review(deployment, 2)}


class Load:
    """Runs requests on ``CONNECTIONS`` keep-alive connections; records latency and errors."""

    def __init__(self, server, body: bytes) -> None:
        self.server, self.body = server, body
        self.latencies: list[float] = []
        self.errors = 0
        self._lock = threading.Lock()

    def open_loop(self, rate: float, seconds: float) -> None:
        start = time.perf_counter() + 0.2
        slots = iter(start + i / rate for i in range(int(rate * seconds)))
        self._run(lambda: next(slots, None))

    def closed_loop(self, seconds: float) -> float:
        end = time.perf_counter() + seconds
        self._run(lambda: time.perf_counter() if time.perf_counter() < end else None)
        return len(self.latencies) / seconds

    def _run(self, next_slot) -> None:
        threads = [threading.Thread(target=self._connection, args=(next_slot,)) for _ in range(CONNECTIONS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def _connection(self, next_slot) -> None:
        conn = self.server.connect()
        headers = {"Content-Type": "application/json"}
        while True:
            with self._lock:
                slot = next_slot()
            if slot is None:
                break
            delay = slot - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            try:
                conn.request("POST", "/validate", body=self.body, headers=headers)
                reply = conn.getresponse()
                ok = reply.status == 200 and json.loads(reply.read())["response"]["uid"].startswith("bench-")
            except OSError:
                ok = False
                conn.close()
                conn = self.server.connect()
            elapsed = time.perf_counter() - slot
            with self._lock:
                self.latencies.append(elapsed)
                self.errors += not ok
        conn.close()


def quantile(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=1000)[int(q * 1000) - 1] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--rates", default="200,500,1000")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        rng = random.Random(1)
        items = [cluster_node(i) for i in range(args.nodes)] + [
            cluster_pod(i, args.nodes, rng) for i in range(args.pods)
        ]
        (workdir / "cluster.json").write_bytes(
            orjson.dumps({"apiVersion": "v1", "kind": "List", "items": items})
        )
        del items
        started = time.perf_counter()
        with live_server(
            workdir, "--cluster", str(workdir / "cluster.json"), workers=args.workers, threads=args.threads
        ) as server:
            print(
                f"server ready in {time.perf_counter() - started:.1f} s "
                f"({args.nodes} nodes, {args.pods} pods); target: p99 < 5 ms at 500 req/s, zero errors"
            )
            for name, body in workloads(args.nodes).items():
                Load(server, body).open_loop(200, 2)  # warm up both workers
                for rate in (float(r) for r in args.rates.split(",")):
                    load = Load(server, body)
                    load.open_loop(rate, args.seconds)
                    print(
                        f"{name:18s} {rate:6.0f} req/s x {args.seconds:.0f} s: "
                        f"p50 {quantile(load.latencies, 0.5):6.2f} ms  "
                        f"p99 {quantile(load.latencies, 0.99):6.2f} ms  "
                        f"errors {load.errors}/{len(load.latencies)}"
                    )
                load = Load(server, body)
                throughput = load.closed_loop(args.seconds / 2)
                print(
                    f"{name:18s} max sustained: {throughput:6.0f} req/s on {CONNECTIONS} connections, "
                    f"p50 {quantile(load.latencies, 0.5):.2f} ms, errors {load.errors}"
                )


if __name__ == "__main__":
    main()
