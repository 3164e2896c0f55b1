"""Names the API server and the filesystem accept for a key (a node, a pool, an owner): the
key itself while it is a short DNS subdomain, else a readable head and a hash of all of it."""

from __future__ import annotations

import hashlib
import re

MAX_OBJECT_NAME = 253  # a DNS subdomain: the longest Lease name the API server takes
MAX_FILE_NAME = 255  # bytes, on every filesystem the guard runs on (ext4, xfs, tmpfs, overlay)
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


def bounded_name(prefix: str, name: str, limit: int, suffix: str = "") -> str:
    """``prefix + name + suffix`` when that is a safe name within ``limit`` characters; else a
    readable head of ``name`` and a hash of all of it, still a DNS subdomain. A 253-character
    node name (legal) would overflow both a Lease name and a file name."""
    whole = f"{prefix}{name}{suffix}"
    if len(whole) <= limit and _DNS_SUBDOMAIN.fullmatch(name):
        return whole
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    room = limit - len(prefix) - len(suffix) - len(digest) - 1
    head = re.sub(r"[^-a-z0-9.]", "-", name.lower())[: max(room, 0)].rstrip(".-")
    return f"{prefix}{head}-{digest}{suffix}" if head else f"{prefix}{digest}{suffix}"


def table_file_name(node: str) -> str:
    return bounded_name("", node, MAX_FILE_NAME, ".table")
