"""Times as Kubernetes writes them: RFC 3339 (``metav1.Time``), a date, a time and an offset."""

from __future__ import annotations

import re
from datetime import UTC, datetime

# RFC 3339 §5.6 date-time; §5.6 NOTE allows a space for the "T". Fractions of a second are kept.
_DATE_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")


def rfc3339_seconds(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 date-time. A date alone, a time without its
    offset or seconds is refused (``ValueError``): it names no instant, and guessing UTC or
    midnight would judge at a time nobody asked for."""
    if not isinstance(text, str) or not _DATE_TIME.fullmatch(text):
        raise ValueError(f"{text!r} is not an RFC 3339 time (2026-01-01T12:00:00Z)")
    return datetime.fromisoformat(text.upper().replace("Z", "+00:00")).timestamp()


def object_time(text: object) -> float | None:
    """Seconds since the epoch of a timestamp an object carries (``creationTimestamp``,
    ``lastTransitionTime``), or None when there is none or it does not parse. The API server
    writes UTC with a ``Z``; a time written by hand without an offset is read as UTC too, never
    as the reader's local time."""
    if not isinstance(text, str) or not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()


def format_rfc3339(epoch: float) -> str:
    """``epoch`` as the API server writes a ``metav1.Time``: UTC, whole seconds, a ``Z``."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
