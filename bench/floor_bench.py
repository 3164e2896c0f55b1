"""The serving stack's floor (issue 14): the guard against a minimal Flask app under the same
gunicorn settings (2 workers x 4 threads, the guard's worker class, TLS), in one run.

The minimal app parses the AdmissionReview and answers ``allowed``: what any webhook in this
stack costs. Each server runs in its own process on loopback, alternating floor and guard three
times each (the machine is shared and noisy: medians); for each run, ``wrk`` measures
closed-loop throughput (32 connections, 10 s: with a few, the accept race between the two
workers decides the result, 1,700 or 5,000 req/s run to run) and ``h2load`` latency at a fixed 500 req/s
(8 connections x 62.5 req/s, 10 s, HTTP/1.1 over TLS, per-request times from its log). Both
are C load generators (Debian packages ``wrk`` and ``nghttp2-client``), so the client does not
eat the Python server's cores; without them it says so and falls back to the Python client of
``http_bench.py`` (8 keep-alive connections; the client then shares the server's cores, so the
ratios are rougher). The guard runs as ``admit-guard serve`` itself, with its decision log
(stderr, to a file here) and its multi-process metrics, as in a cluster. Review: a Pod with
``nodeName`` on the example cluster.
Targets: guard throughput >= 0.80x the floor's; p99 at 500 req/s <= 1.5x the floor's; zero errors.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tests.live_server import LiveServer, _wait_ready, free_port  # noqa: E402
from webhook.certs import issue  # noqa: E402

REVIEW = ROOT / "examples" / "admission" / "good-pod-pinned-with-room.json"
SECONDS = 10


def floor_app():
    """The minimal webhook: parse the review, allow it."""
    import orjson
    from flask import Flask, Response, request

    app = Flask("floor")

    @app.post("/validate")
    def validate() -> Response:
        review = orjson.loads(request.get_data())
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "response": {"uid": review["request"]["uid"], "allowed": True}}  # fmt: skip
        return Response(orjson.dumps(body), mimetype="application/json")

    @app.get("/readyz")
    def readyz() -> Response:
        return Response(b'{"ready": true}', mimetype="application/json")

    return app


def serve_floor(port: int, cert_dir: str) -> None:
    """Child process: the floor, with the guard's gunicorn settings."""
    from webhook.serving import GuardServer, ServeOptions

    GuardServer(
        floor_app, ServeOptions(bind=f"127.0.0.1:{port}", cert_dir=Path(cert_dir), workers=2, threads=4)
    ).run()


def server_command(kind: str, port: int, cert_dir: Path) -> list[str]:
    if kind == "floor":
        return [sys.executable, __file__, "--serve-floor", str(port), str(cert_dir)]
    return [
        sys.executable, "-m", "webhook", "serve", "--cluster", str(ROOT / "examples" / "cluster"),
        "--cert-dir", str(cert_dir), "--bind", f"127.0.0.1:{port}", "--workers", "2", "--threads", "4",
    ]  # fmt: skip


def wrk(url: str, body: Path, work: Path) -> tuple[float, int]:
    script = work / "post.lua"
    script.write_text(
        'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
        f"wrk.body = {json.dumps(body.read_text())}\n"
    )
    command = ["wrk", "-t1", "-c32", f"-d{SECONDS}s", "-s", str(script), url]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    rate = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    socket_errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    failed = int(errors[1]) if errors else 0
    failed += sum(map(int, socket_errors.groups())) if socket_errors else 0
    return rate, failed


def h2load(url: str, body: Path, work: Path) -> tuple[float, int]:
    log = work / "h2load.log"
    out = subprocess.run(
        ["h2load", "--h1", "-c8", "--rps=62.5", f"-D{SECONDS}", "-d", str(body),
         "-H", "Content-Type: application/json", f"--log-file={log}", url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    times = sorted(int(line.split("\t")[2]) / 1000 for line in log.read_text().splitlines() if line.strip())
    statuses = [line.split("\t")[1] for line in log.read_text().splitlines() if line.strip()]
    failed = sum(s != "200" for s in statuses) + int(re.search(r"(\d+) failed", out)[1])
    return times[int(len(times) * 0.99) - 1], failed


def python_client(server: LiveServer, body: Path) -> tuple[float, float, int]:
    """The fallback: closed-loop throughput, then p99 at 500 req/s, with http_bench's client."""
    from http_bench import Load, quantile

    review = json.loads(body.read_text())
    review["request"]["uid"] = "bench-floor"
    data = json.dumps(review).encode()
    closed = Load(server, data)
    rate = closed.closed_loop(SECONDS)
    fixed = Load(server, data)
    fixed.open_loop(500, SECONDS)
    return rate, quantile(fixed.latencies, 0.99), closed.errors + fixed.errors


def run(kind: str, work: Path, c_clients: bool) -> tuple[float, float, int]:
    cert_dir = work / "certs"
    port = free_port()
    log = (work / f"{kind}.log").open("wb")
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    process = subprocess.Popen(
        server_command(kind, port, cert_dir), stdout=log, stderr=subprocess.STDOUT, env=env
    )
    server = LiveServer(port, cert_dir, process, work / f"{kind}.log")
    try:
        _wait_ready(server)
        if not c_clients:
            return python_client(server, REVIEW)
        url = f"https://127.0.0.1:{port}/validate"
        rate, wrk_errors = wrk(url, REVIEW, work)
        p99, h2_errors = h2load(url, REVIEW, work)
        return rate, p99, wrk_errors + h2_errors
    finally:
        process.terminate()
        process.wait(30)
        log.close()
        if kind == "guard":
            lines = sum('"verdict"' in line for line in (work / "guard.log").read_text().splitlines())
            print(f"guard: {lines} decision lines logged", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve-floor", nargs=2, metavar=("PORT", "CERT_DIR"))
    args = parser.parse_args()
    if args.serve_floor:
        serve_floor(int(args.serve_floor[0]), args.serve_floor[1])
        return
    missing = [tool for tool in ("wrk", "h2load") if shutil.which(tool) is None]
    if missing:
        print(f"floor_bench: {', '.join(missing)} not installed (Debian: wrk, nghttp2-client): "
              "measuring with the Python client instead, which shares the server's cores")  # fmt: skip
    results: dict[str, list[tuple[float, float, int]]] = {"floor": [], "guard": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        issue("admit-guard", "admit-guard", work / "certs")
        for kind in ("floor", "guard") * 3:
            results[kind].append(run(kind, work, c_clients=not missing))
            rate, p99, errors = results[kind][-1]
            print(f"{kind:6} {rate:8.0f} req/s  p99 {p99:6.2f} ms at 500 req/s  errors {errors}", flush=True)
    rates = {k: statistics.median(r[0] for r in v) for k, v in results.items()}
    p99s = {k: statistics.median(r[1] for r in v) for k, v in results.items()}
    errors = sum(r[2] for v in results.values() for r in v)
    print(f"median throughput: floor {rates['floor']:.0f}, guard {rates['guard']:.0f} req/s "
          f"= {rates['guard'] / rates['floor']:.2f}x (target >= 0.80x)")  # fmt: skip
    print(f"median p99 at 500 req/s: floor {p99s['floor']:.2f}, guard {p99s['guard']:.2f} ms "
          f"= {p99s['guard'] / p99s['floor']:.2f}x (target <= 1.5x); errors {errors}")  # fmt: skip


if __name__ == "__main__":
    main()
