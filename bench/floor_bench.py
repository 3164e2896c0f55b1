"""The serving stack's floor (issue 14): the guard against a minimal Flask app under the same
gunicorn settings (2 workers x 4 threads, the guard's worker class, TLS), in one run.

The minimal app parses the AdmissionReview and answers ``allowed``: what any webhook in this
stack costs. The guard answers its admission paths without Flask, so the same app as bare WSGI
is measured too, for information: the ratio to it is what the guard costs over gunicorn and TLS
alone. Each server runs in its own process on loopback, alternating floor, guard and bare
three times each (the machine is shared and noisy: medians); for each run, ``wrk`` measures
closed-loop throughput (32 connections, 10 s: with a few, the accept race between the two
workers decides the result, 1,700 or 5,000 req/s run to run) and ``h2load`` latency at a fixed 500 req/s
(8 connections x 62.5 req/s, 10 s, HTTP/1.1 over TLS, per-request times from its log). Both
are C load generators (Debian packages ``wrk`` and ``nghttp2-client``), so the client does not
eat the Python server's cores; without them it says so and falls back to the Python client of
``http_bench.py`` (8 keep-alive connections; the client then shares the server's cores, so the
ratios are rougher). The guard runs as ``admit-guard serve`` itself, with its decision log
(stderr, to a file here) and its multi-process metrics, as in a cluster; after each guard run the
lines logged are counted against the reviews the load generators saw answered. Review: a Pod with
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
import time
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


def bare_app():
    """The same webhook as plain WSGI, without Flask: what the gunicorn/TLS stack alone costs."""
    import orjson

    def app(environ, start_response):
        if environ["PATH_INFO"] != "/validate":
            start_response("200 OK", [("Content-Type", "application/json")])
            return [b'{"ready": true}']
        review = orjson.loads(environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0)))
        body = orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                             "response": {"uid": review["request"]["uid"], "allowed": True}})  # fmt: skip
        start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    return app


def serve_floor(port: int, cert_dir: str, bare: bool) -> None:
    """Child process: the floor (or the bare one), with the guard's gunicorn settings."""
    from webhook.serve.gunicorn import GuardServer, ServeOptions

    options = ServeOptions(bind=f"127.0.0.1:{port}", cert_dir=Path(cert_dir), workers=2, threads=4)
    GuardServer(bare_app if bare else floor_app, options).run()


def server_command(kind: str, port: int, cert_dir: Path) -> list[str]:
    if kind in ("floor", "bare"):
        return [sys.executable, __file__, f"--serve-{kind}", str(port), str(cert_dir)]
    return [
        sys.executable, "-m", "webhook", "serve", "--cluster", str(ROOT / "examples" / "cluster"),
        "--cert-dir", str(cert_dir), "--bind", f"127.0.0.1:{port}", "--workers", "2", "--threads", "4",
    ]  # fmt: skip


def wrk(url: str, body: Path, work: Path) -> tuple[float, int, int]:
    """Closed-loop requests/s, failures, and the requests answered."""
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
    return rate, failed, int(re.search(r"(\d+) requests in", out)[1])


def h2load(url: str, body: Path, work: Path) -> tuple[float, int, int]:
    """p99 (ms) at 500 req/s, failures, and the requests answered."""
    log = work / "h2load.log"
    log.unlink(missing_ok=True)  # h2load appends: each run's percentiles from its own requests
    out = subprocess.run(
        ["h2load", "--h1", "-c8", "--rps=62.5", f"-D{SECONDS}", "-d", str(body),
         "-H", "Content-Type: application/json", f"--log-file={log}", url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    times = sorted(int(line.split("\t")[2]) / 1000 for line in log.read_text().splitlines() if line.strip())
    statuses = [line.split("\t")[1] for line in log.read_text().splitlines() if line.strip()]
    failed = sum(s != "200" for s in statuses) + int(re.search(r"(\d+) failed", out)[1])
    return times[int(len(times) * 0.99) - 1], failed, len(statuses)


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
    answered: int | None = None
    try:
        _wait_ready(server)
        _wait_workers_idle(process.pid, 2)
        if not c_clients:
            return python_client(server, REVIEW)
        url = f"https://127.0.0.1:{port}/validate"
        rate, wrk_errors, answered = wrk(url, REVIEW, work)
        p99, h2_errors, more = h2load(url, REVIEW, work)
        answered += more
        return rate, p99, wrk_errors + h2_errors
    finally:
        process.terminate()
        process.wait(30)
        log.close()
        if kind == "guard":
            # Every answered review is logged: wrk counts only the answers it read before it
            # stopped, so a few more lines than answers (in flight at the end) are expected.
            lines = sum('"verdict"' in line for line in (work / "guard.log").read_text().splitlines())
            of = "" if answered is None else f" for {answered} answered reviews"
            lost = "" if answered is None or lines >= answered else f", {answered - lines} LOST"
            print(f"guard: {lines} decision lines logged{of}{lost}", flush=True)


def _wait_workers_idle(master: int, workers: int, timeout: float = 20.0) -> None:
    """Until every worker has booted and gone idle: /readyz answers as soon as one worker is up,
    and the load generator's connections all land on a worker that is alone, which then
    serves at half the rate (one core) for the whole run."""
    deadline = time.monotonic() + timeout
    last: dict[str, int] = {}
    while time.monotonic() < deadline:
        busy = _cpu_ticks_of_children(master)
        if len(busy) >= workers and busy == last:
            return  # no worker used the CPU for a while: all booted
        last = busy
        time.sleep(0.3)
    print(f"floor_bench: workers of {master} not idle after {timeout} s; measuring anyway", flush=True)


def _cpu_ticks_of_children(parent: int) -> dict[str, int]:
    """utime + stime of each child process of ``parent``, from /proc."""
    ticks = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[1]) == parent:
            ticks[stat.parent.name] = int(fields[11]) + int(fields[12])
    return ticks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve-floor", nargs=2, metavar=("PORT", "CERT_DIR"))
    parser.add_argument("--serve-bare", nargs=2, metavar=("PORT", "CERT_DIR"))
    args = parser.parse_args()
    if args.serve_floor or args.serve_bare:
        port, cert_dir = args.serve_floor or args.serve_bare
        serve_floor(int(port), cert_dir, bare=bool(args.serve_bare))
        return
    missing = [tool for tool in ("wrk", "h2load") if shutil.which(tool) is None]
    if missing:
        print(f"floor_bench: {', '.join(missing)} not installed (Debian: wrk, nghttp2-client): "
              "measuring with the Python client instead, which shares the server's cores")  # fmt: skip
    results: dict[str, list[tuple[float, float, int]]] = {"floor": [], "guard": [], "bare": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        issue("admit-guard", "admit-guard", work / "certs")
        for kind in ("floor", "guard", "bare") * 3:
            results[kind].append(run(kind, work, c_clients=not missing))
            rate, p99, errors = results[kind][-1]
            print(f"{kind:6} {rate:8.0f} req/s  p99 {p99:6.2f} ms at 500 req/s  errors {errors}", flush=True)
    rates = {k: statistics.median(r[0] for r in v) for k, v in results.items()}
    p99s = {k: statistics.median(r[1] for r in v) for k, v in results.items()}
    errors = sum(r[2] for kind in ("floor", "guard") for r in results[kind])
    print(f"median throughput: floor {rates['floor']:.0f}, guard {rates['guard']:.0f} req/s "
          f"= {rates['guard'] / rates['floor']:.2f}x (target >= 0.80x)")  # fmt: skip
    print(f"median p99 at 500 req/s: floor {p99s['floor']:.2f}, guard {p99s['guard']:.2f} ms "
          f"= {p99s['guard'] / p99s['floor']:.2f}x (target <= 1.5x); errors {errors}")  # fmt: skip
    # The guard answers /validate and /mutate without Flask (webhook/serve/wsgi.py); the floor is
    # the issue's minimal Flask app. Against the stack without Flask, for the record:
    print(f"for information: bare WSGI floor {rates['bare']:.0f} req/s, p99 {p99s['bare']:.2f} ms, "
          f"errors {sum(r[2] for r in results['bare'])}; "
          f"guard = {rates['guard'] / rates['bare']:.2f}x its throughput")  # fmt: skip


if __name__ == "__main__":
    main()
