"""The serving stack's floor (issue 14): the guard against a minimal Flask app under the same
gunicorn settings (2 workers x 4 threads, the guard's worker class, TLS), in one run.

The minimal app parses the AdmissionReview and answers ``allowed``: what any webhook in this
stack costs. The guard answers its admission paths without Flask, so the same app as bare WSGI
is measured too, for information: the ratio to it is what the guard costs over gunicorn and TLS
alone. Each server runs in its own process on loopback, alternating floor, guard and bare
three times each (the machine is shared and noisy: medians); for each run, ``wrk`` measures
closed-loop throughput (32 connections, 10 s) and ``h2load`` latency at a fixed 500 req/s
(8 clients x 62.5 req/s, 10 s, HTTP/1.1 over TLS, per-request times from their logs). The 8
latency clients are 8 ``h2load`` processes started 2 ms apart, so their requests are spread
over each 16 ms period as independent callers' are: one ``h2load`` sends all its clients'
requests at the same instants, and its p99 was then the time to answer 8 at once (a measure of
the client). Each run says how its connections split over the server's workers (sampled from
/proc mid-run: ``tests/live_server.connections_by_worker``).

Then the guard's scaling (issue 31): five ``wrk`` runs against 2 workers, interleaved with five
against 1 worker (two servers up at once, measured in turn; new connections each run). Target:
every 2-worker run >= 1.5x the 1-worker median, and the 2-worker runs' min/max >= 0.7. With one
listening socket shared by the workers, 32 connections split 32/0 in 4 runs of 5.

``--source DIR`` runs the guard from another source tree (``git archive COMMIT | tar -x -C
DIR``): the same measurements for an older version, on the same machine. Both
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
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from tests.helpers.live_server import (  # noqa: E402
    LiveServer,
    _wait_ready,
    connections_by_worker,
    free_port,
    wait_listening,
    worker_pids,
)
from webhook.certs import issue  # noqa: E402

REVIEW = ROOT / "examples" / "admission" / "good-pod-pinned-with-room.json"
SECONDS = 10
LATENCY_CLIENTS = 8
CLIENT_RATE = 62.5  # requests/s per latency client: 500 together
SCALING_RUNS = 5


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


def server_command(kind: str, port: int, cert_dir: Path, workers: int = 2) -> list[str]:
    if kind in ("floor", "bare"):
        return [sys.executable, __file__, f"--serve-{kind}", str(port), str(cert_dir)]
    return [
        sys.executable, "-m", "webhook", "serve", "--cluster", str(ROOT / "examples" / "cluster"),
        "--cert-dir", str(cert_dir), "--bind", f"127.0.0.1:{port}", "--workers", str(workers),
        "--threads", "4",
    ]  # fmt: skip


class Split:
    """How a load generator's connections split over the server's workers: sampled once, a
    moment into the run (``connections_by_worker``), on a thread beside the generator."""

    def __init__(self, master: int, port: int, after: float = 2.0) -> None:
        self.counts: list[int] = []
        self._thread = threading.Thread(target=self._sample, args=(master, port, after), daemon=True)
        self._thread.start()

    def _sample(self, master: int, port: int, after: float) -> None:
        time.sleep(after)
        held = connections_by_worker(master, port)
        self.counts = sorted((len(clients) for clients in held.values()), reverse=True)

    def __str__(self) -> str:
        self._thread.join()
        return "/".join(map(str, self.counts)) or "?"


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
    """p99 (ms) at 500 req/s from ``LATENCY_CLIENTS`` unsynchronised clients, failures, and the
    requests answered. Each client is an ``h2load`` of its own (``-D`` and ``--rate``, which
    would stagger one process's connections, are exclusive), started one 500th of a second
    after the previous: together they send at an even 500 req/s."""
    logs = [work / f"h2load-{k}.log" for k in range(LATENCY_CLIENTS)]
    clients = []
    for k, log in enumerate(logs):
        log.unlink(missing_ok=True)  # h2load appends: each run's percentiles from its own requests
        if k:
            time.sleep(1 / (LATENCY_CLIENTS * CLIENT_RATE))
        clients.append(subprocess.Popen(
            ["h2load", "--h1", "-c1", f"--rps={CLIENT_RATE}", f"-D{SECONDS}", "-d", str(body),
             "-H", "Content-Type: application/json", f"--log-file={log}", url],
            stdout=subprocess.PIPE, text=True,
        ))  # fmt: skip
    failed = 0
    for client in clients:
        out, _ = client.communicate()
        if client.returncode:
            raise subprocess.CalledProcessError(client.returncode, client.args, out)
        failed += int(re.search(r"(\d+) failed", out)[1])
    lines = [line.split("\t") for log in logs for line in log.read_text().splitlines() if line.strip()]
    times = sorted(int(line[2]) / 1000 for line in lines)
    failed += sum(line[1] != "200" for line in lines)
    return times[int(len(times) * 0.99) - 1], failed, len(lines)


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


@contextmanager
def started(kind: str, work: Path, source: Path | None, workers: int = 2) -> Iterator[LiveServer]:
    """One server, up with every worker booted, idle and listening; stopped on exit. The guard
    runs from ``source`` when given (another version's tree)."""
    cert_dir = work / "certs"
    port = free_port()
    name = f"{kind}-{workers}w"
    log = (work / f"{name}.log").open("wb")
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    cwd = ROOT
    if source is not None and kind == "guard":
        # ``python -m`` puts the working directory ahead of PYTHONPATH: run from ``source``.
        env["PYTHONPATH"], cwd = str(source), source
    process = subprocess.Popen(
        server_command(kind, port, cert_dir, workers), stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd
    )
    server = LiveServer(port, cert_dir, process, work / f"{name}.log")
    try:
        _wait_ready(server)
        _wait_workers_idle(process.pid, workers)
        wait_listening(port, 1)  # a shared socket (older versions) counts once
        yield server
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def run(kind: str, work: Path, c_clients: bool, source: Path | None) -> tuple[float, float, int, str]:
    """One server's closed-loop throughput, p99 at 500 req/s, errors, and how the connections of
    both load generators split over its workers."""
    answered: int | None = None
    with started(kind, work, source) as server:
        if not c_clients:
            return (*python_client(server, REVIEW), "?")
        url = f"https://127.0.0.1:{server.port}/validate"
        split = Split(server.process.pid, server.port)
        rate, wrk_errors, answered = wrk(url, REVIEW, work)
        spread = Split(server.process.pid, server.port)
        p99, h2_errors, more = h2load(url, REVIEW, work)
        answered += more
        splits = f"wrk {split}, h2load {spread}"
    if kind == "guard":
        # Every answered review is logged: wrk counts only the answers it read before it
        # stopped, so a few more lines than answers (in flight at the end) are expected.
        lines = sum('"verdict"' in line for line in server.log.read_text().splitlines())
        lost = "" if lines >= answered else f", {answered - lines} LOST"
        print(f"guard: {lines} decision lines logged for {answered} answered reviews{lost}", flush=True)
    return rate, p99, wrk_errors + h2_errors, splits


def scaling(work: Path, source: Path | None) -> None:
    """Five ``wrk`` runs against 2 workers, each beside one against 1 worker (both servers up,
    measured in turn, new connections each run): every 2-worker run against the 1-worker median,
    and the 2-worker runs' spread."""
    one, two = [], []
    with started("guard", work, source, workers=1) as single, started("guard", work, source) as double:
        for _ in range(SCALING_RUNS):
            one.append(wrk(f"https://127.0.0.1:{single.port}/validate", REVIEW, work)[0])
            split = Split(double.process.pid, double.port)
            rate, errors, _ = wrk(f"https://127.0.0.1:{double.port}/validate", REVIEW, work)
            two.append(rate)
            print(f"scaling: 1 worker {one[-1]:6.0f} req/s, 2 workers {rate:6.0f} req/s "
                  f"(connections {split}, errors {errors})", flush=True)  # fmt: skip
    base = statistics.median(one)
    ratios = [rate / base for rate in two]
    spread = min(two) / max(two)
    verdict = "ok" if min(ratios) >= 1.5 and spread >= 0.7 else "MISSED"
    print(f"scaling: 2 workers / 1-worker median ({base:.0f} req/s): "
          f"{', '.join(f'{r:.2f}x' for r in ratios)} (target each >= 1.5x); "
          f"min/max {spread:.2f} (target >= 0.7): {verdict}", flush=True)  # fmt: skip


def _wait_workers_idle(master: int, workers: int, timeout: float = 20.0) -> None:
    """Until every worker has booted and gone idle: /readyz answers as soon as one worker is up,
    and the load generator's connections all land on a worker that is alone, which then
    serves at half the rate (one core) for the whole run."""
    deadline = time.monotonic() + timeout
    last: dict[int, int] = {}
    while time.monotonic() < deadline:
        busy = _cpu_ticks_of_children(master)
        if len(busy) >= workers and busy == last:
            return  # no worker used the CPU for a while: all booted
        last = busy
        time.sleep(0.3)
    print(f"floor_bench: workers of {master} not idle after {timeout} s; measuring anyway", flush=True)


def _cpu_ticks_of_children(parent: int) -> dict[int, int]:
    """utime + stime of each worker of ``parent``, from /proc."""
    ticks = {}
    for pid in worker_pids(parent):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        ticks[pid] = int(fields[11]) + int(fields[12])
    return ticks


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--serve-floor", nargs=2, metavar=("PORT", "CERT_DIR"))
    parser.add_argument("--serve-bare", nargs=2, metavar=("PORT", "CERT_DIR"))
    parser.add_argument("--source", type=Path, help="run the guard from this source tree")
    parser.add_argument("--scaling-only", action="store_true", help="only the 1- and 2-worker wrk runs")
    args = parser.parse_args()
    if args.serve_floor or args.serve_bare:
        port, cert_dir = args.serve_floor or args.serve_bare
        serve_floor(int(port), cert_dir, bare=bool(args.serve_bare))
        return
    missing = [tool for tool in ("wrk", "h2load") if shutil.which(tool) is None]
    if missing:
        print(f"floor_bench: {', '.join(missing)} not installed (Debian: wrk, nghttp2-client): "
              "measuring with the Python client instead, which shares the server's cores")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        issue("admit-guard", "admit-guard", work / "certs")
        if not args.scaling_only:
            compare(work, c_clients=not missing, source=args.source)
        if not missing:
            scaling(work, args.source)


def compare(work: Path, c_clients: bool, source: Path | None) -> None:
    """Floor, guard and bare, three runs each, interleaved; the medians against each other."""
    results: dict[str, list[tuple[float, float, int, str]]] = {"floor": [], "guard": [], "bare": []}
    for kind in ("floor", "guard", "bare") * 3:
        results[kind].append(run(kind, work, c_clients, source))
        rate, p99, errors, splits = results[kind][-1]
        print(f"{kind:6} {rate:8.0f} req/s  p99 {p99:6.2f} ms at 500 req/s  errors {errors}  "
              f"connections per worker: {splits}", flush=True)  # fmt: skip
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
          f"guard = {rates['guard'] / rates['bare']:.2f}x its throughput, "
          f"p99 {p99s['guard'] / p99s['bare']:.2f}x (target <= 1.2x)")  # fmt: skip


if __name__ == "__main__":
    main()
