"""A child process forked for one job, which reports to its parent through a pipe.

The periodic audit's passes and the replica's first pod list run this way: the child reads the
parent's memory without copying it into the parent's own pages, and has a core of its own.
The child always exits 0, whatever its job did: gunicorn's master reaps every child of its
process, and stops the server on the exit codes of a worker that failed to boot. What the job
has to say, failures included, goes through the pipe; the parent kills a child it gives up on.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from collections.abc import Callable


def forked(job: Callable[[int], None]) -> tuple[int, int]:
    """Fork a child that runs ``job(write_end)`` and exits 0; the child's pid, and the read end
    of its pipe (the parent's to close)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            job(write)
        finally:
            os._exit(0)
    os.close(write)
    return pid, read


def read_within(fd: int, timeout: float) -> bytes | None:
    """Everything written to ``fd`` until its writer closes it; None past ``timeout``."""
    deadline, chunks = time.monotonic() + timeout, []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def end(pid: int, *, kill: bool) -> None:
    """Reap the child, killed first where the parent gave up on it."""
    if kill:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):  # gunicorn's master reaps every child itself
        os.waitpid(pid, 0)
