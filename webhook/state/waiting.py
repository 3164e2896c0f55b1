"""Whether the calling thread may wait: for a lock another thread or worker holds, or for the
API server.

The server answers an admission review on its event loop, without a pool thread, when the
decision needs no wait (``serve/worker.py``): handing each review to a pool thread and its
reply back to the loop cost about 200 µs of a worker's CPU a review (issue 31). A wait there
would stall every connection of the worker, so the loop decides ``without_waiting``. Each
place the decision path would wait (the state's lock, the bind guard's tables, a storm probe's
claim, a call to the API server) asks first, and in that mode raises ``WouldWait`` instead,
before it has changed anything: the loop then hands the review to a pool thread, which decides
it again from the start, waiting as it always did.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class WouldWait(Exception):
    """The decision would wait here, and the calling thread promised not to."""


class _Promise(threading.local):
    no_waiting = False


_promise = _Promise()


@contextmanager
def without_waiting() -> Iterator[None]:
    """Within the block, every wait point raises ``WouldWait`` rather than wait."""
    _promise.no_waiting = True
    try:
        yield
    finally:
        _promise.no_waiting = False


def before_waiting(what: str) -> None:
    """Called where the decision would wait for ``what``, or change something a retry would
    find changed: raises ``WouldWait`` within ``without_waiting``."""
    if _promise.no_waiting:
        raise WouldWait(what)


def acquire(lock: threading.Lock | threading.RLock, timeout: float = -1) -> bool:
    """``lock.acquire(timeout=timeout)``; within ``without_waiting``, only a lock free at once
    (else ``WouldWait``)."""
    if not _promise.no_waiting:
        return lock.acquire(timeout=timeout)
    if lock.acquire(blocking=False):
        return True
    raise WouldWait("a lock another thread holds")
