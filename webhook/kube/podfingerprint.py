"""The fingerprint of a set of pods, as NRT exporters publish it in ``nodeTopologyPodsFingerprint``.

A transcription of ``github.com/k8stopologyawareschedwg/podfingerprint`` (``podfingerprint.go``):
``Fingerprint.addHash`` hashes each pod as ``xxhash.ChecksumString64S(name,
xxhash.ChecksumString64(namespace))`` (``github.com/OneOfOne/xxhash``: XXH64, the namespace's
hash the seed of the name's), ``Fingerprint.Sum`` sorts those hashes, writes each little-endian
into one XXH64 digest (seed 0) and returns it big-endian, and ``Fingerprint.Sign`` is
``"pfp0" + "v001" + hex(Sum)``. The set of pods is unordered: the sort makes it so.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

import xxhash

PREFIX = "pfp0"
VERSION = "v001"
METHOD_ATTRIBUTE = "nodeTopologyPodsFingerprintMethod"
METHOD_ALL = "all"
METHOD_WITH_EXCLUSIVE_RESOURCES = "with-exclusive-resources"


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 of ``data``, as ``OneOfOne/xxhash.Checksum64S`` computes it. The xxhash library's C
    code: a transcription in Python cost ~10 µs a pod, and every bound pod is hashed."""
    return xxhash.xxh64_intdigest(data, seed)


_namespaces: dict[str, int] = {}  # a cluster has few namespaces: each hashed once


def pod_hash(namespace: str, name: str) -> int:
    """``Fingerprint.addHash``: the name hashed with its namespace's hash as the seed."""
    seed = _namespaces.get(namespace)
    if seed is None:
        seed = xxh64(namespace.encode())
        if len(_namespaces) < 65_536:
            _namespaces[namespace] = seed
    return xxh64(name.encode(), seed)


def sign(hashes: Iterable[int]) -> str:
    """``Fingerprint.Sign`` over the pods' ``pod_hash`` values."""
    ordered = sorted(hashes)
    digest = xxh64(struct.pack(f"<{len(ordered)}Q", *ordered))
    return PREFIX + VERSION + digest.to_bytes(8, "big").hex()
