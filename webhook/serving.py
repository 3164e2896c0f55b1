"""gunicorn around the app: TLS 1.2+, keep-alive, graceful shutdown, certificate rotation.

The kube-apiserver keeps connections open and sends reviews concurrently, so the workers
are threaded (``GuardWorker``, gthread whose event loop reads whole requests before a thread
sees them: a keep-alive or slow connection parks in the poller instead of holding a thread).
gunicorn asks the ``ssl_context`` hook for a context on every new connection; the hook
hands back a cached one and rebuilds it only when the certificate files change, which is
how a rotated Secret reaches new connections while in-flight ones finish on the old one.
With a client CA (``--client-ca``) the context asks every client for a certificate and
verifies one that is presented (``CERT_OPTIONAL``: the kubelet's health probes present none);
whether a connection's certificate verified is decided per request by the admission paths.
"""

from __future__ import annotations

import gc
import logging
import os
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gunicorn.app.base import BaseApplication

from .cert_metrics import record_certificate_expiry
from .config import ClientAuth
from .metrics import worker_exited
from .server import SOURCE_EXTENSION, flush_decisions

log = logging.getLogger(__name__)

# Request bytes the workers together may buffer: this share of the memory limit. The rest is
# the state, the decisions' working memory and what a request costs once parsed.
BUFFER_SHARE = 0.25
DEFAULT_BUFFERED_BYTES = 128 * 1024 * 1024  # per worker, with no memory limit to size from


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
    request_timeout: float = 10.0  # handshake + whole request, read in the worker's event loop
    first_byte_timeout: float = 3.0  # a new connection that sends nothing is closed after this
    max_body_bytes: int = 3 * 1024 * 1024
    max_buffered_bytes: int | None = None  # per worker; None: sized from the memory limit
    worker_connections: int = 4096  # per worker: ~1.5 KB each before the first byte, ~16 KB with TLS up
    client_auth: ClientAuth | None = None

    def buffered_bytes(self) -> int:
        """Each worker's request buffer budget: as configured, else a share of the memory limit."""
        if self.max_buffered_bytes is not None:
            return self.max_buffered_bytes
        return default_buffered_bytes(self.workers, self.max_body_bytes, container_memory_limit())


def container_memory_limit(
    proc_cgroup: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """The memory limit of this process's cgroup in bytes (the lowest one found), or None when
    there is none. The process's own cgroup (v2 ``memory.max``, v1 ``memory.limit_in_bytes``)
    is read, and the root of the mount, which is the container's own with a cgroup namespace."""
    limits = []
    for path in _memory_limit_files(proc_cgroup, root):
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # "max" in v2; about 2**63 in v1
            limits.append(int(text))
    return min(limits, default=None)


def _memory_limit_files(proc_cgroup: Path, root: Path):
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and not controllers:
            yield root / path.lstrip("/") / "memory.max"
        elif "memory" in controllers.split(","):
            yield root / "memory" / path.lstrip("/") / "memory.limit_in_bytes"
    yield root / "memory.max"
    yield root / "memory" / "memory.limit_in_bytes"


def default_buffered_bytes(workers: int, max_body_bytes: int, memory_limit: int | None) -> int:
    """``BUFFER_SHARE`` of the memory limit split across the workers (a fixed default without a
    limit), never less than one largest request with its head."""
    budget = int(memory_limit * BUFFER_SHARE) // workers if memory_limit else DEFAULT_BUFFERED_BYTES
    return max(budget, max_body_bytes + 64 * 1024)


class CertificateFiles:
    """A server ``SSLContext`` for ``tls.crt``/``tls.key`` (and the client CA, if any), rebuilt
    when one of the files changes.

    Mounted Secrets are swapped through symlinks, so the files are compared by the
    (inode, mtime, size) of their targets. A half-written pair fails to load and the previous
    context keeps serving until the next change.
    """

    def __init__(self, cert_dir: Path, client_ca: Path | None = None) -> None:
        self.cert = Path(cert_dir) / "tls.crt"
        self.key = Path(cert_dir) / "tls.key"
        self.client_ca = Path(client_ca) if client_ca is not None else None
        self._lock = threading.Lock()
        self._stamp: tuple | None = None
        self._context: ssl.SSLContext | None = None

    def context(self) -> ssl.SSLContext:
        stamp = self._current_stamp()
        if stamp == self._stamp and self._context is not None:
            return self._context
        with self._lock:
            if stamp != self._stamp or self._context is None:
                try:
                    self._context = server_context(self.cert, self.key, self.client_ca)
                    self._stamp = stamp
                    log.info("loaded serving certificate %s", self.cert)
                    record_certificate_expiry(self.cert)
                except (OSError, ssl.SSLError) as err:
                    if self._context is None:
                        raise
                    log.warning("keeping the previous certificate: %s does not load: %s", self.cert, err)
            return self._context

    def _current_stamp(self) -> tuple | None:
        try:
            files = (self.cert, self.key) if self.client_ca is None else (self.cert, self.key, self.client_ca)
            return tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in map(os.stat, files))
        except OSError:
            return None


def server_context(cert: Path, key: Path, client_ca: Path | None = None) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile=str(cert), keyfile=str(key))
    context.set_alpn_protocols(["http/1.1"])
    if client_ca is not None:
        # Optional: a certificate that is presented must verify (else the handshake fails), but
        # probes without one still reach /healthz, /readyz and /metrics.
        context.verify_mode = ssl.CERT_OPTIONAL
        context.load_verify_locations(cafile=str(client_ca))
    return context


def _worker_exit(worker) -> None:
    """Stop the worker's informer (its watches) and write its last decision lines."""
    flush_decisions()
    extensions = getattr(getattr(worker, "wsgi", None), "extensions", {})
    source = extensions.get(SOURCE_EXTENSION)
    if source is not None:
        source.close()


class GuardServer(BaseApplication):
    """A gunicorn application built in code, so ``admit-guard serve`` needs no config file."""

    def __init__(self, app_factory: Callable[[], Any], options: ServeOptions) -> None:
        self._factory = app_factory
        self._options = options
        # Read by GuardWorker (webhook/worker.py) through its ``app``.
        self.request_timeout = options.request_timeout
        self.first_byte_timeout = options.first_byte_timeout
        self.max_body_bytes = options.max_body_bytes
        self.max_buffered_bytes = options.buffered_bytes()
        self.client_auth = options.client_auth
        super().__init__()

    def load_config(self) -> None:
        opts = self._options
        client_ca = Path(opts.client_auth.ca) if opts.client_auth is not None else None
        certificates = CertificateFiles(opts.cert_dir, client_ca)
        settings = {
            "bind": [opts.bind],
            "workers": opts.workers,
            "worker_class": "webhook.worker.GuardWorker",
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
