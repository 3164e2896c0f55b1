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

``serve`` runs one per replica, in gunicorn's master (``prefork.replica_audit``), which forks
workers while the audit runs: its gauges are published under a lock held across every fork, so
no worker starts with the metrics client's lock held by a thread it does not have.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter

from ..audit import NODES_PER_CHUNK, periodic_passes
from ..config import Config
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
    ) -> None:
        self.source = source
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
        """One audit; None (and no gauge change) while the state is unavailable. Each pass reads
        its keys once, then judges them a chunk per hold of the state's lock."""
        started = time.perf_counter()
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
        with self._publishing:
            self.gauges.publish(counts, self.source_name, time.time(), time.perf_counter() - started)
        return findings
