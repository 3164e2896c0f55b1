"""The audit inside the server (``serve --audit-interval``): from the live state, no extra reads.

The server's state holds nodes, active pods, the storm breakers' per-owner rejection records
and the DRA device index, nothing more: no workloads, no Failed pods. So the periodic audit
computes the node findings, ``MixedDeviceScheduler`` (pods of more than one scheduler holding a
device; pods whose controller pinned nodeName cannot be told apart without the workloads) and
``Overcommitted``, the DRA devices handed out twice (``DeviceAlreadyAllocated`` and the capacity
and counter types), and counts storms in progress (``AdmissionStorm``: owners whose breaker is
open, by namespace). ``admit-guard audit`` reports every type, old storms and pinned workloads
included.

Reviews read the same state under the same lock, so the audit takes it one chunk of nodes (or
claims) at a time: an admission review never waits for more than one chunk.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter

from ..audit import (
    ALREADY_ALLOCATED,
    DEVICE_TYPES,
    MIXED,
    OVERCOMMITTED,
    STORM,
    Finding,
    audited,
    device_groups,
    device_report,
    node_findings,
)
from ..config import Config
from ..state.source import StateSource
from .metrics import AuditGauges

log = logging.getLogger(__name__)
NODES_PER_CHUNK = 250
CLAIMS_PER_CHUNK = 1000


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

    def start(self) -> PeriodicAudit:
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

    def run_once(self) -> list[Finding] | None:
        """One audit; None (and no gauge change) while the state is unavailable."""
        started = time.perf_counter()
        with self.source.reading() as view:
            if view.state is None:
                return None
            names = list(view.state.nodes)
            storm = view.state.storm
            devices = view.state.devices is not None and audited(self.config, ALREADY_ALLOCATED)
            claims = list(view.state.devices.claims()) if devices else []
        findings: list[Finding] = []
        for start in range(0, len(names), NODES_PER_CHUNK):
            with self.source.reading() as view:
                if view.state is None:
                    return None
                findings += node_findings(view.state, self.config, names[start : start + NODES_PER_CHUNK])
        groups: dict = {}
        for start in range(0, len(claims), CLAIMS_PER_CHUNK):
            with self.source.reading() as view:
                if view.state is None or view.state.devices is None:
                    return None
                device_groups(view.state, claims[start : start + CLAIMS_PER_CHUNK], groups)
        if groups:
            with self.source.reading() as view:
                if view.state is None or view.state.devices is None:
                    return None
                findings += device_report(groups, view.state)
        counts = {(MIXED, ""): 0, (OVERCOMMITTED, ""): 0}
        counts.update({(t, ""): 0 for t in DEVICE_TYPES} if devices else {})
        counts.update(Counter((f.type, f.namespace) for f in findings))
        if storm is not None:
            counts.update(Counter((STORM, b.owner.namespace) for b in storm.open_breakers()))
        self.gauges.publish(counts, self.source_name, time.time(), time.perf_counter() - started)
        return findings
