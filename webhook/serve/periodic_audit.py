"""The audit inside the server (``serve --audit-interval``): from the live state, no extra reads.

The server's state holds nodes, active pods, the storm breakers' per-owner rejection records
and the DRA device index, nothing more: no workloads, no Failed pods. So the periodic audit
computes the node findings, ``MixedDeviceScheduler`` (pods of more than one scheduler holding a
device; pods whose controller pinned nodeName cannot be told apart without the workloads),
``Overcommitted`` and ``StaleNodeResourceTopology``, the DRA devices handed out twice
(``DeviceAlreadyAllocated`` and the capacity and counter types), and counts storms in progress
(``AdmissionStorm``: owners whose breaker is open, by namespace). ``admit-guard audit`` reports
every type, old storms, pinned workloads and ``TopologyRejectedPods`` included.

Reviews read the same state under the same lock, so the audit takes it one chunk of nodes (or
claims) at a time: an admission review never waits for more than one chunk.

``serve`` runs one per replica, in gunicorn's master (``prefork.replica_audit``), whose state
the workers share copy-on-write. A pass reads every record, and each read bumps a reference
count: done in the master, it copied the pages it touched (at 65,000 nodes / 1.3 M pods, about
120 MiB a pass) while the workers kept the old ones. So each pass runs in a child forked for it
(``in_child``), which copies what it touches in its own pages and frees them when it exits; the
master publishes what the child sends back. The pass over the nodes runs in several children,
one after the other, each judging ``KEYS_PER_CHILD`` of the nodes the first one listed (a node
added since is judged by the next pass): one child for all of them copied 114 MiB at 65,000
nodes, and with the replica's 690 MiB that left less than the 256 MiB request budget under the
1 GiB limit; now a group copies 22 MiB, the child that lists the nodes 35. The master forks
workers while its audit runs: the gauges are published under a lock held across every fork, so
no worker starts with the metrics client's lock held by a thread it does not have.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from ..audit import NODES_PER_CHUNK, periodic_passes
from ..config import Config
from ..policies import AuditPass
from ..state.child_process import end, forked, read_within
from ..state.source import StateSource
from .metrics import AuditGauges

log = logging.getLogger(__name__)
__all__ = ["KEYS_PER_CHILD", "NODES_PER_CHUNK", "PeriodicAudit"]

# A separable pass's keys judged per child. What a child copies grows with the keys it judges, as
# their objects lie scattered over the heap: at 65,000 nodes / 1.3 M pods, 1,000 nodes copy
# 15 MiB, 2,000 22, 4,000 32, all of them 114; the first child, which lists them, 35.
KEYS_PER_CHILD = 2_000


class PeriodicAudit:
    """Runs the node audit every ``interval`` seconds on a daemon thread and publishes gauges."""

    def __init__(
        self,
        source: StateSource,
        config: Config,
        gauges: AuditGauges,
        interval: float,
        source_name: str = "snapshot",
        *,
        in_child: bool = False,
    ) -> None:
        self.source = source
        self.in_child = in_child
        self.config = config
        self.gauges = gauges
        self.interval = interval
        self.source_name = source_name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._publishing = threading.Lock()

    def start(self) -> PeriodicAudit:
        os.register_at_fork(
            before=self._publishing.acquire,
            after_in_parent=self._publishing.release,
            after_in_child=self._publishing.release,
        )
        self._thread = threading.Thread(target=self._loop, name="periodic-audit", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # a bug in the audit must never take the webhook down
                log.exception("periodic audit failed")
            self._stop.wait(self.interval)

    def run_once(self) -> list | None:
        """One audit; None (and no gauge change) while the state is unavailable, or when a pass
        in its own process failed (logged)."""
        started = time.perf_counter()
        found = self._in_child() if self.in_child else self._audit()
        if found is None:
            return None
        counts, findings = found
        with self._publishing:
            self.gauges.publish(counts, self.source_name, time.time(), time.perf_counter() - started)
        return findings

    def _audit(self) -> tuple[Counter, list] | None:
        """The findings by type and namespace, and the findings. Each pass reads its keys once,
        then judges them a chunk per hold of the state's lock."""
        keyed = self._keyed(periodic_passes(self.config))
        if keyed is None:
            return None
        findings = self._judge(keyed)
        return None if findings is None else (_counted(_published(keyed), findings), findings)

    def _keyed(self, passes: list[tuple[tuple[str, ...], AuditPass]]) -> list[Keyed] | None:
        """Each pass with its keys (None where the state lacks its input); None while the state
        is unusable."""
        with self.source.reading() as view:
            if view.state is None:
                return None
            return [(types, audit, audit.keys(view.state)) for types, audit in passes]

    def _judge(self, keyed: list[Keyed]) -> list | None:
        """What the passes find over their keys, a chunk per hold of the state's lock."""
        findings = []
        for _, audit, keys in keyed:
            if keys is None:
                continue
            chunks = [keys[start : start + audit.chunk] for start in range(0, len(keys), audit.chunk)] or [()]
            for last, chunk in enumerate(chunks, 1 - len(chunks)):
                with self.source.reading() as view:
                    if view.state is None:
                        return None
                    if chunk:
                        audit.step(view.state, chunk)
                    if not last:
                        findings += audit.findings(view.state)
        return findings

    def _in_child(self) -> tuple[Counter, list] | None:
        """``_audit`` in children forked for it (``child_process``). The first lists every
        pass's keys and judges the passes that gather findings across their keys; a separable
        pass's keys are then judged ``KEYS_PER_CHILD`` at a time, each group in a child of its
        own, so that the replica's peak is what one group copies, not the whole pass."""
        passes = periodic_passes(self.config)
        first = self._child(lambda: self._listed(passes))
        if first is None:
            return None
        published, findings, apart = first
        for index, count, keys in apart:
            types, audit = passes[index]
            for start in range(0, count, KEYS_PER_CHILD):
                found = self._child(partial(self._group, types, audit, keys, start))
                if found is None:
                    return None
                findings += found
        return _counted(published, findings), findings

    def _group(self, types: tuple[str, ...], audit: AuditPass, keys: bytes, start: int) -> list | None:
        """In a child: the findings over ``KEYS_PER_CHILD`` of a separable pass's pickled keys."""
        return self._judge([(types, audit, pickle.loads(keys)[start : start + KEYS_PER_CHILD])])

    def _listed(self, passes: list[tuple[tuple[str, ...], AuditPass]]) -> tuple | None:
        """In the first child: the types each pass publishes, the findings of the passes that
        are not separable, and each separable pass's index, key count and pickled keys (kept
        as one block in the master, which never unpickles them: new objects there would land
        in pages its workers share)."""
        keyed = self._keyed(passes)
        if keyed is None:
            return None
        whole = [(types, audit, keys) for types, audit, keys in keyed if not audit.separable]
        findings = self._judge(whole)
        if findings is None:
            return None
        apart = [
            (index, len(keys), pickle.dumps(list(keys)))
            for index, (_, audit, keys) in enumerate(keyed)
            if audit.separable and keys is not None
        ]
        return _published(keyed), findings, apart

    def _child(self, job: Callable[[], Any]) -> Any:
        """``job()`` in a child forked for it, which sends its result back through a pipe and
        is killed if it has not answered within ``max(60 s, interval)``; None where it failed
        (logged) or said None."""
        pid, read = forked(lambda out: _report(job, out))
        payload = None
        try:
            payload = read_within(read, max(60.0, self.interval))
        finally:
            os.close(read)
            end(pid, kill=payload is None)
        if payload is None:
            log.error("periodic audit: its process did not answer within %.0f s", max(60.0, self.interval))
            return None
        ok, result = pickle.loads(payload) if payload else (False, "its process ended without an answer")
        if not ok:
            log.error("periodic audit failed: %s", result)
            return None
        return result


Keyed = tuple[tuple[str, ...], AuditPass, Sequence[str] | None]


def _published(keyed: list[Keyed]) -> list[str]:
    """The finding types of the passes whose input the state has: each is published, zero too."""
    return [t for types, _, keys in keyed if keys is not None for t in types]


def _counted(published: list[str], findings: list) -> Counter:
    """Findings by type and namespace, every published type counted (zero too)."""
    counts = Counter({(t, ""): 0 for t in published})
    counts.update(Counter((f.type, f.namespace) for f in findings))
    return counts


def _report(job: Callable[[], Any], out: int) -> None:
    """In the child: ``job``'s result, or the traceback of its failure."""
    try:
        payload = pickle.dumps((True, job()))
    except BaseException:
        payload = pickle.dumps((False, traceback.format_exc()))
    with os.fdopen(out, "wb") as pipe:
        pipe.write(payload)
