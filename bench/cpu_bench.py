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
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from floor_bench import REVIEW, h2load, started  # noqa: E402

from tests.helpers.live_server import worker_pids  # noqa: E402
from webhook.certs import issue  # noqa: E402

RUNS = 3
TICK = os.sysconf("SC_CLK_TCK")


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


def main() -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=formatter)
    parser.add_argument("--source", type=Path, help="also measure the guard of this source tree")
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
