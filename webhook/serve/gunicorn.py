"""gunicorn around the app: TLS 1.2+, keep-alive, graceful shutdown, certificate rotation.

The kube-apiserver keeps connections open and sends reviews concurrently, so the workers
are threaded (``GuardWorker``, gthread whose event loop reads whole requests before a thread
sees them: a keep-alive or slow connection parks in the poller instead of holding a thread).

The kube-apiserver also holds few, long-lived connections, so where each one lands decides a
worker's share for hours. From one listening socket shared by the workers, the first worker to
wake took a whole burst of them (16 connections 16/0 in most runs) while the other idled. So
each worker listens on a socket of its own with ``SO_REUSEPORT``, and the kernel spreads new
connections over the workers by their addresses. A worker listens once its cluster state is
ready (``listening.py``): gunicorn binds nothing itself, and the master keeps the address bound
but does not listen (``_hold_port``): no server can take the port while workers restart, and no
connection waits in a queue nobody accepts from.
gunicorn asks the ``ssl_context`` hook for a context on every new connection; the hook
hands back a cached one (``tls.CertificateFiles``), rebuilt only when the certificate files
change: a rotated Secret reaches new connections while in-flight ones finish on the old one.
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication
from gunicorn.arbiter import Arbiter

from ..config import ClientAuth
from . import limits
from .app import SOURCE_EXTENSION, flush_decisions
from .listening import Port
from .metrics import worker_exited
from .replica import Renewal, ReplicaState
from .tls import CertificateFiles


@dataclass(frozen=True, slots=True)
class ServeOptions:
    bind: str = "0.0.0.0:8443"
    cert_dir: Path = Path("certs")
    workers: int = 2
    threads: int = 4
    keepalive: int = 75  # longer than the apiserver's 90 s idle timeout is pointless; shorter churns TLS
    timeout: int = 30
    graceful_timeout: int = 25
    log_level: str = "info"
    request_timeout: float = limits.REQUEST_TIMEOUT
    first_byte_timeout: float = limits.FIRST_BYTE_TIMEOUT
    max_body_bytes: int = limits.MAX_BODY_BYTES
    max_buffered_bytes: int | None = None  # per worker; None: sized from the memory limit
    worker_connections: int = limits.WORKER_CONNECTIONS
    client_auth: ClientAuth | None = None

    def buffered_bytes(self) -> int:
        """Each worker's request buffer budget: as configured, else a share of the memory limit."""
        if self.max_buffered_bytes is not None:
            return self.max_buffered_bytes
        memory_limit = limits.container_memory_limit()
        return limits.default_buffered_bytes(self.workers, self.max_body_bytes, memory_limit)


def _worker_exit(worker) -> None:
    """Stop the worker's informer (its watches) and write its last decision lines."""
    flush_decisions()
    extensions = getattr(getattr(worker, "wsgi", None), "extensions", {})
    source = extensions.get(SOURCE_EXTENSION)
    if source is not None:
        source.close()


def _hold_port(arbiter) -> None:
    """In the master, before any worker: the port held, the workers' lock file made."""
    server = arbiter.app
    server.port = Port.hold(server.bind)
    arbiter.log.info("holding %s: each worker listens once its cluster state is ready", server.bind)


class ReplicaArbiter(Arbiter):
    """gunicorn's master, which also renews the workers it forks from the replica's state
    (``replica.Renewal``): told of every fork, asked before it counts its workers."""

    def spawn_worker(self):
        pid = super().spawn_worker()  # returns in the master only
        self.app.renewal.forked(pid, self.app.replica.forked_resumable)
        return pid

    def manage_workers(self):
        self.app.renewal.step(self)
        super().manage_workers()

    def run(self):
        # The loop wakes once a second: woken as soon as the replica's first lists are in,
        # it forks the workers that can judge without waiting for the tick.
        leader = self.app.replica.leader
        threading.Thread(
            target=lambda: leader.wait_synced(float("inf")) and self.wakeup(), name="synced", daemon=True
        ).start()
        super().run()


class GuardServer(BaseApplication):
    """A gunicorn application built in code, so ``admit-guard serve`` needs no config file."""

    def __init__(
        self,
        app_factory: Callable[[], Any],
        options: ServeOptions,
        replica: ReplicaState | None = None,
    ) -> None:
        self._factory = app_factory
        self._options = options
        # A live state: the master's informer, its workers forked from it and renewed.
        self.replica = replica
        self.renewal = Renewal(replica) if replica is not None else None
        # Read by GuardWorker (worker.py) through its ``app``.
        self.request_timeout = options.request_timeout
        self.first_byte_timeout = options.first_byte_timeout
        self.max_body_bytes = options.max_body_bytes
        self.max_buffered_bytes = options.buffered_bytes()
        self.client_auth = options.client_auth
        self.bind = options.bind
        self.port: Port | None = None  # the master's (``_hold_port``); GuardWorker listens on it
        super().__init__()

    def load_config(self) -> None:
        opts = self._options
        client_ca = Path(opts.client_auth.ca) if opts.client_auth is not None else None
        certificates = CertificateFiles(opts.cert_dir, client_ca)
        settings = {
            # Nothing for gunicorn to bind: each worker listens itself (``listening.py``).
            "bind": [],
            "workers": opts.workers,
            "worker_class": "webhook.serve.worker.GuardWorker",
            "threads": opts.threads,
            "worker_connections": opts.worker_connections,
            "keepalive": opts.keepalive,
            "timeout": opts.timeout,
            "graceful_timeout": opts.graceful_timeout,
            "certfile": str(certificates.cert),
            "keyfile": str(certificates.key),
            "ssl_context": lambda conf, default_factory: certificates.context(),
            # What the master built (the snapshot state, the modules) is shared with the workers
            # and never garbage: frozen, no worker's full collection scans it (a pause per
            # collection, and pages copied that could have stayed shared).
            "pre_fork": lambda server, worker: gc.freeze(),
            "reuse_port": True,  # the workers' listeners (gunicorn's TCPSocket) join one group
            "on_starting": _hold_port,
            "post_fork": lambda server, worker: server.app.port.release(),
            "child_exit": lambda server, worker: worker_exited(worker.pid),
            "worker_exit": lambda server, worker: _worker_exit(worker),
            "loglevel": opts.log_level,
            "errorlog": "-",
            "accesslog": None,
            "proc_name": "admit-guard",
            # Recent gunicorn opens a control socket under $HOME; the root filesystem is read-only.
            "control_socket_disable": True,
        }
        for key, value in settings.items():
            if key in self.cfg.settings:
                self.cfg.set(key, value)

    def load(self) -> Any:
        return self._factory()

    def run(self) -> None:
        if self.replica is None:
            super().run()
            return
        try:
            ReplicaArbiter(self).run()
        except RuntimeError as err:  # as ``BaseApplication.run``: gunicorn's start-up errors
            print(f"\nError: {err}\n", file=sys.stderr)
            sys.exit(1)
        finally:
            self.replica.close()
