"""Times as Kubernetes writes them: RFC 3339 (``metav1.Time``), a date, a time and an offset."""

from __future__ import annotations

import re
from datetime import datetime

# RFC 3339 §5.6 date-time; §5.6 NOTE allows a space for the "T". Fractions of a second are kept.
_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")


def rfc3339_seconds(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 date-time. A date alone, a time without its
    offset or seconds is refused (``ValueError``): it names no instant, and guessing UTC or
    midnight would judge at a time nobody asked for."""
    if not isinstance(text, str) or not _DATE_TIME.fullmatch(text):
        raise ValueError(f"{text!r} is not an RFC 3339 time (2026-01-01T12:00:00Z)")
    return datetime.fromisoformat(text.upper().replace("Z", "+00:00")).timestamp()
