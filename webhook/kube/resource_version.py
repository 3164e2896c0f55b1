"""The order of two resourceVersions of one object, as the API server defines it since v1.35.

A resourceVersion was opaque until KEP-5504 made it comparable: a well-formed one is a positive
integer without leading zeros, and a longer one is newer (``k8s.io/apimachinery/pkg/util/
resourceversion: CompareResourceVersion``, Kubernetes v1.35). The guard needs the order to tell
a state older than a write it has allowed (the watch is late) from one that changed after it.
"""

from __future__ import annotations


def compare_resource_versions(a: str, b: str) -> int | None:
    """-1, 0 or 1 as ``a`` is older than, the same as, or newer than ``b``; None when either is
    not well formed (a server that does not number its versions: no order can be read)."""
    if not (_well_formed(a) and _well_formed(b)):
        return None
    if len(a) != len(b):
        return -1 if len(a) < len(b) else 1
    return (a > b) - (a < b)


def _well_formed(version: str) -> bool:
    return version.isascii() and version.isdigit() and version[0] != "0"
