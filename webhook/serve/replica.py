"""One cluster state per replica: listed once, in the master, and shared with every worker.

Each worker used to run its own informer: a 2-worker replica held the cluster twice (498 MiB
at 20,000 nodes / 600,000 pods against 281 for one worker), and every worker listed the whole
cluster from the API server at each restart. Now the master runs the replica's informer (the
leader) and gunicorn forks the workers from it: a worker starts with the leader's state in
pages it shares copy-on-write, and watches from the leader's resourceVersions, so it lists
nothing and is ready as soon as it is forked.

A worker's own watch events, and the reference counts its reads bump, copy the pages they
touch: its private memory grows from a few MiB at the fork. ``Renewal`` (run by the master's
loop) forks a fresh worker from the leader's current state when one passes its budget, or
when the leader's own writes since the fork do, and retires the old one once the new one has
had time to listen, one worker at a time. Workers
forked while the leader was still listing (the replica starting) have no state
(``AwaitingLeader``: not ready, and one of them listens so that the liveness probe is
answered); they are renewed as soon as the leader is synced.

Why not a state in shared memory written by one process: the checks read Python records by
reference; laying them out in shared memory is a rewrite of ``state/`` with a decode on every
read. Why not one process that decides for the workers: every review would cross a process
boundary, and the decisions would run on one core.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..state.apiserver import ApiServer
from ..state.informer import Informer
from ..state.source import Readiness, StateView

log = logging.getLogger(__name__)

MIB = 1 << 20
# A worker's private memory that calls for a fresh fork: this share of the leader's, at least
# ``MIN_BUDGET``. A budget small against the state keeps the replica near one copy of it; the
# floor is what a worker holds of its own on a small cluster (the app, TLS, its request
# buffers: 128 MiB at most under the shipped limit), which a fresh fork would not shed.
BUDGET_SHARE = 0.25
MIN_BUDGET = 128 * MIB
# What the leader may have written since the workers' fork before the oldest is renewed: its
# writes are a second copy of what they touch, and it holds no request buffers to spare.
LEADER_BUDGET_SHARE = 0.1
LEADER_MIN_BUDGET = 64 * MIB
CHECK_SECONDS = 10.0  # how often the master reads its workers' memory
SETTLE_SECONDS = 1.0  # a fresh worker listens within a few hundred ms of its fork
SPACING_SECONDS = 30.0  # between two renewals: the replica never renews two workers at once
# The leader's watch events per second below which it has caught up on a watch's backlog (at
# 65,000 nodes it applied a backlog of 100,000 at 27,000-94,000 a second); waited for at most
# ``SPACING_SECONDS`` after a fresh worker's fork, on a cluster that never goes quieter.
CAUGHT_UP_EVENTS_PER_SECOND = 1_000


class ReplicaState:
    """The leader informer in the master, and what a fork must leave consistent.

    ``os.fork`` copies one thread: a lock another thread held stays held in the child, and a
    change half applied stays half applied. The informer's lock (every change to the state is
    made under it) and the storm breakers' are held across every fork.
    """

    def __init__(self, leader: Informer) -> None:
        self.leader = leader
        # Per forking thread (gunicorn's loop forks workers, the periodic audit its passes):
        # whether this thread's last fork left the child a state to follow.
        self._forks = threading.local()

    def hold_across_forks(self) -> ReplicaState:
        """From now on every fork of this process leaves the child the state whole (once)."""
        os.register_at_fork(before=self._hold, after_in_parent=self._release, after_in_child=self._in_child)
        return self

    def _locks(self) -> list[threading.Lock]:
        storm = self.leader.state.storm
        return [self.leader.lock] + ([storm.lock] if storm is not None else [])

    def _hold(self) -> None:
        for lock in self._locks():
            lock.acquire()
        self._forks.resumable = self.leader.resumable

    @property
    def forked_resumable(self) -> bool:
        """Whether the calling thread's last fork left the child a state to follow."""
        return getattr(self._forks, "resumable", False)

    def _release(self) -> None:
        for lock in reversed(self._locks()):
            lock.release()

    def _in_child(self) -> None:
        self._release()  # held by this thread's fork: the child's copies are free
        # A fork in the middle of a list page inherits the collector paused (``collector_paused``)
        # with nobody left to resume it. The leader's threads are not in the child: only the
        # worker's own informer changes the state from here on, under its own lock.
        gc.enable()

    def follow(self, api: ApiServer) -> Informer | AwaitingLeader:
        """In a worker, after the fork: its informer, or a source that waits to be renewed."""
        follower = Informer.following(api, self.leader)
        if follower is None:
            return AwaitingLeader(self.leader.readiness().reason)
        return follower

    def close(self) -> None:
        self.leader.stop()


@dataclass(slots=True)
class AwaitingLeader:
    """A worker's state source when it was forked before the leader had listed the cluster:
    never ready (the master renews the worker once the leader is)."""

    why: str

    @contextmanager
    def reading(self) -> Iterator[StateView]:
        yield StateView(None, self._reason)

    def readiness(self) -> Readiness:
        return Readiness(False, self._reason)

    @property
    def _reason(self) -> str:
        return f"the replica's informer is not synced yet ({self.why})"

    def close(self) -> None:
        pass


def private_bytes(pid: int) -> int:
    """Memory only this process maps (``Private_Clean`` + ``Private_Dirty``), 0 if unreadable."""
    total = 0
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1]) * 1024
    return total


def resident_bytes(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


@dataclass(slots=True)
class Renewal:
    """Which worker the master forks afresh, and when: one at a time, the fresh one first.

    ``step`` runs in gunicorn's master loop (about once a second) before it counts its
    workers. Renewing raises the worker count by one (gunicorn forks the fresh worker), retires
    the old one once the fresh one had ``settle`` seconds to listen, and lowers the count once
    the old one is gone, so gunicorn never picks a worker to stop itself.

    Workers forked before the leader synced are retired first, and their fresh ones forked
    once they are gone: they have no state to serve with (``/readyz`` answers 503), and each
    holds as its own every page the leader wrote since its fork, so a fresh worker beside them
    and the leader's newly listed state was the replica's peak (at 65,000 nodes: 801-846 MiB
    with a third worker, 779-791 with one of them retired first, 673-737 all retired at once).
    Retired together, they are renewed one at a time (gunicorn's count lowered, then raised
    once each fresh one had ``settle`` seconds and the leader caught up on its watch backlog):
    the later ones are forked from the caught-up state, where forked at once each applied the
    backlog itself (settled at 785-790 MiB against 736-748).
    """

    replica: ReplicaState
    budget: int = 0  # bytes, for workers and leader; 0: shares of the leader's resident memory
    settle: float = SETTLE_SECONDS
    spacing: float = SPACING_SECONDS
    check_every: float = CHECK_SECONDS
    # Workers forked while the leader could not be resumed: renewed first, without a check.
    unsynced: set[int] = field(default_factory=set)
    born: dict[int, None] = field(default_factory=dict)  # the workers, in the order of their forks
    old: int | None = None
    fresh_since: float | None = None
    retired: bool = False
    held_back: int = 0  # workers gunicorn's count was lowered by, to fork one at a time
    retiring: set[int] = field(default_factory=set)  # the unsynced ones retired together
    leader_events: tuple[float, int] | None = None  # the leader's event count, and when it was read
    next_renewal: float = 0.0
    next_check: float = 0.0
    renewals: int = 0

    def forked(self, pid: int, resumable: bool) -> None:
        self.born[pid] = None
        if not resumable:
            self.unsynced.add(pid)

    def step(self, arbiter, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        workers = arbiter.WORKERS
        self.unsynced &= workers.keys()
        self.born = {pid: None for pid in self.born if pid in workers}
        if self.held_back:
            self._bring_back(arbiter, now)
        elif self.old is None:
            self._start(arbiter, now)
        elif self.old not in workers:  # it left (retired, or died meanwhile)
            self._finish(arbiter, now)
        elif not self.retired and self.fresh_since is not None and now - self.fresh_since >= self.settle:
            arbiter.kill_worker(self.old, signal.SIGTERM)
            self.retired = True
        elif self.fresh_since is None:
            self.fresh_since = now  # gunicorn forked the fresh worker in the loop after ``_start``

    def _start(self, arbiter, now: float) -> None:
        if not self.replica.leader.resumable:
            return
        if self.unsynced and len(arbiter.WORKERS) > 1:  # a lone one is renewed fresh one first
            self._retire_unsynced(arbiter, now)
            return
        old = self._due(arbiter.WORKERS, now)
        if old is None:
            return
        self.old, self.fresh_since, self.retired = old, None, False
        arbiter.num_workers += 1
        self.renewals += 1

    def _retire_unsynced(self, arbiter, now: float) -> None:
        """Stop every worker forked before the leader synced, and let gunicorn fork one fresh
        worker for them once they are gone (``_bring_back`` the others, if any)."""
        retiring = sorted(self.unsynced)
        log.info("renewing workers %s: forked before the replica's informer was synced", retiring)
        for pid in retiring:
            arbiter.kill_worker(pid, signal.SIGTERM)
        staying = len(arbiter.WORKERS) - len(retiring)
        self.held_back = max(arbiter.num_workers - staying - 1, 0)
        arbiter.num_workers -= self.held_back
        self.retiring = set(retiring) if self.held_back else set()  # awaited by ``_bring_back``
        self.fresh_since = None
        self.unsynced.clear()
        self.renewals += len(retiring)
        if not self.held_back:
            self.next_renewal = now + self.spacing

    def _bring_back(self, arbiter, now: float) -> None:
        """Raise gunicorn's count by one once the retired workers are gone, the last fresh one
        had ``settle`` seconds to listen and the leader caught up (or ``spacing`` passed)."""
        if self.retiring & arbiter.WORKERS.keys():
            return
        caught_up = self._leader_caught_up(now)
        if self.fresh_since is None:
            self.fresh_since = now  # gunicorn forks the fresh worker in the loop after this step
        elif now - self.fresh_since >= self.settle and (caught_up or now - self.fresh_since >= self.spacing):
            arbiter.num_workers += 1
            self.held_back -= 1
            self.fresh_since = None
            if not self.held_back:
                self.retiring.clear()
                self.next_renewal = now + self.spacing

    def _leader_caught_up(self, now: float) -> bool:
        """Whether the leader applied fewer than ``CAUGHT_UP_EVENTS_PER_SECOND`` watch events
        since the last step: a worker forked while it applies a backlog (the replica starting)
        applies the rest of it too, into pages of its own (at 65,000 nodes: 39-42 MiB against
        12-27 once caught up)."""
        events, last = self.replica.leader.events, self.leader_events
        self.leader_events = (now, events)
        if last is None or now <= last[0]:
            return False
        return (events - last[1]) / (now - last[0]) < CAUGHT_UP_EVENTS_PER_SECOND

    def _finish(self, arbiter, now: float) -> None:
        arbiter.num_workers -= 1
        self.old = None
        self.next_renewal = now + self.spacing

    def _due(self, workers, now: float) -> int | None:
        """The worker to renew: one forked before the leader synced, else the one furthest
        over its memory budget, else, once the leader's own memory is over it, the oldest.

        What the leader writes after a fork (the watch events it applies) it copies, and the
        workers keep those pages as they were. With one worker they become that worker's own;
        with more, they stay shared among the workers, so no worker's private memory shows
        them, and the leader's does."""
        if self.unsynced:
            pid = min(self.unsynced)
            log.info("renewing worker %s: forked before the replica's informer was synced", pid)
            return pid
        if now < max(self.next_check, self.next_renewal):
            return None
        self.next_check = now + self.check_every
        resident = resident_bytes(os.getpid())
        budget = self.budget or max(MIN_BUDGET, int(BUDGET_SHARE * resident))
        private = {pid: private_bytes(pid) for pid in workers}
        pid = max(private, key=private.__getitem__, default=None)
        if pid is None:
            return None
        if private[pid] > budget:
            log.info(
                "renewing worker %s: %.0f MiB private, over its budget of %.0f MiB",
                pid,
                private[pid] / MIB,
                budget / MIB,
            )
            return pid
        written = private_bytes(os.getpid())
        budget = self.budget or max(LEADER_MIN_BUDGET, int(LEADER_BUDGET_SHARE * resident))
        if written <= budget:
            return None
        pid = next(iter(self.born), None) or min(workers)
        log.info(
            "renewing worker %s, the oldest: the replica's informer wrote %.0f MiB since, over the "
            "budget of %.0f MiB",
            pid,
            written / MIB,
            budget / MIB,
        )
        return pid
