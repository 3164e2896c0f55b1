"""The storm breakers' probe slots, shared: by the workers of a replica through its table, and
by every replica through a Lease per open breaker (see ``storm``: why, and ``adopt``).

I/O lives here, beside the breakers it feeds; the breakers themselves stay pure.
"""

from __future__ import annotations

import logging
from typing import Any

from ..state.apiserver import ApiError
from ..state.storm import ProbeSlot, StormBreakers
from .budget import Budget, Busy, DeadlineExceeded
from .lease import LeaseStore
from .table import Codec, LocalTable

log = logging.getLogger(__name__)


def _load_slot(raw: Any) -> tuple[ProbeSlot | None, bool]:
    if raw is None:
        return None, False
    try:
        return ProbeSlot(float(raw["at"]), float(raw["cooldown"])), False
    except (KeyError, TypeError, ValueError):
        return None, True


PROBE_SLOT = Codec(_load_slot, lambda slot: {"at": slot.at, "cooldown": slot.cooldown})
STORM_LEASE_PREFIX = "admit-guard-storm-"
STORM_ANNOTATION = "admit-guard.io/storm-probe"


class SharedProbes:
    """The probe slots of open breakers, shared by the workers of a replica (``table``) and,
    with ``leases``, by every replica. ``claim`` is the one place a probe is admitted.

    The table is locked for the owner while its Lease is read and written, so a replica's
    workers queue instead of racing through the API server. When the API server fails or is
    too slow, the replica's table alone decides: at worst one probe per replica, never a
    worker's guess.
    """

    def __init__(
        self, table: LocalTable | None, leases: LeaseStore | None, wait_seconds: float, call_seconds: float
    ) -> None:
        self.table, self.leases = table, leases
        self.wait_seconds, self.call_seconds = wait_seconds, call_seconds

    def claim(self, storm: StormBreakers, owner_uid: str, now: float) -> bool:
        """Whether a pod its worker's breaker would admit as the probe may pass: True when it
        took the slot (or the breaker turned out closed), False when another probe holds it
        (the breaker then denies it, with what the others did adopted)."""
        budget = Budget.start(self.wait_seconds, self.call_seconds)
        try:
            if self.table is None:
                return self._decide(storm, owner_uid, now, None, budget)[0]
            with self.table.locked(owner_uid, budget.wait_until) as held:
                allowed, newest = self._decide(storm, owner_uid, now, held.entries, budget)
                if newest is not None and newest != held.entries:
                    held.store(newest)
                return allowed
        except Busy:
            return False  # siblings are deciding this very slot: one of them takes it
        except OSError as err:
            log.warning("storm probe table failed (%s): owner %s decided through the Lease", err, owner_uid)
            return self._decide(storm, owner_uid, now, None, budget)[0]

    def _decide(
        self, storm: StormBreakers, owner_uid: str, now: float, known: ProbeSlot | None, budget: Budget
    ) -> tuple[bool, ProbeSlot | None]:
        """(whether the pod may pass, the newest slot seen, for the table)."""
        seen = [known]

        def take(slot: ProbeSlot | None) -> ProbeSlot | None:
            storm.adopt(owner_uid, slot)
            seen.append(slot)
            return storm.next_probe(owner_uid, now)

        storm.adopt(owner_uid, known)
        mine = storm.next_probe(owner_uid, now)
        if mine is not None and self.leases is not None:
            try:
                mine = self.leases.update(owner_uid, take, budget)
            except (ApiError, DeadlineExceeded) as err:
                log.warning("storm probe Lease failed (%s): owner %s decided by this replica", err, owner_uid)
        if mine is not None:
            storm.probe_admitted(owner_uid, now)
            return True, mine
        slots = [slot for slot in seen if slot is not None]
        return not storm.verdict(owner_uid, now).deny, max(slots, key=lambda s: s.at, default=None)


def shared_probes(directory, api, namespace: str, wait_seconds: float, call_seconds: float) -> SharedProbes:
    """The probe slots of a serving replica: its workers' table under ``directory`` and, with an
    API server, a Lease per open breaker in ``namespace``."""
    leases = None
    if api is not None:
        leases = LeaseStore(
            api, namespace, prefix=STORM_LEASE_PREFIX, annotation=STORM_ANNOTATION, codec=PROBE_SLOT
        )
    return SharedProbes(LocalTable(directory, PROBE_SLOT), leases, wait_seconds, call_seconds)
