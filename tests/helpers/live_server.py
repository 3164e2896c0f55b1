"""A real ``admit-guard serve`` (gunicorn, TLS) on a free loopback port, for tests and benchmarks."""

from __future__ import annotations

import contextlib
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


def worker_pids(master: int) -> list[int]:
    """The processes ``master`` forked (gunicorn's workers), from /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if int(fields[1]) == master:
            pids.append(int(stat.parent.name))
    return sorted(pids)


def connections_by_worker(master: int, port: int) -> dict[int, set[int]]:
    """For each worker of ``master``, the client ports of the established connections it holds
    on ``port``: read from the kernel's socket tables and each worker's descriptors (Linux), so
    the server says nothing about its workers to its clients."""
    peers = _sockets_on(port, _ESTABLISHED)
    holders: dict[int, set[int]] = {}
    for pid in worker_pids(master):
        held = holders.setdefault(pid, set())
        for fd in Path(f"/proc/{pid}/fd").glob("*"):
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:[") and int(target[8:-1]) in peers:
                held.add(peers[int(target[8:-1])])
    return holders


def wait_listening(port: int, workers: int, timeout: float = 30.0) -> None:
    """Until every worker listens on ``port`` (a socket each, ``SO_REUSEPORT``): /readyz answers
    as soon as one worker is up, and connections opened before the others listen all land on
    that one."""
    deadline = time.monotonic() + timeout
    while len(_sockets_on(port, _LISTEN)) < workers:
        if time.monotonic() > deadline:
            raise TimeoutError(f"fewer than {workers} workers listen on port {port} after {timeout} s")
        time.sleep(0.05)


_ESTABLISHED, _LISTEN = "01", "0A"  # TCP states as the kernel's tables write them


def _sockets_on(port: int, state: str) -> dict[int, int]:
    """Socket inode → the peer's port, for every TCP socket in ``state`` whose local port is
    ``port`` (/proc/net/tcp and tcp6)."""
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as lines:
            next(lines)
            for line in lines:
                fields = line.split()
                if fields[3] == state and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    found[int(fields[9])] = int(fields[2].rsplit(":", 1)[1], 16)
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def live_server(
    workdir: Path,
    *args: str,
    workers: int = 2,
    threads: int = 4,
    ready: bool = True,
    metrics_dir: Path | None = None,
) -> Iterator[LiveServer]:
    """Start the server, wait until /readyz answers over verified TLS (``ready``; else only until
    /healthz does), stop it on exit. ``metrics_dir``: where its processes write their metrics
    (else a directory of its own)."""
    cert_dir = workdir / "certs"
    if not (cert_dir / "tls.crt").exists():
        issue("admit-guard", "admit-guard", cert_dir)
    port = free_port()
    command = [
        sys.executable, "-m", "webhook", "serve", "--bind", f"127.0.0.1:{port}", "--cert-dir", str(cert_dir),
        "--workers", str(workers), "--threads", str(threads), "--log-level", "warning", *args,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    if metrics_dir is not None:
        env["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
    log = (workdir / "server.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    server = LiveServer(port, cert_dir, process, workdir / "server.log")
    try:
        _wait_ready(server, "/readyz" if ready else "/healthz")
        if ready:
            wait_listening(server.port, workers)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def listening(port: int) -> int:
    """How many sockets listen on ``port``: one per worker that joined it."""
    return len(_sockets_on(port, _LISTEN))


def _wait_ready(server: LiveServer, path: str = "/readyz", timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"admit-guard serve exited with {server.process.returncode}")
        try:
            conn = server.connect()
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                conn.close()
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"admit-guard serve on port {server.port} not ready after {timeout} s")
