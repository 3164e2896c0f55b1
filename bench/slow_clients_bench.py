"""Slow-client benchmark (issue 15): trickling connections against a normal keep-alive client.

For each worker class, in one run: a server (1 worker x 4 threads, TLS, the example cluster) on
loopback; 64 connections that trickle a request a byte every 0.5 s (half of them the TLS
ClientHello itself, half HTTP headers after a handshake) for 20 s; meanwhile one keep-alive
client sends a review at 40 req/s (open loop, latency from the scheduled time, 2 s client
timeout). ``gthread`` is gunicorn's stock worker (before); ``webhook.serve.worker.GuardWorker`` reads
the handshake and the request in its event loop (after).
Target: 40 req/s answered, zero errors, p99 < 1 s while the 64 connections are held.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import ssl
import statistics
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

EXAMPLES = ROOT / "examples"
REVIEW = (EXAMPLES / "admission" / "good-deployment.json").read_bytes()
SLOW, SECONDS, RATE = 64, 20.0, 40


def serve(worker_class: str, port: int, cert_dir: str) -> None:
    """Child process: the guard's server with ``worker_class`` swapped in."""
    from webhook.config import Config
    from webhook.serve.app import create_app
    from webhook.serve.gunicorn import GuardServer, ServeOptions
    from webhook.state.snapshot import load_snapshot
    from webhook.state.source import FixedState

    state = load_snapshot([str(EXAMPLES / "cluster")])

    class Server(GuardServer):
        def load_config(self) -> None:
            super().load_config()
            self.cfg.set("worker_class", worker_class)
            if worker_class == "gthread":
                # gunicorn's own worker listens on what the master binds; the guard's worker
                # listens itself, on the port the master holds (``serve/listening.py``).
                self.cfg.set("bind", [f"127.0.0.1:{port}"])
                self.cfg.set("on_starting", lambda arbiter: None)
                self.cfg.set("post_fork", lambda arbiter, worker: None)

    options = ServeOptions(bind=f"127.0.0.1:{port}", cert_dir=Path(cert_dir), workers=1, threads=4)
    Server(lambda: create_app(Config(), FixedState(state)), options).run()


def _client_hello() -> bytes:
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def trickle(server: LiveServer, stop: threading.Event, tls_first: bool) -> None:
    try:
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=60)
        if tls_first:
            conn, payload = raw, _client_hello()
        else:
            conn = server.tls_context().wrap_socket(raw, server_hostname="localhost")
            payload = b"POST /validate HTTP/1.1\r\nHost: guard\r\nContent-Length: 100\r\n\r\n" + b"{" * 100
        for byte in payload:
            if stop.wait(0.5):
                break
            conn.sendall(bytes([byte]))
    except OSError:
        pass


def normal_client(server: LiveServer, seconds: float) -> tuple[list[float], int, int, float]:
    """Open loop at RATE req/s on one keep-alive connection; (latencies, answered, errors, and
    the seconds it took: a client stalled by the server falls behind its schedule)."""
    latencies, errors = [], 0
    conn = None
    start = time.perf_counter()
    for i in range(int(seconds * RATE)):
        scheduled = start + i / RATE
        time.sleep(max(0.0, scheduled - time.perf_counter()))
        try:
            if conn is None:
                conn = server.connect()
                conn.timeout = 2.0
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
    return latencies, len(latencies), errors, time.perf_counter() - start


def run(worker_class: str, workdir: Path) -> str:
    cert_dir = workdir / "certs"
    if not (cert_dir / "tls.crt").exists():
        issue("admit-guard", "admit-guard", cert_dir)
    port = free_port()
    log = (workdir / f"{worker_class}.log").open("wb")
    command = [sys.executable, __file__, "--serve", worker_class, str(port), str(cert_dir)]
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    server = LiveServer(port, cert_dir, process, workdir / f"{worker_class}.log")
    try:
        _wait_ready(server)
        stop = threading.Event()
        slow = [threading.Thread(target=trickle, args=(server, stop, i % 2 == 0)) for i in range(SLOW)]
        for thread in slow:
            thread.start()
        time.sleep(1.0)
        latencies, answered, errors, took = normal_client(server, SECONDS)
        stop.set()
        for thread in slow:
            thread.join(10)
    finally:
        process.terminate()
        process.wait(30)
        log.close()
    latencies.sort()
    p50 = statistics.median(latencies) * 1000 if latencies else float("nan")
    p99 = latencies[int(len(latencies) * 0.99) - 1] * 1000 if latencies else float("nan")
    sent = int(SECONDS * RATE)
    return (
        f"{worker_class:32} answered {answered}/{sent} in {took:.0f} s ({answered / took:.1f} req/s), "
        f"errors {errors}, p50 {p50:.1f} ms, p99 {p99:.1f} ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--serve", nargs=3, metavar=("WORKER_CLASS", "PORT", "CERT_DIR"))
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]), args.serve[2])
        return
    print(f"{SLOW} trickling connections for {SECONDS:.0f} s; a keep-alive client at {RATE} req/s "
          "(target: zero errors, p99 < 1 s)")  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        for worker_class in ("gthread", "webhook.serve.worker.GuardWorker"):
            print(run(worker_class, Path(tmp)), flush=True)


if __name__ == "__main__":
    main()
