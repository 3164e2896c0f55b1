"""prometheus_client's multi-process files, allocated before they are written.

In multi-process mode (``PROMETHEUS_MULTIPROC_DIR``) every worker keeps its samples in files it
maps (``prometheus_client.mmap_dict.MmapedDict``). The client makes a file, and later doubles
it, with ``truncate``: a sparse file whose pages get disk blocks only when first stored to
through the mapping. On a full filesystem that store cannot get a block and the kernel kills
the worker with SIGBUS; its replacement writes its own new file and dies the same way, in a
loop, so a full metrics volume took the whole server down.

``AllocatedMmapedDict`` allocates the blocks (``posix_fallocate``) before a file is mapped or
grown, so a full filesystem surfaces as ``ENOSPC`` at that call instead. The file then stays as
it was (a scrape reads its last complete values) and the process keeps its samples in
anonymous memory: its metrics stop updating, a warning is logged once per file, and
``admit_guard_metric_files_degraded`` says how many of the scraped worker's files are stuck.
``install`` swaps it in for the client's class; it must run before the first metric is made.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import struct

from prometheus_client import values
from prometheus_client.mmap_dict import _INITIAL_MMAP_SIZE, MmapedDict, _pack_integer

log = logging.getLogger(__name__)
_degraded: set[str] = set()  # files of this process whose samples went to memory
_ZEROS = bytes(64 * 1024)


class AllocatedMmapedDict(MmapedDict):
    """``MmapedDict`` whose file always has its blocks: full disk means stale metrics, not SIGBUS."""

    def __init__(self, filename: str, read_mode: bool = False) -> None:
        if read_mode:
            super().__init__(filename, read_mode)
            return
        try:
            with open(filename, "a+b") as handle:
                _allocate(handle.fileno(), max(os.fstat(handle.fileno()).st_size, _INITIAL_MMAP_SIZE))
        except OSError as err:
            _remove_if_empty(filename)  # a scrape cannot read a file without its header
            self._in_memory(filename, _INITIAL_MMAP_SIZE, err)
            return
        super().__init__(filename, read_mode)  # the file is whole: it is only mapped

    def _init_value(self, key: str) -> None:
        encoded = key.encode("utf-8")
        padded = len(encoded) + (8 - (len(encoded) + 4) % 8)
        needed = self._used + struct.calcsize(f"i{padded}sdd")
        if needed > self._capacity:
            self._grow(needed)
        super()._init_value(key)  # now within capacity: the client neither truncates nor remaps

    def _grow(self, needed: int) -> None:
        capacity = self._capacity
        while capacity < needed:
            capacity *= 2
        if self._f is not None:
            try:
                _allocate(self._f.fileno(), capacity)
                self._m = mmap.mmap(self._f.fileno(), capacity)
                self._capacity = capacity
                return
            except OSError as err:
                self._to_memory(err)
        grown = mmap.mmap(-1, capacity)
        grown[: self._used] = self._m[: self._used]
        self._m, self._capacity = grown, capacity

    def _in_memory(self, filename: str, capacity: int, err: OSError) -> None:
        """The state ``MmapedDict.__init__`` leaves, with anonymous memory for the file."""
        self._f, self._fname, self._capacity = None, filename, capacity
        self._m = mmap.mmap(-1, capacity)
        self._positions: dict[str, int] = {}
        self._used = 8
        _pack_integer(self._m, 0, self._used)
        _degrade(filename, err)

    def _to_memory(self, err: OSError) -> None:
        """Keep the file as it is (its header still points at complete entries); carry on in memory."""
        copy = mmap.mmap(-1, self._capacity)
        copy[: self._used] = self._m[: self._used]
        self._m.close()
        self._f.close()
        self._m, self._f = copy, None
        _degrade(self._fname, err)

    def close(self) -> None:
        if self._f is None and self._m is not None:
            self._m.close()
            self._m = None
            return
        super().close()


def _allocate(fd: int, length: int) -> None:
    """Make the file ``length`` bytes long with every block allocated: where the filesystem
    cannot allocate ahead, by writing zeros from its end (the client opens its files for
    appending). Raises ``OSError`` (``ENOSPC``) when there is no room."""
    try:
        os.posix_fallocate(fd, 0, length)
        return
    except OSError as err:
        if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS, errno.EBADF):
            raise
    size = os.fstat(fd).st_size
    while size < length:
        size += os.write(fd, _ZEROS[: min(len(_ZEROS), length - size)])


def _remove_if_empty(filename: str) -> None:
    try:
        if os.stat(filename).st_size == 0:
            os.unlink(filename)
    except OSError:
        pass


def _degrade(filename: str, err: OSError) -> None:
    if filename not in _degraded:
        _degraded.add(filename)
        log.warning(
            "metrics file %s cannot grow (%s): this worker's metrics in it stop updating", filename, err
        )


def degraded_files() -> int:
    """How many of this process's metric files could not be allocated."""
    return len(_degraded)


def install() -> None:
    """Make the client's multi-process values use ``AllocatedMmapedDict``."""
    values.MmapedDict = AllocatedMmapedDict
