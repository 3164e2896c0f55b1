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
Lease is read and written, and the decision counts the entries of both. The table mirrors what
the replica last read of the Lease, so a bind that waited for a sibling's decision on the same
node is decided with what that sibling wrote, and a denial needs no round trip. A reservation
stops counting when the state shows the pod bound (its own record then counts, never both),
deleted or terminal, after its TTL, or, for one made by an unauthenticated caller, when the
state has not shown the pod on its node within its confirmation time; it is dropped from the
store only then, since another worker's or replica's watch may lag.

Waiting is bounded twice (``Budget``): for siblings (the table's lock, Lease conflicts) by
``waitSeconds`` — past it the bind is denied ``Busy``, so the scheduler retries — and for
the API server by ``deadlineSeconds`` a call — a slower answer is an outage (``DeadlineExceeded``).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import math
import mmap
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..kube.ports import HostPort
from .apiserver import ApiError, ApiServer
from .model import ClusterState, NodeUsage, PodRecord
from .source import StateSource

ANNOTATION = "admit-guard.io/reservations"
LEASE_PREFIX = "admit-guard-node-"
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


def lease_name(node: str) -> str:
    """The Lease that holds a node's reservations."""
    return bounded_name(LEASE_PREFIX, node, MAX_OBJECT_NAME)


def table_file_name(node: str) -> str:
    return bounded_name("", node, MAX_FILE_NAME, ".table")


@dataclass(frozen=True, slots=True)
class Reservation:
    pod: str  # the pod's key in the state (its uid)
    node: str
    requests: dict[str, int]
    host_ports: tuple[HostPort, ...]
    expires: float
    # An unauthenticated caller's reservation ends here unless the state shows the pod on its
    # node by then: a forged review holds capacity for seconds, not a TTL. None: until the TTL.
    confirm_by: float | None = None

    def as_json(self) -> dict[str, Any]:
        data = {
            "pod": self.pod,
            "node": self.node,
            "requests": self.requests,
            "hostPorts": [list(p) for p in self.host_ports],
            "expires": self.expires,
        }
        if self.confirm_by is not None:
            data["confirmBy"] = self.confirm_by
        return data

    @classmethod
    def from_json(cls, data: Any) -> Reservation | None:
        try:
            confirm_by = data.get("confirmBy")
            return cls(
                str(data["pod"]),
                str(data["node"]),
                {str(k): int(v) for k, v in data["requests"].items()},
                tuple((str(p[0]), str(p[1]), int(p[2])) for p in data.get("hostPorts") or ()),
                float(data["expires"]),
                float(confirm_by) if confirm_by is not None else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None  # a foreign or damaged entry holds nothing

    @classmethod
    def of(
        cls, record: PodRecord, node: str, ttl: float, now: float, confirm_within: float | None = None
    ) -> Reservation:
        requests = {r: a for r, a in record.requests.items() if a}
        confirm_by = now + confirm_within if confirm_within is not None else None
        return cls(record.key, node, requests, record.host_ports, now + ttl, confirm_by)


def kept(reservation: Reservation, state: ClusterState, now: float) -> bool:
    """Whether a stored reservation is written back: until its TTL, unless the pod ended, or its
    confirmation time passed without the state showing the pod on its node.

    A pod this state shows bound is kept too: another worker or replica whose watch lags still
    sees it pending, without its record in the node's usage, and must count the reservation.
    """
    if reservation.expires <= now or reservation.pod in state.ended:
        return False
    if reservation.confirm_by is None or now < reservation.confirm_by:
        return True
    record = state.pods.get(reservation.pod)
    return record is not None and record.node == reservation.node


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


def merged(*stores: list[Reservation]) -> list[Reservation]:
    """One entry per pod over several stores' entries (the first seen wins), in order."""
    seen: dict[str, Reservation] = {}
    for entries in stores:
        for reservation in entries:
            seen.setdefault(reservation.pod, reservation)
    return list(seen.values())


@dataclass(frozen=True, slots=True)
class Codec:
    """How a store's records are kept as JSON: ``load`` gives the records and whether any did not
    parse (damage); ``dump`` the JSON value to store. The stores below are the same for the
    bind guard's reservations and the storm breakers' probe slots; only the records differ."""

    load: Callable[[Any], tuple[Any, bool]]
    dump: Callable[[Any], Any]

    @classmethod
    def listing(cls, record: Any) -> Codec:
        """A list of ``record``s (``record.from_json`` gives one or None, ``.as_json`` its JSON):
        an entry that does not parse holds nothing, and marks the store damaged."""

        def load(raw: Any) -> tuple[list[Any], bool]:
            if raw is None:
                return [], False
            if not isinstance(raw, list):
                return [], True
            entries = [e for e in map(record.from_json, raw) if e is not None]
            return entries, len(entries) != len(raw)

        return cls(load, lambda entries: [e.as_json() for e in entries])


RESERVATIONS = Codec.listing(Reservation)


# ``decide(stored) -> bool``: given every reservation a store holds for the node (the new pod's
# own included, for the caller to set aside), whether the new one fits. ``reserve`` returns that
# verdict and, when it is True and ``write`` is set, stores the new reservation beside the
# ``keep`` ones (``keep(r)``: whether an old entry is written back; called after ``decide``).
Decide = Callable[[list[Reservation]], bool]
Keep = Callable[[Reservation], bool]


@dataclass(frozen=True, slots=True)
class Budget:
    """How long one decision may take, how long it may wait for its siblings, and how long one
    API call may take.

    The whole decision ends by ``until``, below the webhook's timeout: an answer after it would
    be the API server's ``failurePolicy`` (an allocation or bind unchecked), so past it the
    decision is ``Busy`` and denied, never late. Waiting for a sibling decision on the same key
    (the table's lock, a Lease another writer just replaced) ends by ``wait_until``, also
    ``Busy``. An API call gets ``call_seconds`` (what is left of the budget, if less): only an
    API server slower than ``call_seconds`` is an outage and fails open.
    """

    wait_until: float  # time.monotonic()
    call_seconds: float
    until: float = math.inf  # time.monotonic()

    @classmethod
    def start(cls, wait_seconds: float, call_seconds: float, total_seconds: float = math.inf) -> Budget:
        now = time.monotonic()
        until = now + total_seconds
        return cls(min(now + wait_seconds, until), call_seconds, until)

    def waiting(self) -> float:
        return max(0.0, self.wait_until - time.monotonic())

    def left(self) -> float:
        return self.until - time.monotonic()

    def call_timeout(self, what: str) -> float:
        """The timeout of the next API call; ``Busy`` when the decision's budget is spent."""
        left = self.left()
        if left <= 0:
            raise Busy(f"the decision's time budget ran out before {what}")
        return min(self.call_seconds, left)


class Busy(Exception):
    """Sibling decisions on the same node held it past the wait budget, or the decision's time
    budget ran out: retry later."""


class DeadlineExceeded(Exception):
    """The API server took longer than the deadline to answer one coordination call."""


class LeaseFull(Exception):
    """A Lease cannot take the records (the API server's annotation limit): not an outage."""


@dataclass(slots=True)
class HeldTable:
    """One key's records while this thread holds its lock, and whether they were found damaged
    (then read as empty: the caller rebuilds them from the Lease and the state)."""

    entries: Any  # the codec's records: a node's reservations, an owner's probe slot
    damaged: bool
    _file: _TableFile

    def store(self, entries: Any) -> None:
        self._file.write(entries)
        self.entries, self.damaged = entries, False


class LocalTable:
    """Records shared by the workers of one replica: a memory-mapped file per key (a node's
    reservations, by default), under ``flock``.

    The file holds a header (a generation, bumped on every write, and where the entries are)
    and the entries as JSON. Each worker keeps the entries it last read or wrote with their generation,
    so a node whose last write was its own is decided without parsing. Threads of one worker
    queue on a lock of their own first (a timed wait, no polling), so only the other workers'
    holds are waited out on the file lock. Inside the hold nothing gives up the interpreter: the
    file is read and written through its mapping, and the lock is taken without blocking
    (``_try_flock``). A thread that released the interpreter there would hand it to another
    thread for a whole switch interval while the node stays locked for every worker; measured
    under load, that convoy cost more than the rest of the table together. Files only grow, so
    a mapping never points past the end of its own writes; a file cut short by anything else is
    found before its mapping is touched (a store past the end would be SIGBUS). Each worker
    keeps up to ``OPEN_FILES`` descriptors (a file and its mapping's) open; files opened before
    a fork are never used after it: ``flock`` would not keep the processes apart on a shared
    open file.
    """

    OPEN_FILES = 128

    def __init__(self, directory: Path, codec: Codec = RESERVATIONS) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.codec = codec
        self._pid = os.getpid()
        self._locks: dict[str, threading.Lock] = {}
        self._files: dict[str, _TableFile] = {}  # node → open file, used only under its lock
        self._guard = threading.Lock()

    @contextmanager
    def locked(self, node: str, wait_until: float) -> Iterator[HeldTable]:
        """The key's records, locked against every other thread and worker of the replica.

        Raises ``Busy`` when others hold the lock past ``wait_until`` (monotonic), ``OSError``
        when the table cannot be opened, read or written."""
        lock = self._lock(node)
        if not lock.acquire(timeout=max(0.0, wait_until - time.monotonic())):
            raise Busy(f"waiting for the lock of {self._path(node)}")
        try:
            table = self._files.get(node) or _TableFile(self._path(node), self.codec)
            try:
                _flock(table.fd, wait_until, table.path)
                try:
                    entries, damaged = table.read()
                    yield HeldTable(entries, damaged, table)
                finally:
                    _unlock(table.fd)
            finally:
                self._keep_open(node, table)
        finally:
            lock.release()

    def reserve(
        self, new: Reservation, decide: Decide, keep: Keep, *, write: bool = True, deadline: float
    ) -> bool:
        """``decide`` over the node's entries; when it fits (and ``write``), store ``new`` beside
        the ``keep`` ones. ``deadline``: how long to wait for the lock (monotonic)."""
        with self.locked(new.node, deadline) as held:
            fits = decide(held.entries)
            if fits and write:
                held.store(_after(held.entries, new, keep))
            return fits

    def entries(self, node: str, deadline: float) -> list[Reservation]:
        """What the table holds for ``node`` (all of it: the caller judges what still counts)."""
        with self.locked(node, deadline) as held:
            return list(held.entries)

    def _path(self, node: str) -> Path:
        return self.directory / table_file_name(node)

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

    __slots__ = ("codec", "entries", "fd", "generation", "length", "map", "offset", "path")

    def __init__(self, path: Path, codec: Codec) -> None:
        self.path = path
        self.codec = codec
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        self.map: mmap.mmap | None = None
        self.generation = -1
        self.offset = self.length = 0
        self.entries, _ = codec.load(None)

    def read(self) -> tuple[Any, bool]:
        """Under the file lock: the entries, and whether the file was found damaged (a header
        pointing past the end, entries that do not parse, a file cut short under its mapping).
        Unparsed unless another worker wrote since this one last looked."""
        damaged = self._cut_short()
        table = self._mapping(_HEADER.size)
        generation, offset, length = _HEADER.unpack_from(table)
        if generation != self.generation or damaged:
            table = self._mapping(offset + length, grow=False) if offset >= _HEADER.size else None
            if table is None:  # nothing written yet, or entries past the end of the file (damage)
                damaged = damaged or generation != 0 or offset != 0 or length != 0
                offset = length = 0
            data = table[offset : offset + length] if table else None
            self.entries, unreadable = _decoded(data, self.codec)
            damaged = damaged or unreadable
            self.generation, self.offset, self.length = generation, offset, length
        return self.entries, damaged

    def write(self, entries: Any) -> None:
        """Under the file lock, after ``read``."""
        data = orjson.dumps(self.codec.dump(entries))
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

    def _cut_short(self) -> bool:
        """Whether the file is now shorter than this worker's mapping of it (truncated by
        something other than the guard): the mapping is dropped before any access past the end
        can kill the worker, and the file is read again from what is left."""
        if self.map is None or os.fstat(self.fd).st_size >= len(self.map):
            return False
        self.map.close()
        self.map = None
        self.generation = -1
        return True

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


def _flock(fd: int, wait_until: float, path: Path) -> None:
    """The file lock another worker may hold for its own decision."""
    pause = 0.00005
    while not _try_flock(fd):
        if time.monotonic() >= wait_until:
            raise Busy(f"waiting for the lock of {path}")
        time.sleep(pause)
        pause = min(2 * pause, 0.002)


def _after(stored: list[Reservation], new: Reservation, keep: Keep) -> list[Reservation]:
    return [*(r for r in stored if r.pod != new.pod and keep(r)), new]


def _decoded(data: bytes | str | None, codec: Codec) -> tuple[Any, bool]:
    """The records in ``data``, and whether any of it did not parse (damage)."""
    try:
        return codec.load(orjson.loads(data) if data else None)
    except orjson.JSONDecodeError:
        return codec.load(None)[0], True


# apimachinery's ``TotalAnnotationSizeLimitB``: the bytes of an object's annotations, keys
# included, past which the API server refuses the write (422).
ANNOTATIONS_LIMIT = 256 * 1024


@dataclass(slots=True)
class LeaseRead:
    """One Lease as read (a new one when it did not exist), and the records it holds."""

    name: str
    lease: dict[str, Any]
    exists: bool
    records: Any


class LeaseStore:
    """Records coordinated through the API server: one Lease per key (a node's reservations, by
    default) holding them in an annotation, replaced with optimistic concurrency. A Lease left
    with no record is deleted (with its resourceVersion as the precondition), so the Leases of
    nodes and pools that come and go do not pile up."""

    def __init__(
        self,
        api: ApiServer,
        namespace: str,
        *,
        prefix: str = LEASE_PREFIX,
        annotation: str = ANNOTATION,
        codec: Codec = RESERVATIONS,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.prefix, self.annotation, self.codec = prefix, annotation, codec
        self.writes = 0  # API writes, for the benchmark's writes per bind
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    def reserve(
        self, new: Reservation, decide: Decide, keep: Keep, *, write: bool = True, budget: Budget
    ) -> tuple[bool, list[Reservation]]:
        """``decide`` over the Lease's entries and, when it fits (and ``write``), replace the
        Lease with ``new`` beside the ``keep`` ones: (the verdict, the entries last read)."""
        verdict: list = [False, []]

        def change(stored: list[Reservation]) -> list[Reservation] | None:
            fits = decide(stored)
            verdict[:] = [fits, stored]
            return _after(stored, new, keep) if fits and write else None

        written = self.update(new.node, change, budget)
        return (True, written) if written is not None else (verdict[0], verdict[1])

    def update(self, key: str, change: Callable[[Any], Any], budget: Budget) -> Any:
        """Read the key's records, ``change(records)`` (what to write, or None for nothing), and
        replace the Lease: the records written, or None. A 409 (another writer won) reads
        again and changes again, until ``budget.wait_until``: then ``Busy``. Raises
        ``DeadlineExceeded`` when one call takes longer than ``budget.call_seconds``,
        ``LeaseFull`` when the records do not fit, and ``ApiError`` when the API server fails."""
        while True:
            read = self.read(key, budget)
            changed = change(read.records)
            if changed is None:
                return None
            if self.write(read, changed, budget):
                return changed
            if budget.waiting() <= 0:
                raise Busy(f"Lease {self.namespace}/{read.name} kept changing under other writers")

    def read(self, key: str, budget: Budget) -> LeaseRead:
        """The key's Lease and its records. A Lease whose annotations are not what the guard
        writes (not a map, a record that does not parse) holds nothing it can count."""
        name = bounded_name(self.prefix, key, MAX_OBJECT_NAME)
        status, lease = self._call(budget, "GET", f"{self._path}/{name}", None, name)
        if status == 404:
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name}}
        elif status != 200:
            raise ApiError(status, f"GET Lease {self.namespace}/{name}: {lease.get('message', '')}")
        return LeaseRead(name, lease, status == 200, self._records(lease))

    def write(self, read: LeaseRead, records: Any, budget: Budget) -> bool:
        """Replace the Lease read with ``records`` (delete it when they are empty): False when
        another writer changed it since (read again)."""
        name, lease = read.name, read.lease
        metadata = lease.setdefault("metadata", {})
        if not isinstance(metadata, dict):
            metadata = lease["metadata"] = {"name": name}
        if not self.codec.dump(records):
            return self._delete(read, budget)
        annotations = metadata.get("annotations")
        annotations = dict(annotations) if isinstance(annotations, dict) else {}
        value = orjson.dumps(self.codec.dump(records)).decode()
        annotations[self.annotation] = value
        size = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())
        if size > ANNOTATIONS_LIMIT:
            raise LeaseFull(f"Lease {self.namespace}/{name} would hold {size} bytes of annotations")
        metadata["annotations"] = annotations
        if read.exists:
            status, answer = self._call(budget, "PUT", f"{self._path}/{name}", lease, name)
        else:
            status, answer = self._call(budget, "POST", self._path, lease, name)
        self.writes += 1
        if status in (200, 201):
            return True
        if status == 409 or (status == 404 and read.exists):  # another writer won (or deleted it)
            return False
        if status == 422:
            raise LeaseFull(f"write Lease {self.namespace}/{name}: {answer.get('message', '')}")
        raise ApiError(status, f"write Lease {self.namespace}/{name}: {answer.get('message', '')}")

    def collect(self, ended: Callable[[Any], bool], budget: Budget) -> int:
        """Delete this store's Leases every record of which has ``ended``: how many went. A Lease
        changed since it was listed is left for the next collection."""
        status, listing = self._call(budget, "GET", self._path, None, "*")
        if status != 200:
            raise ApiError(status, f"list Leases {self.namespace}: {listing.get('message', '')}")
        items = listing.get("items")
        deleted = 0
        for lease in items if isinstance(items, list) else ():
            metadata = lease.get("metadata") if isinstance(lease, dict) else None
            name = metadata.get("name") if isinstance(metadata, dict) else None
            if not isinstance(name, str) or not name.startswith(self.prefix):
                continue
            records = self._records(lease)
            if all(ended(r) for r in records) and self._delete(LeaseRead(name, lease, True, records), budget):
                deleted += 1
        return deleted

    def _records(self, lease: dict[str, Any]) -> Any:
        metadata = lease.get("metadata")
        annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
        raw = annotations.get(self.annotation) if isinstance(annotations, dict) else None
        return _decoded(raw if isinstance(raw, str) else None, self.codec)[0]

    def _delete(self, read: LeaseRead, budget: Budget) -> bool:
        if not read.exists:
            return True
        version = (read.lease.get("metadata") or {}).get("resourceVersion")
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"resourceVersion": version}}
        status, answer = self._call(budget, "DELETE", f"{self._path}/{read.name}", options, read.name)
        self.writes += 1
        if status in (200, 202, 404):
            return True
        if status == 409:
            return False
        raise ApiError(status, f"delete Lease {self.namespace}/{read.name}: {answer.get('message', '')}")

    def _call(
        self, budget: Budget, method: str, path: str, body: dict | None, name: str
    ) -> tuple[int, dict[str, Any]]:
        timeout = budget.call_timeout(f"{method} Lease {self.namespace}/{name}")
        started = time.monotonic()
        try:
            return self.api.request_json(method, path, body, timeout=timeout)
        except ApiError:
            if time.monotonic() - started < timeout:
                raise
            if timeout < budget.call_seconds:  # cut short by the decision's budget, not slow
                raise Busy(f"the decision's time budget ran out during {method} Lease {name}") from None
            raise DeadlineExceeded(
                f"{method} Lease {self.namespace}/{name} took over {budget.call_seconds:g} s"
            ) from None


def collect_ended(
    store: LeaseStore,
    kept: Callable[[Any, ClusterState, float], bool],
    source: StateSource,
    now: float,
    budget: Budget | None = None,
) -> int:
    """Delete ``store``'s Leases every record of which is no longer ``kept`` in the state: how
    many went. The state's lock is held for each record's verdict, never across a round trip;
    without a state nothing is judged ended."""

    def ended(record: Any) -> bool:
        with source.reading() as view:
            return view.state is not None and not kept(record, view.state, now)

    return store.collect(ended, budget or Budget.start(0.0, 1.0, 10.0))
