"""The replica's table: records shared by the workers of one replica, a memory-mapped file per
key in a directory they share (the pod's ``/tmp``), under ``flock``."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import orjson

from ..state import waiting
from .budget import Busy
from .names import table_file_name


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


@dataclass(slots=True)
class HeldTable:
    """One key's records while this thread holds its lock, and whether they were found damaged
    (then read as empty: the caller rebuilds them from the Lease and the state)."""

    entries: Any  # the codec's records: a node's reservations, an owner's probe slot
    damaged: bool
    _file: _TableFile
    _release: Callable[[], None]

    def store(self, entries: Any) -> None:
        self._file.write(entries)
        self.entries, self.damaged = entries, False

    def release(self) -> None:
        """Let the other threads and workers have the key again (``LocalTable.hold``)."""
        self._release()


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

    def __init__(self, directory: Path, codec: Codec) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.codec = codec
        self._pid = os.getpid()
        self._locks: dict[str, threading.Lock] = {}
        self._files: dict[str, _TableFile] = {}  # node → open file, used only under its lock
        self._guard = threading.Lock()

    @contextmanager
    def locked(self, node: str, wait_until: float) -> Iterator[HeldTable]:
        """The key's records, locked against every other thread and worker of the replica
        for the ``with`` block (``hold``)."""
        held = self.hold(node, wait_until)
        try:
            yield held
        finally:
            held.release()

    def hold(self, node: str, wait_until: float) -> HeldTable:
        """The key's records, locked against every other thread and worker of the replica until
        ``HeldTable.release`` (the bind guard's path holds one key per review: no context
        manager's generator and exit stack around it).

        Raises ``Busy`` when others hold the lock past ``wait_until`` (monotonic), ``OSError``
        when the table cannot be opened, read or written."""
        lock = self._lock(node)
        if not waiting.acquire(lock, max(0.0, wait_until - time.monotonic())):
            raise Busy(f"waiting for the lock of {self._path(node)}")
        table = None
        locked = False
        try:
            table = self._files.get(node) or _TableFile(self._path(node), self.codec)
            _flock(table.fd, wait_until, table.path)
            locked = True
            entries, damaged = table.read()
            return HeldTable(entries, damaged, table, partial(self._release, node, table, lock))
        except BaseException:
            self._release(node, table, lock, locked=locked)
            raise

    def _release(
        self, node: str, table: _TableFile | None, lock: threading.Lock, *, locked: bool = True
    ) -> None:
        """The file lock, then the worker's own: in the reverse order of ``hold``."""
        try:
            if table is not None:
                try:
                    if locked:
                        _unlock(table.fd)
                finally:
                    self._keep_open(node, table)
        finally:
            lock.release()

    def entries(self, node: str, deadline: float) -> list[Any]:
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
        waiting.before_waiting(f"the lock of {path}")
        if time.monotonic() >= wait_until:
            raise Busy(f"waiting for the lock of {path}")
        time.sleep(pause)
        pause = min(2 * pause, 0.002)


def _decoded(data: bytes | str | None, codec: Codec) -> tuple[Any, bool]:
    """The records in ``data``, and whether any of it did not parse (damage)."""
    try:
        return codec.load(orjson.loads(data) if data else None)
    except orjson.JSONDecodeError:
        return codec.load(None)[0], True
