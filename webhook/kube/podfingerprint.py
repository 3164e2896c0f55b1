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

PREFIX = "pfp0"
VERSION = "v001"
METHOD_ATTRIBUTE = "nodeTopologyPodsFingerprintMethod"
METHOD_ALL = "all"
METHOD_WITH_EXCLUSIVE_RESOURCES = "with-exclusive-resources"

_MASK = (1 << 64) - 1
_P1 = 11400714785074694791
_P2 = 14029467366897019727
_P3 = 1609587929392839161
_P4 = 9650029242287828579
_P5 = 2870177450012600261


def _rotl(value: int, bits: int) -> int:
    return ((value << bits) | (value >> (64 - bits))) & _MASK


def _round(acc: int, lane: int) -> int:
    return _rotl((acc + lane * _P2) & _MASK, 31) * _P1 & _MASK


def _merge(acc: int, value: int) -> int:
    return ((acc ^ _round(0, value)) * _P1 + _P4) & _MASK


def xxh64(data: bytes, seed: int = 0) -> int:
    """XXH64 of ``data`` (the reference algorithm, as ``OneOfOne/xxhash.Checksum64S`` computes it)."""
    length, i = len(data), 0
    if length >= 32:
        v1, v2 = (seed + _P1 + _P2) & _MASK, (seed + _P2) & _MASK
        v3, v4 = seed, (seed - _P1) & _MASK
        while i + 32 <= length:
            a, b, c, d = struct.unpack_from("<4Q", data, i)
            v1, v2, v3, v4 = _round(v1, a), _round(v2, b), _round(v3, c), _round(v4, d)
            i += 32
        h = (_rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)) & _MASK
        for v in (v1, v2, v3, v4):
            h = _merge(h, v)
    else:
        h = (seed + _P5) & _MASK
    h = (h + length) & _MASK
    while i + 8 <= length:
        (lane,) = struct.unpack_from("<Q", data, i)
        h = (_rotl(h ^ _round(0, lane), 27) * _P1 + _P4) & _MASK
        i += 8
    if i + 4 <= length:
        (word,) = struct.unpack_from("<I", data, i)
        h = (_rotl(h ^ (word * _P1 & _MASK), 23) * _P2 + _P3) & _MASK
        i += 4
    while i < length:
        h = _rotl(h ^ (data[i] * _P5 & _MASK), 11) * _P1 & _MASK
        i += 1
    h ^= h >> 33
    h = h * _P2 & _MASK
    h ^= h >> 29
    h = h * _P3 & _MASK
    return h ^ (h >> 32)


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
