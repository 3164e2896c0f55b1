"""A real ``admit-guard serve`` (gunicorn, TLS) on a free loopback port, for tests and benchmarks."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from webhook.certs import issue


@dataclass
class LiveServer:
    port: int
    cert_dir: Path
    process: subprocess.Popen
    log: Path

    def tls_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.cert_dir / "ca.crt"))

    def connect(self, host: str = "localhost") -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(host, self.port, context=self.tls_context(), timeout=10)


def post_json(conn: http.client.HTTPSConnection, path: str, body: bytes | dict) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn.request("POST", path, body=data, headers={"Content-Type": "application/json"})
    reply = conn.getresponse()
    return reply.status, json.loads(reply.read())


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of metric ``name`` whose labels include ``labels``, in exposition text."""
    total = 0.0
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head.split("{")[0] == name and all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def live_server(workdir: Path, *args: str, workers: int = 2, threads: int = 4) -> Iterator[LiveServer]:
    """Start the server, wait until /readyz answers over verified TLS, stop it on exit."""
    cert_dir = workdir / "certs"
    if not (cert_dir / "tls.crt").exists():
        issue("admit-guard", "admit-guard", cert_dir)
    port = free_port()
    command = [
        sys.executable, "-m", "webhook", "serve", "--bind", f"127.0.0.1:{port}", "--cert-dir", str(cert_dir),
        "--workers", str(workers), "--threads", str(threads), "--log-level", "warning", *args,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    log = (workdir / "server.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = LiveServer(port, cert_dir, process, workdir / "server.log")
    try:
        _wait_ready(server)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _wait_ready(server: LiveServer, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"admit-guard serve exited with {server.process.returncode}")
        try:
            conn = server.connect()
            conn.request("GET", "/readyz")
            if conn.getresponse().status == 200:
                conn.close()
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"admit-guard serve on port {server.port} not ready after {timeout} s")
