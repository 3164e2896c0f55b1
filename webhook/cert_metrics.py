"""``admit_guard_certificate_expiry_timestamp_seconds``: when the serving certificate expires.

Recorded by the worker each time it loads a certificate (at start and after every rotation),
so the alert watches the certificate actually served, not the one in a Secret.
"""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path

from cryptography import x509
from prometheus_client import Gauge

log = logging.getLogger(__name__)
EXPIRY_METRIC = "admit_guard_certificate_expiry_timestamp_seconds"


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
