"""gunicorn around the app: TLS 1.2+, keep-alive, graceful shutdown, certificate rotation.

The kube-apiserver keeps connections open and sends reviews concurrently, so the workers
are threaded (``GuardWorker``, gthread whose event loop reads whole requests before a thread
sees them: a keep-alive or slow connection parks in the poller instead of holding a thread).
gunicorn asks the ``ssl_context`` hook for a context on every new connection; the hook
hands back a cached one and rebuilds it only when the certificate files change, which is
how a rotated Secret reaches new connections while in-flight ones finish on the old one.
"""

from __future__ import annotations

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
from .metrics import worker_exited
from .server import SOURCE_EXTENSION, flush_decisions

log = logging.getLogger(__name__)


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
    max_body_bytes: int = 3 * 1024 * 1024


class CertificateFiles:
    """A server ``SSLContext`` for ``tls.crt``/``tls.key``, rebuilt when either file changes.

    Mounted Secrets are swapped through symlinks, so the files are compared by the
    (inode, mtime, size) of their targets. A half-written pair fails to load and the previous
    context keeps serving until the next change.
    """

    def __init__(self, cert_dir: Path) -> None:
        self.cert = Path(cert_dir) / "tls.crt"
        self.key = Path(cert_dir) / "tls.key"
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
                    self._context = server_context(self.cert, self.key)
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
            return tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in map(os.stat, (self.cert, self.key)))
        except OSError:
            return None


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(certfile=str(cert), keyfile=str(key))
    context.set_alpn_protocols(["http/1.1"])
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
        self.max_body_bytes = options.max_body_bytes
        super().__init__()

    def load_config(self) -> None:
        opts = self._options
        certificates = CertificateFiles(opts.cert_dir)
        settings = {
            "bind": [opts.bind],
            "workers": opts.workers,
            "worker_class": "webhook.worker.GuardWorker",
            "threads": opts.threads,
            "keepalive": opts.keepalive,
            "timeout": opts.timeout,
            "graceful_timeout": opts.graceful_timeout,
            "certfile": str(certificates.cert),
            "keyfile": str(certificates.key),
            "ssl_context": lambda conf, default_factory: certificates.context(),
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
