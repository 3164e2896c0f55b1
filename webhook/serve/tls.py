"""TLS: the server's context, rebuilt when the certificate files change, and their expiry.

gunicorn asks for a context on every new connection (``gunicorn.py``); ``CertificateFiles``
hands back a cached one and rebuilds it only when the files change. With a client CA
(``--client-ca``) the context asks every client for a certificate and verifies one that is
presented (``CERT_OPTIONAL``: the kubelet's health probes present none); whether a connection's
certificate verified is decided per request by the admission paths (``wsgi.py``).

``admit_guard_certificate_expiry_timestamp_seconds`` is recorded each time a worker loads a
certificate (at start and after every rotation), so the alert watches the certificate actually
served, not the one in a Secret.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from functools import cache
from pathlib import Path

from cryptography import x509
from prometheus_client import Gauge

log = logging.getLogger(__name__)
EXPIRY_METRIC = "admit_guard_certificate_expiry_timestamp_seconds"


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


def certificate_expiry(cert: Path) -> float:
    """The first certificate's notAfter in ``cert`` (PEM), as a Unix timestamp."""
    return x509.load_pem_x509_certificate(Path(cert).read_bytes()).not_valid_after_utc.timestamp()


@cache
def _gauge() -> Gauge:
    # Created on first use, in the worker: with a label, so nothing is written at creation and
    # the gunicorn master never leaves a sample behind (see metrics.py).
    return Gauge(
        EXPIRY_METRIC,
        "Expiry (notAfter) of the serving certificate the worker loaded last, as a Unix timestamp.",
        ["certificate"],
        multiprocess_mode="livemin",
        registry=None,
    )


def record_certificate_expiry(cert: Path) -> None:
    try:
        _gauge().labels(str(cert)).set(certificate_expiry(cert))
    except (OSError, ValueError) as err:
        log.warning("cannot read the expiry of %s: %s", cert, err)
