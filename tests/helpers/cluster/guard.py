"""The guard as deployed: ``admit-guard serve`` replicas of two workers each, reading the
double through ``--kubeconfig`` (its informer watches it, its Leases live in it), serving the
TLS files and the config of the rendered overlay. A replica can be stopped and started again
(a guard outage); the service's endpoints are the replicas running.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from tests.helpers.live_server import LiveServer, live_server

from .deploy import Rendered

SERVICE = ("admit-guard", "admit-guard")  # (namespace, name) of the webhooks' clientConfig.service


def enforcing(config: dict[str, Any]) -> dict[str, Any]:
    """The shipped config with every policy it names switched to ``enforce``, as its own
    comment says an operator does once the warnings are understood."""
    policies = {
        name: {**(settings or {}), "mode": "enforce"} for name, settings in config["policies"].items()
    }
    return {**config, "policies": policies}


class Guard:
    """``replicas`` servers of ``workers`` workers on loopback."""

    def __init__(
        self, rendered: Rendered, kubeconfig: str, workdir: Path, config: dict[str, Any], replicas: int = 2,
        workers: int = 2,
    ) -> None:  # fmt: skip
        self.workdir, self.replicas, self.workers = workdir, replicas, workers
        self.config_path = workdir / "config.yaml"
        self.config_path.write_text(yaml.safe_dump(config))
        self.args = ("--kubeconfig", kubeconfig, "--config", str(self.config_path))
        self.rendered = rendered
        self.running: dict[int, tuple[contextlib.ExitStack, LiveServer]] = {}
        self._lock = threading.Lock()

    def endpoints(self, namespace: str, name: str) -> list[int]:
        if (namespace, name) != SERVICE:
            return []
        with self._lock:
            return [server.port for _, server in self.running.values()]

    def start(self, replica: int | None = None) -> None:
        """Start one replica, or every one not running, in parallel; wait until each is ready."""
        wanted = (
            [replica] if replica is not None else [r for r in range(self.replicas) if r not in self.running]
        )
        errors: list[BaseException] = []
        threads = [threading.Thread(target=self._start_one, args=(r, errors)) for r in wanted]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def _start_one(self, replica: int, errors: list[BaseException]) -> None:
        directory = self.workdir / f"replica-{replica}"
        certs = directory / "certs"
        if not certs.exists():
            shutil.copytree(self.rendered.cert_dir, certs)
        stack = contextlib.ExitStack()
        try:
            server = stack.enter_context(live_server(directory, *self.args, workers=self.workers))
            _all_workers_ready(server)
        except BaseException as err:  # handed to the starting thread
            stack.close()
            errors.append(err)
            return
        with self._lock:
            self.running[replica] = (stack, server)

    def stop(self, replica: int | None = None) -> None:
        """Stop one replica, or all of them (SIGTERM, as a rollout or an eviction does)."""
        with self._lock:
            chosen = [replica] if replica is not None else list(self.running)
            stopping = [self.running.pop(r) for r in chosen if r in self.running]
        # Each replica drains on its own, as pods being deleted do: in parallel.
        threads = [threading.Thread(target=stack.close) for stack, _ in stopping]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def logs(self) -> str:
        return "\n".join(
            p.read_text(errors="replace") for p in sorted(self.workdir.glob("replica-*/server.log"))
        )


def _all_workers_ready(server: LiveServer, in_a_row: int = 8, timeout: float = 30.0) -> None:
    """``/readyz`` ready on ``in_a_row`` fresh connections in a row: each worker answers for its
    own informer and the kernel spreads new connections over the workers, so one ready answer
    says nothing of the sibling. A cluster routes to a pod once its readiness probe passes; the
    box waits until every worker would pass it."""
    deadline, streak = time.monotonic() + timeout, 0
    while streak < in_a_row:
        if time.monotonic() > deadline:
            raise TimeoutError(f"admit-guard on port {server.port}: a worker is still not ready")
        conn = server.connect()
        try:
            conn.request("GET", "/readyz")
            streak = streak + 1 if conn.getresponse().status == 200 else 0
        except OSError:
            streak = 0
        finally:
            conn.close()
        if streak == 0:
            time.sleep(0.05)
