"""Replica memory benchmark (issue 31, item 3): one cluster state per replica.

A synthetic cluster (default 20,000 nodes / 600,000 pods, then ``--events`` pod updates the
watch replays) served by the test API server in a separate process on loopback; ``admit-guard
serve --kubeconfig`` with 1 and then 2 workers against it. Reported per run: time from the
start to ready (``/readyz`` answering 200: the Service routes reviews to the pod) and to every
worker listening (at start-up the fresh workers are forked one at a time), and the replica's
proportional memory (PSS: a shared page split among the processes that map it, so the sum
counts it once) over the master and its workers, at ready and once the watch events are
applied, with each process's private memory. A thread samples the replica's PSS every 0.1 s
from the start, and each run reports its peaks before ready (no review is routed to a pod
that is not ready), from ready until settled (the workers forked before the list renewed),
and over ``--watch`` (renewals and audit passes): the shipped limit must hold all three, the
last two with room for the request budget.
The sampler's reads cost CPU (~12 ms a read of a 700 MB process's ``smaps_rollup``): each run
says how much it took before ready, CPU the start-up did not have on a small machine.

Target: the replica's PSS with 2 workers <= 1.3x with 1. ``--root`` runs another checkout's
server (the design before, one informer per worker) against the same cluster: the
alternatives measured in one invocation. ``--audit-interval`` serves as ``deploy/base`` does,
with the periodic audit on (each pass reads every record).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.fake_apiserver import Cluster, write_kubeconfig  # noqa: E402
from tests.helpers.live_server import free_port, wait_listening, worker_pids  # noqa: E402
from webhook.certs import issue  # noqa: E402

MIB = 1 << 20


def serve_cluster(args) -> tuple[subprocess.Popen, str]:
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.fake_apiserver", "--nodes", str(args.nodes),
         "--pods", str(args.pods), "--events", str(args.events)],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    return server, server.stdout.readline().strip()


def rollup(pid: int) -> dict[str, int]:
    """``/proc/<pid>/smaps_rollup`` in bytes (Pss, Private_Clean, ...); {} once it is gone."""
    fields = {}
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            name, value, *_ = line.split()
            fields[name.rstrip(":")] = int(value) * 1024
    return fields


def replica_memory(master: int) -> tuple[int, list[tuple[int, int, int]]]:
    """The replica's PSS, and (pid, PSS, private) of the master then each worker."""
    rows = []
    for pid in [master, *worker_pids(master)]:
        fields = rollup(pid)
        rows.append(
            (pid, fields.get("Pss", 0), fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0))
        )
    return sum(pss for _, pss, _ in rows), rows


def ready(port: int, cert_dir: Path) -> bool:
    import http.client
    import ssl

    context = ssl.create_default_context(cafile=str(cert_dir / "ca.crt"))
    context.check_hostname = False
    try:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=2, context=context)
        conn.request("GET", "/readyz")
        return conn.getresponse().status == 200
    except OSError:
        return False


def cpu_seconds(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def settled(master: int, workers: int, quiet: float = 3.0, limit: float = 600.0) -> float:
    """Wait until the replica's processes stop using CPU (the watch backlog applied) and run
    ``workers`` workers (no renewal under way)."""
    started = time.monotonic()
    last, still_since = cpu_seconds([master, *worker_pids(master)]), time.monotonic()
    while time.monotonic() - started < limit:
        time.sleep(0.5)
        now = cpu_seconds([master, *worker_pids(master)])
        if now - last > 0.05 or len(worker_pids(master)) != workers:
            last, still_since = now, time.monotonic()
        elif time.monotonic() - still_since >= quiet:
            break
    return time.monotonic() - started


class Sampler:
    """The replica's PSS every ``every`` seconds on a thread of its own: (seconds since the
    start, bytes), so that a peak between two looks is seen."""

    def __init__(self, master: int, started: float, every: float = 0.1) -> None:
        self.samples: list[tuple[float, int]] = []
        self.cpu = 0.0  # this thread's CPU so far: reading a large process's smaps costs ~12 ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, args=(master, started, every), daemon=True)
        self._thread.start()

    def _sample(self, master: int, started: float, every: float) -> None:
        while not self._stop.wait(every):
            self.samples.append((time.monotonic() - started, replica_memory(master)[0]))
            self.cpu = time.thread_time()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def peak(self, start: float, end: float) -> int:
        return max((pss for at, pss in self.samples if start <= at < end), default=0)


def run(
    root: Path, workers: int, kubeconfig: str, workdir: Path, extra: tuple[str, ...] = (), watch: float = 0.0
) -> dict:
    """One server from start to settled; then, for ``watch`` seconds, the replica's PSS
    (renewals and audit passes included): its peak and its last. The PSS is sampled every
    0.1 s throughout (``Sampler``): the peaks before ready, and from ready until settled."""
    cert_dir = workdir / "certs"
    if not (cert_dir / "tls.crt").exists():
        issue("admit-guard", "admit-guard", cert_dir)
    port = free_port()
    log = (workdir / f"server-{workers}.log").open("wb")
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "webhook", "serve", "--bind", f"127.0.0.1:{port}", "--cert-dir",
         str(cert_dir), "--workers", str(workers), "--kubeconfig", kubeconfig, "--log-level", "info",
         *extra],
        cwd=root, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    sampler = Sampler(process.pid, started)
    try:
        while not ready(port, cert_dir):
            if process.poll() is not None or time.monotonic() - started > 600:
                raise SystemExit(f"the server did not become ready: see {workdir}/server-{workers}.log")
            time.sleep(0.1)
        ready_after = time.monotonic() - started
        sampled = sampler.cpu  # CPU the replica's start-up did not have, on a small machine
        at_ready, _ = replica_memory(process.pid)
        wait_listening(port, workers, timeout=120)
        listening_after = time.monotonic() - started
        settle = settled(process.pid, workers)
        after, rows = replica_memory(process.pid)
        settled_at = time.monotonic() - started
        time.sleep(watch)
        sampler.stop()
        renewals = sum(b"renewing worker" in line for line in (workdir / f"server-{workers}.log").open("rb"))
        return {
            "watched": (sampler.peak(settled_at, float("inf")), sampler.samples[-1][1]) if watch else None,
            "renewals": renewals,
            "workers": workers,
            "ready_s": ready_after,
            "sampler_cpu_s": sampled,
            "listening_s": listening_after,
            "pss_at_ready": at_ready,
            "peak_before_ready": sampler.peak(0.0, ready_after),
            "peak_until_settled": sampler.peak(ready_after, settled_at),
            "pss": after,
            "rows": rows,
            "settle_s": settle,
        }
    finally:
        sampler.stop()
        process.terminate()
        process.wait(timeout=60)
        log.close()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=20_000)
    parser.add_argument("--pods", type=int, default=600_000)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--workers", default="1,2", help="worker counts to run, in order")
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout whose server runs")
    parser.add_argument("--audit-interval", type=float, help="serve with the periodic audit on")
    parser.add_argument("--watch", type=float, default=0.0, help="then sample the PSS for this many seconds")
    args = parser.parse_args()
    extra = ("--audit-interval", str(args.audit_interval)) if args.audit_interval else ()
    server, url = serve_cluster(args)
    print(
        f"cluster: {args.nodes:,} nodes, {args.pods:,} pods, {args.events:,} watch events; server {args.root}"
        + (f"; periodic audit every {args.audit_interval:g} s" if extra else "")
    )
    results = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", url, Cluster().token)
            for workers in (int(w) for w in args.workers.split(",")):
                result = run(args.root, workers, kubeconfig, Path(tmp), extra, args.watch)
                results.append(result)
                rows = ", ".join(
                    f"{'master' if i == 0 else 'worker'} {pss / MIB:.0f}/{private / MIB:.0f}"
                    for i, (_, pss, private) in enumerate(result["rows"])
                )
                print(
                    f"{workers} worker(s): ready in {result['ready_s']:.1f} s (the PSS sampler used "
                    f"{result['sampler_cpu_s']:.1f} CPU s meanwhile), every worker listening in "
                    f"{result['listening_s']:.1f} s; replica PSS at ready "
                    f"{result['pss_at_ready'] / MIB:.0f} MiB, after the events {result['pss'] / MIB:.0f} MiB "
                    f"(settled {result['settle_s']:.0f} s later; PSS/private MiB: {rows}); peaks "
                    f"{result['peak_before_ready'] / MIB:.0f} MiB before ready, "
                    f"{result['peak_until_settled'] / MIB:.0f} from ready until settled"
                )
                if result["watched"]:
                    peak, last = result["watched"]
                    print(
                        f"  over the next {args.watch:.0f} s: peak {peak / MIB:.0f} MiB, "
                        f"last {last / MIB:.0f} MiB; {result['renewals']} worker renewals since the start"
                    )
    finally:
        server.stdin.close()
        server.wait(timeout=60)
    by_workers = {r["workers"]: r for r in results}
    if 1 in by_workers and 2 in by_workers:
        ratio = by_workers[2]["pss"] / by_workers[1]["pss"]
        print(f"replica PSS, 2 workers / 1 worker: {ratio:.2f} (target <= 1.3)")


if __name__ == "__main__":
    main()
