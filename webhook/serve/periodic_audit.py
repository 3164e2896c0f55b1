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
master publishes what the child sends back. The master forks workers while its audit runs: the
gauges are published under a lock held across every fork, so no worker starts with the metrics
client's lock held by a thread it does not have.
"""

from __future__ import annotations

import logging
import os
import pickle
import threading
import time
import traceback
from collections import Counter

from ..audit import NODES_PER_CHUNK, periodic_passes
from ..config import Config
from ..state.child_process import end, forked, read_within
from ..state.source import StateSource
from .metrics import AuditGauges

log = logging.getLogger(__name__)
__all__ = ["NODES_PER_CHUNK", "PeriodicAudit"]


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
        passes = periodic_passes(self.config)
        with self.source.reading() as view:
            if view.state is None:
                return None
            keyed = [(types, audit, audit.keys(view.state)) for types, audit in passes]
        keyed = [(types, audit, keys) for types, audit, keys in keyed if keys is not None]
        findings = []
        for _, audit, keys in keyed:
            chunks = [keys[start : start + audit.chunk] for start in range(0, len(keys), audit.chunk)] or [()]
            for last, chunk in enumerate(chunks, 1 - len(chunks)):
                with self.source.reading() as view:
                    if view.state is None:
                        return None
                    if chunk:
                        audit.step(view.state, chunk)
                    if not last:
                        findings += audit.findings(view.state)
        counts = Counter({(t, ""): 0 for types, _, _ in keyed for t in types})
        counts.update(Counter((f.type, f.namespace) for f in findings))
        return counts, findings

    def _in_child(self) -> tuple[Counter, list] | None:
        """``_audit`` in a child forked for it (``child_process``), which sends its result back
        through a pipe, and is killed if it has not answered within ``max(60 s, interval)``."""
        pid, read = forked(self._report)
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

    def _report(self, out: int) -> None:
        """In the child: the pass's result, or the traceback of its failure."""
        try:
            payload = pickle.dumps((True, self._audit()))
        except BaseException:
            payload = pickle.dumps((False, traceback.format_exc()))
        with os.fdopen(out, "wb") as pipe:
            pipe.write(payload)
