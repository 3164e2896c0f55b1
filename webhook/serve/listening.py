"""When a worker takes connections: once its cluster state is ready, or when no sibling does.

Each worker listens on a socket of its own (``SO_REUSEPORT``) and the kernel spreads new
connections over the sockets that listen. A worker forked before the replica's informer had
listed the cluster (``replica``) cannot judge a pinned pod until it is forked again. Listening
from its fork, it would take its share of the connections meanwhile and answer their reviews
from no state (fail-open warnings, or denials when failing closed) while a sibling was ready.
So a worker listens only once its state source says ready (``GuardWorker._join_when_ready``).

Or when no sibling listens: the whole replica starting, or the API server unreachable. A
replica that accepted nothing would fail its liveness probe and be restarted into the same
wait, and would refuse the reviews it can answer per ``failOpen``; among workers none of which
is ready, answering from the one that listens is no worse than from another.

Whether a sibling listens is a lock (``Membership``): a listening worker holds a shared
``flock`` on a file the master makes before the fork; a waiting worker that can take it
exclusively knows that none does. The kernel drops a dead worker's lock with its descriptors,
so a crash cannot leave a stale claim behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gunicorn.util import parse_address

from .prefork import shared_directory


@dataclass(slots=True)
class Port:
    """The replica's addresses, held bound (not listening) by the master while workers come and
    go, and the lock file its workers share."""

    addresses: list[tuple[str, int]]
    lock: Path
    held: list[socket.socket] = field(default_factory=list)

    @classmethod
    def hold(cls, bind: str) -> Port:
        """In the master, before the fork: bind with ``SO_REUSEPORT`` without listening. The port
        stays the replica's while no worker listens (all restarting), and a socket that does not
        listen takes no part in the kernel's choice among the workers' listeners."""
        address = parse_address(bind)
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        held = socket.socket(family, socket.SOCK_STREAM)
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        held.bind(address)
        lock = shared_directory("admit-guard-listeners-") / "lock"
        lock.touch()
        return cls([address], lock, [held])

    def release(self) -> None:
        """In a new worker: its copies of the master's held sockets are of no use to it."""
        for held in self.held:
            held.close()


class Membership:
    """A worker's claim on the port, seen by its siblings through the lock file.

    The file is opened in the worker: ``flock`` locks belong to an open file description, and
    one inherited from the master would be shared by every worker.
    """

    def __init__(self, lock: Path) -> None:
        self._fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        self.joined = False

    def may_join(self, ready: Callable[[], bool]) -> bool:
        """Whether the worker should listen now: its state is ready, or no sibling listens.
        Either way the claim is then held (shared) until ``leave``."""
        if not ready():
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False  # a sibling listens: it answers while this worker syncs
        # Held exclusively (a moment, then shared) or by siblings shared: never for long.
        fcntl.flock(self._fd, fcntl.LOCK_SH)
        self.joined = True
        return True

    def leave(self) -> None:
        """The worker stops listening: its siblings may have to take its place."""
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
