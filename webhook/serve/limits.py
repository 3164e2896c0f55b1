"""Every limit a client meets on the request's path, in one place, with the reason for its value.

The flags of ``admit-guard serve`` default to these (``--max-body-bytes``,
``--request-timeout``, ``--first-byte-timeout``, ``--worker-connections``,
``--max-buffered-bytes``); the rest are fixed. The chunked coding's own caps
(``MAX_CHUNK_LINE``, ``MAX_TRAILERS``) are the decoder's (``webhook/formats/chunked.py``), which the
informer shares: they are named here so that this table is whole.
"""

from __future__ import annotations

from pathlib import Path

from ..formats.chunked import MAX_CHUNK_LINE, MAX_TRAILERS

__all__ = [
    "BUFFER_SHARE",
    "DEFAULT_BUFFERED_BYTES",
    "DRAIN_LIMIT",
    "FIRST_BYTE_TIMEOUT",
    "LINGER_LIMIT",
    "LINGER_SECONDS",
    "MAX_BODY_BYTES",
    "MAX_BODY_ON_LOOP",
    "MAX_CHUNK_LINE",
    "MAX_HEAD",
    "MAX_TRAILERS",
    "PARSED_COST",
    "REQUEST_TIMEOUT",
    "WORKER_CONNECTIONS",
    "container_memory_limit",
    "default_buffered_bytes",
    "parsed_cost",
]

# A request's body: the apiserver's own request limit is 3 MiB. Over it: 413, from the event
# loop as soon as the declared length or the chunks pass it, and from the WSGI endpoints for a
# server that frames nothing itself (the test client, a plain gunicorn worker).
MAX_BODY_BYTES = 3 * 1024 * 1024
# The request line and headers; gunicorn's own limits are below this.
MAX_HEAD = 64 * 1024
# The largest body the event loop decides itself (``state/waiting.py``); a larger one goes to a
# pool thread, so that one review holds the loop, and every other connection of the worker, for
# no longer than about a millisecond (in-process: 0.2 ms at 1 KiB, about 1 ms at 280 KiB).
MAX_BODY_ON_LOOP = 256 * 1024
# After a 413 the rest of the body is read and dropped (up to this much), or the client, still
# sending, would meet a reset instead of the answer.
DRAIN_LIMIT = 16 * 1024 * 1024
# A connection the server closes lingers this long, reading and dropping what the client still
# sends, so that a reset does not cut the last reply (what gunicorn's close_graceful does).
LINGER_SECONDS, LINGER_LIMIT = 2.0, 64 * 1024

# The TLS handshake and the whole request, read in the worker's event loop: else 408.
REQUEST_TIMEOUT = 10.0
# A new connection that sends nothing is closed after this (the API server and the kubelet send
# their ClientHello at once); never more than ``REQUEST_TIMEOUT``.
FIRST_BYTE_TIMEOUT = 3.0
# Open connections per worker: ~1.5 KB each before the first byte, ~16 KB with TLS up.
WORKER_CONNECTIONS = 4096

# What the workers together may hold of requests: this share of the memory limit. The rest is
# the state and the decisions' working memory.
BUFFER_SHARE = 0.25
DEFAULT_BUFFERED_BYTES = 128 * 1024 * 1024  # per worker, with no memory limit to size from
# What a request costs a worker while a thread answers it, as a multiple of its size: the loop's
# buffer, gunicorn's copies as it reads the body (about 4x at their peak) and the decoded JSON.
# Measured as the growth of the worker's peak RSS (VmHWM) for one 3 MiB AdmissionReview: 4.0x
# for a review that is mostly one long string (a large annotation), 12.3x for one of many small
# objects (60,000 env entries: decoded, each is a dict and two strings). A request counts against
# ``--max-buffered-bytes`` once per byte while it arrives and this many times its size from the
# moment it is whole until its answer is out: bodies handed to threads are where memory grew.
PARSED_COST = 13


def parsed_cost(size: int) -> int:
    """What a whole request of ``size`` bytes is counted as, from its hand-over to a thread."""
    return PARSED_COST * size


def default_buffered_bytes(workers: int, max_body_bytes: int, memory_limit: int | None) -> int:
    """A worker's buffer budget: ``BUFFER_SHARE`` of the memory limit split across the workers
    (a fixed default without a limit), never less than one largest request once parsed."""
    budget = int(memory_limit * BUFFER_SHARE) // workers if memory_limit else DEFAULT_BUFFERED_BYTES
    return max(budget, parsed_cost(max_body_bytes + MAX_HEAD))


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
