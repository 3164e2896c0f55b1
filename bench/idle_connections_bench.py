"""Idle-connection benchmark (issue 21, item 8): 5,000 silent connections beside a normal client.

A server as the Deployment runs it (2 workers x 4 threads, TLS, the example cluster, default
``--first-byte-timeout 3`` and ``--worker-connections 4096``) on loopback. An attacker keeps
5,000 TCP connections open that never send a byte: each one the server closes (at the
first-byte timeout, or to make room at the connection limit) is opened again at once, from a
process of its own. Meanwhile a normal client sends reviews: first on one keep-alive connection
(as the API server does) at 40 req/s, then on a new TLS connection per review at 10 req/s (a
client that reconnects has to get past the silent ones). Then the same with 10,000 silent
connections, more than the two workers hold (2 x 4096): the oldest silent one is closed for
every new connection, and the attacker's reconnects churn as fast as it can make them.
Before the fix, past 2 x 1000 idle connections a new client waited up to 10 s.
Target: zero errors, p99 < 100 ms at 5,000.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import resource
import selectors
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.helpers.live_server import LiveServer, live_server  # noqa: E402

EXAMPLES = ROOT / "examples"
REVIEW = (EXAMPLES / "admission" / "good-deployment.json").read_bytes()
HORDES, SECONDS, KEEPALIVE_RATE, RECONNECT_RATE = (5000, 10000), 15.0, 40, 10


def raise_descriptor_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < needed:
        sys.exit(f"needs {needed} open files; the hard limit is {hard}")


def silent_horde(port: int, count: int) -> None:
    """Child process: ``count`` connections that never send a byte, each reopened as soon as the
    server closes it, until SIGTERM; then prints how many were opened. A process of its own, so
    its work does not delay the normal client's measurements (one interpreter lock)."""
    selector = selectors.DefaultSelector()
    opened = 0
    stop = False

    def stopping(*_):
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, stopping)

    def open_one() -> None:
        nonlocal opened
        sock = socket.socket()
        sock.setblocking(False)
        if sock.connect_ex(("127.0.0.1", port)) not in (0, errno.EINPROGRESS):
            sock.close()
            return
        selector.register(sock, selectors.EVENT_READ)
        opened += 1

    for _ in range(count):
        open_one()
    print("ready", flush=True)
    while not stop:
        for key, _ in selector.select(0.1):
            sock = key.fileobj
            try:
                if sock.recv(1):
                    continue  # never happens: the server sends nothing first
            except BlockingIOError:
                continue
            except OSError:
                pass
            selector.unregister(sock)  # closed by the server: open another
            sock.close()
            open_one()
    print(opened, flush=True)


def keep_alive_client(server: LiveServer, seconds: float, rate: int) -> tuple[list[float], int]:
    """Open loop on one keep-alive connection; latency from the scheduled time."""
    latencies, errors, conn = [], 0, None
    start = time.perf_counter()
    for i in range(int(seconds * rate)):
        scheduled = start + i / rate
        time.sleep(max(0.0, scheduled - time.perf_counter()))
        try:
            if conn is None:
                conn = server.connect()
                conn.timeout = 5.0
            conn.request("POST", "/validate", body=REVIEW, headers={"Content-Type": "application/json"})
            reply = conn.getresponse()
            reply.read()
            if reply.status != 200:
                raise OSError(f"HTTP {reply.status}")
            latencies.append(time.perf_counter() - scheduled)
        except OSError:
            errors += 1
            if conn is not None:
                conn.close()
            conn = None
    if conn is not None:
        conn.close()
    return latencies, errors


def reconnecting_client(server: LiveServer, seconds: float, rate: int) -> tuple[list[float], int]:
    """Open loop with a new TLS connection per review (connect, handshake, review, close)."""
    latencies, errors = [], 0
    start = time.perf_counter()
    for i in range(int(seconds * rate)):
        scheduled = start + i / rate
        time.sleep(max(0.0, scheduled - time.perf_counter()))
        conn = server.connect()
        conn.timeout = 5.0
        try:
            conn.request("POST", "/validate", body=REVIEW, headers={"Content-Type": "application/json"})
            reply = conn.getresponse()
            reply.read()
            if reply.status != 200:
                raise OSError(f"HTTP {reply.status}")
            latencies.append(time.perf_counter() - scheduled)
        except OSError:
            errors += 1
        finally:
            conn.close()
    return latencies, errors


def summary(name: str, latencies: list[float], errors: int, sent: int) -> str:
    latencies = sorted(latencies)
    p50 = statistics.median(latencies) * 1000 if latencies else float("nan")
    p99 = latencies[max(0, int(len(latencies) * 0.99) - 1)] * 1000 if latencies else float("nan")
    return f"{name:44} p50 {p50:7.1f} ms  p99 {p99:7.1f} ms  errors {errors}/{sent}"


def under_attack(server: LiveServer, idle: int) -> None:
    command = [sys.executable, __file__, "--horde", str(server.port), str(idle)]
    horde = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    try:
        horde.stdout.readline()  # ready: all open
        time.sleep(2.0)  # the workers hold what they can
        kept, kept_errors = keep_alive_client(server, SECONDS, KEEPALIVE_RATE)
        sent = int(SECONDS * KEEPALIVE_RATE)
        print(summary(f"{idle} idle, keep-alive {KEEPALIVE_RATE} req/s", kept, kept_errors, sent), flush=True)
        fresh, fresh_errors = reconnecting_client(server, SECONDS, RECONNECT_RATE)
        sent = int(SECONDS * RECONNECT_RATE)
        print(summary(f"{idle} idle, new connection {RECONNECT_RATE} req/s", fresh, fresh_errors, sent))
    finally:
        horde.terminate()
        opened = horde.communicate(timeout=30)[0].strip()
    print(f"  silent connections opened: {opened} in {2 * SECONDS + 2:.0f} s ({idle} held by the attacker)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--horde", nargs=2, type=int, metavar=("PORT", "COUNT"))
    args = parser.parse_args()
    raise_descriptor_limit(max(HORDES) + 512)
    if args.horde:
        silent_horde(*args.horde)
        return
    print("silent connections (reopened when closed) beside a normal client; "
          "target: zero errors, p99 < 100 ms at 5,000")  # fmt: skip
    with (
        tempfile.TemporaryDirectory() as tmp,
        live_server(Path(tmp), "--cluster", str(EXAMPLES / "cluster"), workers=2, threads=4) as server,
    ):
        base, base_errors = keep_alive_client(server, 5.0, KEEPALIVE_RATE)
        print(
            summary("no idle connections, keep-alive", base, base_errors, int(5.0 * KEEPALIVE_RATE)),
            flush=True,
        )
        for idle in HORDES:
            under_attack(server, idle)
            time.sleep(4.0)  # the last silent ones reach their first-byte timeout
        with contextlib.suppress(OSError):
            log = server.log.read_text()
            exits = log.count("exited with code")
            print(f"server log: {log.count('Traceback')} tracebacks, {exits} worker exits")


if __name__ == "__main__":
    main()
