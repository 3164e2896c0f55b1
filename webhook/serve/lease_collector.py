"""Leases whose last record ended, deleted: the coordination leaves nothing behind.

A node's or a pool's Lease is rewritten only when a decision touches that node or pool again, so
the Leases of autoscaled nodes and of drivers' pools that came and went would stay forever. Each
worker of a live server lists the guard's Leases now and then (with jitter, so replicas and
workers do not line up) and deletes those every record of which ended in its state, with the
Lease's resourceVersion as the precondition: a sibling's write since wins, and the Lease stays.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from ..coordination.budget import Busy, DeadlineExceeded
from ..coordination.lease import LeaseStore, collect_ended
from ..state.apiserver import ApiError
from ..state.model import ClusterState
from ..state.source import StateSource

log = logging.getLogger(__name__)

COLLECT_SECONDS = 300.0  # at least; twice the reservations' TTL where that is longer
Kept = Callable[[Any, ClusterState, float], bool]


class LeaseCollector:
    """Every ``interval`` seconds (±25%), deletes each store's Leases whose records all ended."""

    def __init__(self, source: StateSource, stores: list[tuple[LeaseStore, Kept]], interval: float) -> None:
        self.source = source
        self.stores = stores
        self.interval = interval
        self._stop = threading.Event()

    def start(self) -> LeaseCollector:
        threading.Thread(target=self._loop, name="lease-collector", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def run_once(self) -> int:
        """One collection over every store: how many Leases were deleted."""
        deleted = 0
        for store, kept in self.stores:
            try:
                deleted += collect_ended(store, kept, self.source, time.time())
            except (ApiError, Busy, DeadlineExceeded) as err:
                log.info("Lease collection in %s skipped: %s", store.namespace, err)
        return deleted

    def _loop(self) -> None:
        while not self._stop.wait(self.interval * random.uniform(0.75, 1.25)):
            try:
                self.run_once()
            except Exception:  # a bug here must never take the webhook down
                log.exception("Lease collection failed")
