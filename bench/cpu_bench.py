"""CPU per pinned-Pod review (issue 31): the guard against a bare WSGI app on the same worker.

Both run under the guard's gunicorn settings (``GuardWorker``, 2 workers x 4 threads, TLS) on
loopback: the guard as ``admit-guard serve`` on the example cluster, answering the pinned-Pod
review (``good-pod-pinned-with-room``: the engine, the bind guard's reservation check, metrics,
the decision log); the bare app (``floor_bench.bare_app``) parsing the review and allowing it.
Each gets the same fixed load from ``floor_bench``'s unsynchronised ``h2load`` clients (500
req/s, 10 s); the CPU its processes (master and workers) used over the run, from /proc, divided
by the reviews answered, is its CPU per review: independent of how busy the shared machine
is, where latency and throughput are not. Each line also says how much of it the main threads
used (the workers' event loops; the master's is idle): the loop accepts, handshakes and reads
requests alike for both servers, so what differs is in the pool threads, where the app runs.
Runs alternate bare, guard (and, with ``--source DIR``, the guard of another version's tree,
for a before/after in one invocation) three times; medians.
Target: the guard's CPU per review <= 1.15x the bare app's.

Then each app alone, in a process of its own (no server, no TLS: ``app_cpu``): its CPU per
review called back to back, and called after ``IDLE`` seconds asleep each time, as a worker's
app is at 500 req/s over 2 workers. On this machine (a VM) memory touched after the core idled
costs several times what it costs warm (400 random dict lookups: 28 µs back to back, 653 µs
after 4 ms asleep; a loop over no memory: 96 µs either way), so the more memory an app's
review touches, the more of its CPU is that: the servers' difference lies between the apps'
two differences (28 Nov 2026: about 250 µs, against 120 back to back and 640 after idling).
The guard's decision alone (``guard_decision``: the engine and the bind guard's reservation,
nothing else) is measured the same way, as a share of the bare server's CPU per review: the
1.15x target leaves the guard 15% of it for everything it adds, this decision included.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
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

from floor_bench import REVIEW, h2load, started  # noqa: E402

from tests.helpers.live_server import worker_pids  # noqa: E402
from webhook.certs import issue  # noqa: E402

RUNS = 3
TICK = os.sysconf("SC_CLK_TCK")
IDLE = 0.004  # a worker's time between reviews at 500 req/s over 2 workers
CALLS = 2000


def _ticks(stat: Path) -> int:
    """User and system CPU ticks in a /proc ``stat`` file (0 when it is gone)."""
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])


def cpu_seconds(master: int) -> tuple[float, float]:
    """CPU so far of ``master`` and its workers (threads included), and of their main threads
    alone: in a worker that is the event loop, and the rest its pool threads (the app)."""
    total = main = 0
    for pid in (master, *worker_pids(master)):
        total += _ticks(Path(f"/proc/{pid}/stat"))
        main += _ticks(Path(f"/proc/{pid}/task/{pid}/stat"))
    return total / TICK, main / TICK


def measure(kind: str, work: Path, source: Path | None) -> tuple[float, float, float, int]:
    """µs of CPU per review (all, and the main threads': the event loops), p99 (ms) and
    failures, for one server under the fixed load."""
    with started(kind, work, source) as server:
        total, main = cpu_seconds(server.process.pid)
        p99, failed, answered = h2load(f"https://127.0.0.1:{server.port}/validate", REVIEW, work)
        after_total, after_main = cpu_seconds(server.process.pid)
    return (after_total - total) / answered * 1e6, (after_main - main) / answered * 1e6, p99, failed


def example_cluster():
    """The default config, the example cluster's origin and its snapshot, and a reservations
    directory, as ``admit-guard serve examples/cluster`` has them before the fork."""
    from webhook.cli.options import load_config, state_origin
    from webhook.serve import prefork

    config = load_config(None)
    origin = state_origin((str(ROOT / "examples" / "cluster"),), None, None)
    reservations = prefork.shared_directory("admit-guard-bench-")
    return config, origin, origin.snapshot(config.storm_breaker), reservations


def guard_app():
    """The guard's app on the example cluster, as ``admit-guard serve`` builds it in a worker
    (the bind guard's table, the multi-process metrics, the decision log to a thread)."""
    from webhook.serve import prefork
    from webhook.serve.app import DECISION_LOG
    from webhook.serve.decision_log import log_lines_in_background

    config, origin, state, reservations = example_cluster()
    prefork.metrics_directory()
    factory = prefork.worker_app(config, origin, state, reservations=reservations, max_body_bytes=3 << 20)
    log_lines_in_background(logging.getLogger(DECISION_LOG), open(os.devnull, "w"))  # noqa: SIM115
    return factory()


def guard_decision():
    """The guard's decision alone on the example cluster: the engine's verdict and the bind
    guard's reservation for the pinned Pod, on a review parsed once (no HTTP, parse, metrics or
    decision log): the work the guard exists to do, which no trimming of its glue removes."""
    from webhook.admission import VALIDATE
    from webhook.binding import BindGuard
    from webhook.coordination.reservations import node_table
    from webhook.pipeline import Pipeline, read_review
    from webhook.state.source import FixedState

    config, _, state, reservations = example_cluster()
    pipeline = Pipeline(config, FixedState(state), bind_guard=BindGuard(config, node_table(reservations)))
    routed = read_review(REVIEW.read_bytes())

    def call() -> None:
        outcome = pipeline.decide(routed, VALIDATE, verified=False, now=time.time())
        assert outcome.allowed and outcome.error is None, outcome.response

    return call


def app_cpu(kind: str) -> dict[str, float]:
    """µs of this thread's CPU per review by ``kind``'s app (or the guard's decision alone),
    back to back and after ``IDLE``."""
    call = guard_decision() if kind == "decision" else _wsgi_call(kind)
    for _ in range(200):
        call()
    result = {}
    for label, idle in (("back to back", 0.0), (f"after {IDLE * 1000:g} ms idle", IDLE)):
        spent = 0.0
        for _ in range(CALLS):
            if idle:
                time.sleep(idle)
            before = time.thread_time()
            call()
            spent += time.thread_time() - before
        result[label] = spent / CALLS * 1e6
    return result


def _wsgi_call(kind: str):
    """One review through ``kind``'s WSGI app, as a worker's thread calls it."""
    from floor_bench import bare_app

    app = guard_app() if kind == "guard" else bare_app()
    body = REVIEW.read_bytes()

    def call() -> None:
        environ = {
            "REQUEST_METHOD": "POST", "PATH_INFO": "/validate", "CONTENT_LENGTH": str(len(body)),
            "wsgi.input": io.BytesIO(body), "SERVER_NAME": "127.0.0.1", "SERVER_PORT": "8443",
            "SERVER_PROTOCOL": "HTTP/1.1", "wsgi.url_scheme": "https",
        }  # fmt: skip
        statuses: list[str] = []
        b"".join(app(environ, lambda status, headers, exc_info=None: statuses.append(status)))
        assert statuses == ["200 OK"], statuses

    return call


def apps_alone(bare_server: float) -> None:
    """Each app's CPU per review in a process of its own, the guard's against the bare's; then
    the guard's decision alone, as a share of the bare server's CPU per review (``bare_server``,
    its median): the 1.15x target leaves the guard 15% of that for everything it adds."""
    results = {}
    for kind in ("bare", "guard", "decision"):
        out = subprocess.run(
            [sys.executable, __file__, "--app", kind], capture_output=True, text=True, check=True
        ).stdout
        results[kind] = json.loads(out)
    for label, bare in results["bare"].items():
        guard, decision = results["guard"][label], results["decision"][label]
        print(f"the apps alone, {label}: guard {guard:.0f} µs CPU per review, bare {bare:.0f} "
              f"(guard - bare = {guard - bare:.0f} µs); the guard's decision alone (engine and "
              f"reservation) {decision:.0f} = {decision / bare_server:.0%} of the bare server's "
              f"{bare_server:.0f}")  # fmt: skip


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--source", type=Path, help="also measure the guard of this source tree")
    # apps_alone's child
    parser.add_argument("--app", choices=("bare", "guard", "decision"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.app:
        print(json.dumps(app_cpu(args.app)))
        return
    if shutil.which("h2load") is None:
        print("cpu_bench: h2load not installed (Debian: nghttp2-client; make bench-tools)")
        return
    kinds = {"bare": None, "guard": None}
    if args.source is not None:
        kinds["guard (--source)"] = args.source
    results: dict[str, list[tuple[float, float, float, int]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        issue("admit-guard", "admit-guard", work / "certs")
        for _ in range(RUNS):
            for label, source in kinds.items():
                result = measure(label.split()[0], work, source)
                results.setdefault(label, []).append(result)
                cpu, loop, p99, failed = result
                print(f"{label:16} {cpu:6.0f} µs CPU per review (event loops {loop:4.0f}, threads "
                      f"{cpu - loop:4.0f})  p99 {p99:6.2f} ms  errors {failed}", flush=True)  # fmt: skip
    bare_cpu = statistics.median(r[0] for r in results["bare"])
    bare_p99 = statistics.median(r[2] for r in results["bare"])
    for label in kinds:
        cpu = statistics.median(r[0] for r in results[label])
        threads = statistics.median(r[0] - r[1] for r in results[label])
        p99 = statistics.median(r[2] for r in results[label])
        print(f"median {label}: {cpu:.0f} µs CPU per review = {cpu / bare_cpu:.2f}x bare's "
              f"{bare_cpu:.0f} (target <= 1.15x), {threads:.0f} of it in threads other than the "
              f"event loops; p99 {p99:.2f} ms = {p99 / bare_p99:.2f}x bare's (target <= 1.2x)")  # fmt: skip
    apps_alone(bare_cpu)


if __name__ == "__main__":
    main()
