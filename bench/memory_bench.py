"""Memory benchmark (issue 21, item 7; issue 30): 400 max-size bodies against a 1 GiB limit,
sent slowly and sent at once.

A server as the Deployment runs it (2 workers x 4 threads, TLS, the example cluster) on
loopback, in a memory cgroup limited to 1 GiB when the bench can make one (root, cgroup v1 or
v2, and not ``--no-cgroup``), so the default ``--max-buffered-bytes`` is sized from that limit
as in a pod (a quarter of it across the workers: 128 MiB each); elsewhere the same value is
passed explicitly and the limit is only measured against. 400 connections each send a valid
AdmissionReview padded to the 3 MiB body limit, in two cases, each against a fresh server:

- slow: in 64 KiB pieces over about 5 s (inside the 10 s request timeout). Before the cap,
  every worker buffered every body it was sent and one was OOM-killed inside 1 GiB.
- fast: TLS up first, then the whole request in one write, all 400 together. Before the budget
  counted a request until its answer was out (parsed copies included), a body handed to a
  thread left the budget: 399 answered 200, no 503, a worker at 678 MiB and OOM-killed (as
  reported in issue 30).

Reported per case: peak RSS per worker and of all workers together (sampled every 20 ms), how
many bodies were answered 200, 503 (with Retry-After) or otherwise, and worker restarts.
Target: the workers together stay under 1 GiB, no worker restarts.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.live_server import LiveServer, _wait_ready, free_port  # noqa: E402
from webhook.certs import issue  # noqa: E402
from webhook.serve.limits import default_buffered_bytes  # noqa: E402

EXAMPLES = ROOT / "examples"
CONNECTIONS, MAX_BODY, LIMIT, WORKERS = 400, 3 * 1024 * 1024, 1 << 30, 2
PIECE, PIECE_INTERVAL = 64 * 1024, 0.1  # 48 pieces: about 5 s a body
CGROUP_V1, CGROUP_V2 = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/unified")


def padded_review() -> bytes:
    """A valid review of exactly the body limit: a Deployment with a large annotation."""
    review = json.loads((EXAMPLES / "admission" / "good-deployment.json").read_text())
    review["request"]["object"]["metadata"]["annotations"] = {"pad": ""}
    size = len(json.dumps(review).encode())
    review["request"]["object"]["metadata"]["annotations"]["pad"] = "x" * (MAX_BODY - size)
    body = json.dumps(review).encode()
    assert len(body) == MAX_BODY
    return body


class MemoryCgroup:
    """A memory cgroup limited to ``limit`` bytes, for the server and its workers (removed after)."""

    def __init__(self, limit: int | None) -> None:
        self.path: Path | None = None
        if limit is None:
            return  # not asked for: the limit is measured against only
        name = f"admit-guard-bench-{os.getpid()}"
        for base, limit_file in ((CGROUP_V2, "memory.max"), (CGROUP_V1, "memory.limit_in_bytes")):
            if not (base / limit_file).exists() and not (base / "cgroup.procs").exists():
                continue
            try:
                (base / name).mkdir()
                (base / name / limit_file).write_text(str(limit))
                self.path = base / name
                return
            except OSError:
                with contextlib.suppress(OSError):
                    (base / name).rmdir()

    def peak(self) -> int:
        if self.path is None:
            return 0
        for name in ("memory.peak", "memory.max_usage_in_bytes"):
            with contextlib.suppress(OSError):
                return int((self.path / name).read_text())
        return 0

    def oom_kills(self) -> int:
        for name in ("memory.events", "memory.oom_control"):
            with contextlib.suppress(OSError):
                for line in (self.path / name).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        return 0

    def remove(self) -> None:
        if self.path is not None:
            for _ in range(50):
                try:
                    self.path.rmdir()
                    return
                except OSError:
                    time.sleep(0.1)


def worker_pids(server: LiveServer) -> list[int]:
    """The server's workers, once all have started (the server answers as soon as one has)."""
    pid, deadline = server.process.pid, time.monotonic() + 10
    while True:
        pids = sorted(int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
        if len(pids) >= WORKERS or time.monotonic() > deadline:
            return pids
        time.sleep(0.05)


def rss(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def send_slowly(
    server: LiveServer, body: bytes, start: threading.Barrier, outcomes: collections.Counter
) -> None:
    try:
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        conn = server.tls_context().wrap_socket(raw, server_hostname="localhost")
        head = (
            "POST /validate HTTP/1.1\r\nHost: guard\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        start.wait()
        conn.sendall(head.encode())
        for at in range(0, len(body), PIECE):
            conn.sendall(body[at : at + PIECE])
            time.sleep(PIECE_INTERVAL)
        outcomes[status_of(conn)] += 1
    except OSError as err:
        outcomes[type(err).__name__] += 1


def send_at_once(
    server: LiveServer, body: bytes, start: threading.Barrier, outcomes: collections.Counter
) -> None:
    """A fast sender: the handshake first, then head and body in one write with all the others."""
    try:
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        conn = server.tls_context().wrap_socket(raw, server_hostname="localhost")
        head = (
            "POST /validate HTTP/1.1\r\nHost: guard\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        start.wait()
        conn.sendall(head.encode() + body)
        outcomes[status_of(conn)] += 1
    except (OSError, threading.BrokenBarrierError) as err:
        outcomes[type(err).__name__] += 1


def status_of(conn) -> str:
    """The status of the answer on ``conn`` ("503 without Retry-After" when it lacks one)."""
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = conn.recv(65536)
        if not chunk:
            break
        reply += chunk
    status = reply.split(b" ", 2)[1].decode() if reply.startswith(b"HTTP/1.1 ") else "no answer"
    if status == "503" and b"\r\nRetry-After: " not in reply:
        status = "503 without Retry-After"
    return status


def serve_in(cgroup: str, args: list[str]) -> None:
    """Child process: join the cgroup, then become the server (its workers inherit the cgroup)."""
    (Path(cgroup) / "cgroup.procs").write_text(str(os.getpid()))
    os.execv(sys.executable, [sys.executable, "-m", "webhook", "serve", *args])


@contextlib.contextmanager
def start_server(workdir: Path, cgroup: MemoryCgroup, args: list[str]):
    cert_dir = workdir / "certs"
    issue("admit-guard", "admit-guard", cert_dir)
    port = free_port()
    args = [*args, "--bind", f"127.0.0.1:{port}", "--cert-dir", str(cert_dir), "--workers", str(WORKERS),
            "--threads", "4", "--log-level", "warning"]  # fmt: skip
    if cgroup.path is not None:
        command = [sys.executable, __file__, "--serve-in", str(cgroup.path), *args]
    else:
        command = [sys.executable, "-m", "webhook", "serve", *args]
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    log = (workdir / "server.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
    server = LiveServer(port, cert_dir, process, workdir / "server.log")
    try:
        _wait_ready(server)
        yield server
    finally:
        process.terminate()
        process.wait(30)
        log.close()


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve-in":
        serve_in(sys.argv[2], sys.argv[3:])
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(max(soft, 4096), hard), hard))
    body = padded_review()
    for case, sender in (("slow", send_slowly), ("fast", send_at_once)):
        run_case(case, sender, body, enforce="--no-cgroup" not in sys.argv[1:])


def run_case(case: str, sender, body: bytes, *, enforce: bool) -> None:
    """One case against a fresh server (in a fresh cgroup when ``enforce`` and one can be made)."""
    cgroup = MemoryCgroup(LIMIT if enforce else None)
    budget = default_buffered_bytes(WORKERS, MAX_BODY, LIMIT)
    args = ["--cluster", str(EXAMPLES / "cluster")]
    if cgroup.path is None:
        args += ["--max-buffered-bytes", str(budget)]  # what the default would be under the limit
        print("no memory cgroup: the 1 GiB limit is measured against, not enforced")
    print(f"{case}: {CONNECTIONS} connections x {MAX_BODY >> 20} MiB bodies; {WORKERS} workers in "
          f"{LIMIT >> 20} MiB; --max-buffered-bytes {budget >> 20} MiB per worker (the default "
          "under that limit); target: no restart, workers < 1 GiB")  # fmt: skip
    outcomes: collections.Counter = collections.Counter()
    try:
        with tempfile.TemporaryDirectory() as tmp, start_server(Path(tmp), cgroup, args) as server:
            pids = worker_pids(server)
            peaks, total_peak, stop = dict.fromkeys(pids, 0), 0, threading.Event()

            def sample() -> None:
                nonlocal total_peak
                while not stop.is_set():
                    sizes = {pid: rss(pid) for pid in pids}
                    for pid, size in sizes.items():
                        peaks[pid] = max(peaks[pid], size)
                    total_peak = max(total_peak, sum(sizes.values()))
                    time.sleep(0.02)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            start = threading.Barrier(CONNECTIONS)
            senders = [
                threading.Thread(target=sender, args=(server, body, start, outcomes))
                for _ in range(CONNECTIONS)
            ]
            began = time.monotonic()
            for thread in senders:
                thread.start()
            for thread in senders:
                thread.join(120)
            took = time.monotonic() - began
            stop.set()
            sampler.join(5)
            restarted = worker_pids(server) != pids
            cgroup_peak = cgroup.peak()
            log = server.log.read_text()
    finally:
        oom = cgroup.oom_kills() if cgroup.path is not None else 0
        cgroup.remove()
    per_worker = ", ".join(f"{size / (1 << 20):.0f} MiB" for size in peaks.values())
    print(f"  peak RSS per worker: {per_worker}; all workers together: {total_peak / (1 << 20):.0f} MiB"
          + (f"; the cgroup's peak: {cgroup_peak / (1 << 20):.0f} MiB" if cgroup_peak else ""))  # fmt: skip
    print(f"  answers in {took:.0f} s: " + ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items())))
    print(
        f"  worker restarts: {'yes' if restarted else 'none'}; OOM kills: {oom}; "
        f"log: {log.count('Traceback')} tracebacks, {log.count('answered 503')} lines about 503s"
    )


if __name__ == "__main__":
    main()
