"""Capacity held for allowed binds until the watch shows the pod bound.

Between an allowed bind and the watch event that shows the pod on its node, another bind must
not be handed the same capacity: not by another thread, another gunicorn worker, or another
replica of the guard. Two stores, both "read, re-check, write":

- ``LocalTable``: one memory-mapped file per node in a directory the workers of one replica
  share (the pod's ``/tmp``), under ``flock``. Enough for pods whose resources only this
  replica's binds race for in practice (cpu, memory), and no API writes.
- ``LeaseStore``: one ``coordination.k8s.io/v1`` Lease per node in the guard's namespace,
  holding that node's reservations in an annotation, replaced with its ``resourceVersion``:
  a 409 means another writer won, so read again and re-check. The API server (etcd) is the
  only arbiter; the guard builds no consensus of its own.

A coordinated bind goes through both: the replica's table is locked for the node while the
Lease is read and written, and the decision counts the entries of both (the table mirrors the
replica's Lease entries), so a cpu-only bind sees the cpu a GPU bind reserved, and the other way
round. A reservation stops counting when the state shows the pod bound (its own record then
counts, never both), deleted or terminal, or after its TTL; it is dropped from the store only
when the pod ended or the TTL passed, since another worker's or replica's watch may lag.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..kube.ports import HostPort
from .apiserver import ApiError, ApiServer
from .model import ClusterState, NodeUsage, PodRecord

ANNOTATION = "admit-guard.io/reservations"
LEASE_PREFIX = "admit-guard-node-"


@dataclass(frozen=True, slots=True)
class Reservation:
    pod: str  # the pod's key in the state (its uid)
    node: str
    requests: dict[str, int]
    host_ports: tuple[HostPort, ...]
    expires: float

    def as_json(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "node": self.node,
            "requests": self.requests,
            "hostPorts": [list(p) for p in self.host_ports],
            "expires": self.expires,
        }

    @classmethod
    def from_json(cls, data: Any) -> Reservation | None:
        try:
            return cls(
                str(data["pod"]),
                str(data["node"]),
                {str(k): int(v) for k, v in data["requests"].items()},
                tuple((str(p[0]), str(p[1]), int(p[2])) for p in data.get("hostPorts") or ()),
                float(data["expires"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None  # a foreign or damaged entry holds nothing

    @classmethod
    def of(cls, record: PodRecord, node: str, ttl: float, now: float) -> Reservation:
        requests = {r: a for r, a in record.requests.items() if a}
        return cls(record.key, node, requests, record.host_ports, now + ttl)


def kept(reservation: Reservation, state: ClusterState, now: float) -> bool:
    """Whether a stored reservation is written back: until its TTL, unless the pod ended.

    A pod this state shows bound is kept too: another worker or replica whose watch lags still
    sees it pending, without its record in the node's usage, and must count the reservation.
    """
    return reservation.expires > now and reservation.pod not in state.ended


def counts(reservation: Reservation, state: ClusterState, now: float) -> bool:
    """Whether a reservation adds to the node's usage in this state: kept, and the pod not yet
    bound here (once bound its own record counts, never both). A pod this state has not seen
    yet (a created one, or a watch behind another replica's) counts until its TTL."""
    if not kept(reservation, state, now):
        return False
    record = state.pods.get(reservation.pod)
    return record is None or not record.node


def usage_with(usage: NodeUsage, reservations: list[Reservation]) -> NodeUsage:
    """The node's usage as if every reserved pod were already bound there."""
    if not reservations:
        return usage
    requested = dict(usage.requested)
    ports = usage.host_ports.copy()
    pods = dict(usage.pods)
    for reservation in reservations:
        for resource, amount in reservation.requests.items():
            requested[resource] = requested.get(resource, 0) + amount
        ports.update(reservation.host_ports)
        pods[f"reserved/{reservation.pod}"] = PodRecord(
            reservation.pod, reservation.node, reservation.requests, reservation.host_ports, "", None, False
        )
    return NodeUsage(requested, pods, ports)


# ``decide(stored) -> bool``: given every reservation a store holds for the node (the new pod's
# own included, for the caller to set aside), whether the new one fits. ``reserve`` returns that
# verdict and, when it is True and ``write`` is set, stores the new reservation beside the
# ``keep`` ones (``keep(r)``: whether an old entry is written back; called after ``decide``).
Decide = Callable[[list[Reservation]], bool]
Keep = Callable[[Reservation], bool]


class DeadlineExceeded(Exception):
    """The coordination did not finish within the decision's deadline."""


class LocalTable:
    """Reservations shared by the workers of one replica: a memory-mapped file per node, under
    ``flock``.

    The file holds a header (a generation, bumped on every write, and where the entries are)
    and the entries as JSON. Each worker keeps the entries it last read or wrote with their generation,
    so a node whose last write was its own is decided without parsing. Threads of one worker
    queue on a lock of their own first (a timed wait, no polling), so only the other workers'
    holds are waited out on the file lock. Inside the hold nothing gives up the interpreter: the
    file is read and written through its mapping, and the lock is taken without blocking
    (``_try_flock``). A thread that released the interpreter there would hand it to another
    thread for a whole switch interval while the node stays locked for every worker; measured
    under load, that convoy cost more than the rest of the table together. Files only grow, so
    a mapping never points past the end of its file. Each worker keeps up to ``OPEN_FILES``
    descriptors (a file and its mapping's) open; files opened before a fork are never used
    after it: ``flock`` would not keep the processes apart on a shared open file.
    """

    OPEN_FILES = 128

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._pid = os.getpid()
        self._locks: dict[str, threading.Lock] = {}
        self._files: dict[str, _TableFile] = {}  # node → open file, used only under its lock
        self._guard = threading.Lock()

    def reserve(
        self, new: Reservation, decide: Decide, keep: Keep, *, write: bool = True, deadline: float
    ) -> bool:
        """Raises ``DeadlineExceeded`` when another thread or worker holds the node's lock past
        the deadline, ``OSError`` when the table cannot be read or written."""
        lock = self._lock(new.node)
        if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise DeadlineExceeded(f"waiting for the lock of {self._path(new.node)}")
        try:
            table = self._files.get(new.node) or _TableFile(self._path(new.node))
            try:
                _flock(table.fd, deadline, table.path)
                try:
                    stored = table.read()
                    fits = decide(stored)
                    if fits and write:
                        table.write(_after(stored, new, keep))
                    return fits
                finally:
                    _unlock(table.fd)
            finally:
                self._keep_open(new.node, table)
        finally:
            lock.release()

    def entries(self, node: str, deadline: float) -> list[Reservation]:
        """What the table holds for ``node`` (all of it: the caller judges what still counts)."""
        seen: list[Reservation] = []
        probe = Reservation("", node, {}, (), 0.0)
        self.reserve(probe, lambda stored: seen.extend(stored) or False, bool, write=False, deadline=deadline)
        return seen

    def _path(self, node: str) -> Path:
        return self.directory / f"{node}.table"

    def _lock(self, node: str) -> threading.Lock:
        with self._guard:
            if self._pid != os.getpid():  # a forked child: its own locks and files
                self._pid, self._locks, self._files = os.getpid(), {}, {}
            lock = self._locks.get(node)
            if lock is None:
                lock = self._locks[node] = threading.Lock()
            return lock

    def _keep_open(self, node: str, table: _TableFile) -> None:
        """Called holding the node's lock: keep its file open while there is room, else close it."""
        with self._guard:
            if self._files.get(node) is table or 2 * len(self._files) < self.OPEN_FILES:
                self._files[node] = table
                return
        table.close()


_HEADER = struct.Struct("<QQQ")  # generation; where the JSON starts, and its length
_MIN_FILE = 4096


class _TableFile:
    """One node's file, mapped; the entries last read or written, with their generation.

    A write never touches the entries the header points to: the new JSON goes after them (or
    before them, when there is room and none after), and only then does the header move to it.
    A worker killed mid-write leaves the previous entries whole. The file is allocated as it
    grows (``posix_fallocate``): a sparse file on a full disk would kill the worker with SIGBUS
    at the first store into its mapping, where the allocation fails with ``ENOSPC``.
    """

    __slots__ = ("entries", "fd", "generation", "length", "map", "offset", "path")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        self.map: mmap.mmap | None = None
        self.generation = -1
        self.offset = self.length = 0
        self.entries: list[Reservation] = []

    def read(self) -> list[Reservation]:
        """Under the file lock. Unparsed unless another worker wrote since this one last looked."""
        table = self._mapping(_HEADER.size)
        generation, offset, length = _HEADER.unpack_from(table)
        if generation != self.generation:
            table = self._mapping(offset + length, grow=False) if offset >= _HEADER.size else None
            if table is None:  # nothing written yet, or entries past the end of the file (damage)
                offset = length = 0
            self.entries = _entries(table[offset : offset + length]) if table else []
            self.generation, self.offset, self.length = generation, offset, length
        return self.entries

    def write(self, entries: list[Reservation]) -> None:
        """Under the file lock, after ``read``."""
        data = orjson.dumps([r.as_json() for r in entries])
        start = max(self.offset + self.length, _HEADER.size)
        if (
            self.map is not None
            and start + len(data) > len(self.map)
            and _HEADER.size + len(data) <= self.offset
        ):
            start = _HEADER.size  # the room before the current entries
        table = self._mapping(start + len(data))
        table[start : start + len(data)] = data
        _HEADER.pack_into(table, 0, self.generation + 1, start, len(data))
        self.generation, self.offset, self.length = self.generation + 1, start, len(data)
        self.entries = entries

    def _mapping(self, size: int, *, grow: bool = True) -> mmap.mmap | None:
        """A mapping of at least ``size`` bytes: the file grows (doubling) when it is shorter,
        or, without ``grow``, ``None``."""
        if self.map is not None and len(self.map) >= size:
            return self.map
        length = os.fstat(self.fd).st_size
        if length < size:
            if not grow:
                return None
            length = max(_MIN_FILE, 1 << (size - 1).bit_length())
            _allocate(self.fd, length)
        mapped = mmap.mmap(self.fd, length)  # the old mapping stays usable if this fails
        if self.map is not None:
            self.map.close()
        self.map = mapped
        return mapped

    def close(self) -> None:
        if self.map is not None:
            self.map.close()
        os.close(self.fd)


def _allocate(fd: int, length: int) -> None:
    """Grow the file to ``length`` bytes with its blocks allocated; merely extended where the
    filesystem cannot allocate ahead (then a full disk is found by the stores, as SIGBUS)."""
    try:
        os.posix_fallocate(fd, 0, length)
    except OSError as err:
        if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, length)


def _libc_flock() -> Callable[[int, int], int] | None:
    """``flock(2)`` called with the interpreter held (``PyDLL``): ``fcntl.flock`` releases it
    even for a non-blocking attempt. ``None`` where the C library cannot be loaded."""
    try:
        call = ctypes.PyDLL(None, use_errno=True).flock
    except (OSError, AttributeError):
        return None
    call.argtypes, call.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return call


_LIBC_FLOCK = _libc_flock()


def _try_flock(fd: int) -> bool:
    if _LIBC_FLOCK is None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
    if _LIBC_FLOCK(fd, fcntl.LOCK_EX | fcntl.LOCK_NB) == 0:
        return True
    error = ctypes.get_errno()
    if error in (errno.EWOULDBLOCK, errno.EINTR):
        return False
    raise OSError(error, os.strerror(error))


def _unlock(fd: int) -> None:
    if _LIBC_FLOCK is None or _LIBC_FLOCK(fd, fcntl.LOCK_UN) != 0:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _flock(fd: int, deadline: float, path: Path) -> None:
    """The file lock another worker may hold for its own decision (bounded by its deadline)."""
    pause = 0.00005
    while not _try_flock(fd):
        if time.monotonic() >= deadline:
            raise DeadlineExceeded(f"waiting for the lock of {path}")
        time.sleep(pause)
        pause = min(2 * pause, 0.002)


def _after(stored: list[Reservation], new: Reservation, keep: Keep) -> list[Reservation]:
    return [*(r for r in stored if r.pod != new.pod and keep(r)), new]


def _entries(data: bytes | str | None) -> list[Reservation]:
    try:
        raw = orjson.loads(data) if data else []
    except orjson.JSONDecodeError:
        return []
    return [r for r in map(Reservation.from_json, raw if isinstance(raw, list) else []) if r is not None]


class LeaseStore:
    """Reservations coordinated through the API server: one Lease per node, optimistic writes."""

    def __init__(self, api: ApiServer, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.writes = 0  # API writes, for the benchmark's writes per bind

    def reserve(
        self, new: Reservation, decide: Decide, keep: Keep, *, write: bool = True, deadline: float
    ) -> bool:
        """Raises ``ApiError`` (the API server failed) or ``DeadlineExceeded``."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"
        name = LEASE_PREFIX + new.node
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeadlineExceeded(f"coordinating on Lease {self.namespace}/{name}")
            status, lease = self.api.request_json("GET", f"{path}/{name}", timeout=remaining)
            if status == 404:
                lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name}}
            elif status != 200:
                raise ApiError(status, f"GET Lease {self.namespace}/{name}: {lease.get('message', '')}")
            metadata = lease.setdefault("metadata", {})
            annotations = metadata.get("annotations") or {}
            stored = _entries(annotations.get(ANNOTATION))
            fits = decide(stored)
            if not fits or not write:
                return fits
            metadata["annotations"] = {
                **annotations,
                ANNOTATION: orjson.dumps([r.as_json() for r in _after(stored, new, keep)]).decode(),
            }
            remaining = max(0.001, deadline - time.monotonic())
            if status == 404:
                status, answer = self.api.request_json("POST", path, lease, timeout=remaining)
            else:
                status, answer = self.api.request_json("PUT", f"{path}/{name}", lease, timeout=remaining)
            self.writes += 1
            if status in (200, 201):
                return True
            if status != 409:  # 409: another writer won; read again and re-check
                raise ApiError(status, f"write Lease {self.namespace}/{name}: {answer.get('message', '')}")
