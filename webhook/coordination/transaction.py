"""One coordinated decision: lock the replica's tables, judge, read every Lease, judge, write.

Binds (one key: the node) and DRA allocations (a key per pool) decide the same way:

1. Every key's table is locked, in order, for the whole decision: the replica's siblings queue
   for the key instead of racing through the API server. A table that fails leaves the Leases
   to coordinate (``table-error``); one found damaged is rebuilt from the Leases
   (``table-damaged``).
2. The tables' records are judged first: a denial by them needs no round trip (the Leases
   could only add records).
3. Every key's Lease is read, and the decision judged against all of them together before any
   is written (again only when they hold records the tables did not): a denial leaves nothing
   behind.
4. The writes follow, each with the resourceVersion read. One that loses to a sibling reads that
   key again and judges again; if the decision no longer fits, the keys already written are
   undone off the request's path (the answer is not delayed past the budget).
5. The tables then hold what was decided and what the Leases showed, for the siblings that
   waited.

The cheap path (``stands``): a decision the caller has judged already (a pod created with
``spec.nodeName``, judged by the engine) needs neither judging nor merging when the one key's
table holds no record but its own and its verdict still stands (the state unchanged since):
under the lock, its record is added and that is all. The lock stays: the record is what lets
a sibling deciding on the same key count this decision. The tables are held and released
explicitly (``LocalTable.hold``, ``HeldTable.release``), not through ``contextlib``'s
``ExitStack`` around a generator context manager per key: those were 5 of the 26 µs the bind
guard spent on a pinned pod's cheap path (measured in-process, issue 31).

Each record type says which keys it touches and what identifies it (a pod, a claim); the judge
says what counts. What can go wrong is one set of exceptions: ``Busy`` (siblings or the budget:
deny and let the caller retry), ``LeaseFull`` (not an outage: deny), ``DeadlineExceeded`` and
``ApiError`` (an outage: fail open), ``TableFailed`` (no table and no Lease held the decision).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..state import waiting
from ..state.apiserver import ApiError
from .budget import Budget, Busy, DeadlineExceeded
from .lease import LeaseFull, LeaseRead, LeaseStore
from .table import HeldTable, LocalTable

log = logging.getLogger(__name__)

# Why a decision was allowed unchecked, or what went wrong with the replica's table: closed
# sets, for the metrics.
POD_UNKNOWN, STATE_UNAVAILABLE, NODE_UNKNOWN, API_ERROR, DEADLINE, TABLE_ERROR, WAITED, UNKNOWN_POOL = (
    "pod-unknown",
    "state-unavailable",
    "node-unknown",
    "api-error",
    "deadline",
    "table-error",
    "busy",  # warn and audit modes only: enforce denies a decision that waited too long
    "unknown-pool",  # a DRA pool no ResourceSlice publishes: not coordinated
)
TABLE_DAMAGED = "table-damaged"
BUSY = "ReservationBusy"  # the reason of a denial that waited past the budget: retried


class TableFailed(Exception):
    """The replica's table failed and no Lease coordinates the decision: nothing held it."""


Judge = Callable[[list[Any]], bool]
Keep = Callable[[Any], bool]


@dataclass(frozen=True, slots=True)
class Records:
    """How a record type sits in the stores: what identifies a record (one per identity in a
    store) and which keys it touches (it is stored under each)."""

    name: str  # what the records are, for messages: "reservation", "allocation"
    identity: Callable[[Any], str]
    keys: Callable[[Any], Iterable[str]]

    def merged(self, *stores: Iterable[Any]) -> list[Any]:
        """One record per identity over several stores (the first seen wins), in order."""
        seen: dict[str, Any] = {}
        for entries in stores:
            for entry in entries:
                seen.setdefault(self.identity(entry), entry)
        return list(seen.values())


class Transaction:
    """One decision of ``new`` over ``keys`` (see the module doc). ``trouble``: what went wrong
    with the replica's table, if anything (``table-error``, ``table-damaged``)."""

    def __init__(
        self,
        records: Records,
        table: LocalTable | None,
        leases: LeaseStore | None,
        budget: Budget,
        undo_budget: Callable[[], Budget],
    ) -> None:
        self.records, self.table, self.leases = records, table, leases
        self.budget, self.undo_budget = budget, undo_budget
        self.trouble: str | None = None

    def run(
        self,
        keys: list[str],
        new: Any,
        judge: Judge,
        keep: Keep,
        *,
        coordinated: bool,
        write: bool,
        stands: Callable[[], bool] | None = None,
    ) -> bool:
        """Whether ``new`` fits (``judge`` over every record seen, ``new``'s own set aside by the
        judge); when it does and ``write``, it is recorded under every key (beside the records
        ``keep`` says stay). ``coordinated``: whether the Leases are written (else only read,
        to rebuild a damaged table). ``stands``: whether a verdict the caller reached before
        still holds; with it, the cheap path (see the module doc) may decide."""
        if coordinated and self.leases is not None:  # asked before the tables, not after them
            waiting.before_waiting("the API server (a coordinated decision's Leases)")
        held = self._hold(keys, coordinated)
        try:
            if stands is not None and write and not coordinated and self._alone(held, new) and stands():
                self._add(held[0], new)
                return True
            damaged = any(h.damaged for h in held)
            if damaged:
                self.trouble = TABLE_DAMAGED
            seen = self.records.merged(*(h.entries for h in held))
            if not judge(seen):
                return False  # the replica's own records deny: no round trip
            fits, leased = True, False
            if self.leases is not None and keys and (coordinated or damaged):
                reads = {key: self.leases.read(key, self.budget) for key in keys}
                local = {self.records.identity(e) for e in seen}
                seen, leased = self.records.merged(seen, *(r.records for r in reads.values())), True
                if {self.records.identity(e) for e in seen} != local:
                    fits = judge(seen)  # the Leases hold records the table did not: judged again
                if fits and write and coordinated:
                    seen = self._write_leases(reads, seen, new, judge, keep)
                    fits = seen is not None
            if held:
                self._store_tables(keys, held, seen or [], new if fits and write else None, keep, leased)
            return fits
        finally:
            _release(held)

    def _alone(self, held: list[HeldTable], new: Any) -> bool:
        """One key's table, whole, holding no record but ``new``'s own: nothing there for a
        judge to count, and nothing of anyone else's to keep or drop."""
        if len(held) != 1 or held[0].damaged:
            return False
        identity, mine = self.records.identity, self.records.identity(new)
        return all(identity(entry) == mine for entry in held[0].entries)

    def _add(self, table: HeldTable, new: Any) -> None:
        """``new`` into a table that holds nothing else. An earlier record of the same identity
        stays as it is, as the whole path leaves it (the table is rewritten only when what it
        holds changes)."""
        if table.entries:
            return
        try:
            table.store([new])
        except OSError:
            self.trouble = TABLE_ERROR  # decided all the same, as in ``_store_tables``

    def _hold(self, keys: list[str], coordinated: bool) -> list[HeldTable]:
        """Every key's table, held in the order of ``keys`` (released by ``_release``)."""
        if self.table is None:
            return []
        held: list[HeldTable] = []
        try:
            for key in keys:
                held.append(self.table.hold(key, self.budget.wait_until))
        except OSError as err:
            _release(held)
            self.trouble = TABLE_ERROR
            if not coordinated or self.leases is None:
                raise TableFailed(f"the {self.records.name} table failed: {err}") from None
            return []
        except BaseException:
            _release(held)
            raise
        return held

    def _write_leases(
        self, reads: dict[str, LeaseRead], seen: list[Any], new: Any, judge: Judge, keep: Keep
    ) -> list[Any] | None:
        """Write ``new`` to every key's Lease: the records seen, or None when a sibling won a key
        meanwhile and ``new`` no longer fits (the keys written are undone)."""
        leases, mine = self.leases, self.records.identity(new)
        written: list[str] = []
        try:
            for key, read in reads.items():
                while not leases.write(read, self._after(read.records, new, keep), self.budget):
                    if self.budget.waiting() <= 0:
                        raise Busy(f"the Lease of {key} kept changing under other writers")
                    read = leases.read(key, self.budget)
                    seen = self.records.merged(seen, read.records)
                    if not judge(seen):
                        self._undo(written, mine)
                        return None
                written.append(key)
        except (Busy, LeaseFull):  # denied: nothing may stay (an outage allows, and keeps them)
            self._undo(written, mine)
            raise
        return seen

    def _after(self, stored: list[Any], new: Any, keep: Keep) -> list[Any]:
        mine = self.records.identity(new)
        return [*(e for e in stored if self.records.identity(e) != mine and keep(e)), new]

    def _store_tables(
        self,
        keys: list[str],
        held: list[HeldTable],
        seen: list[Any],
        new: Any | None,
        keep: Keep,
        leased: bool,
    ) -> None:
        """Each key's table: its records still kept and, when decided, ``new``; rewritten only
        when that changes what it holds (or it was damaged)."""
        if new is None and not leased and not any(h.damaged for h in held):
            return
        identity = self.records.identity
        for key, table in zip(keys, held, strict=True):
            known = self.records.merged(table.entries, seen)
            wanted = [e for e in known if keep(e) and key in self.records.keys(e)]
            if new is not None:
                wanted = [*(e for e in wanted if identity(e) != identity(new)), new]
            if not table.damaged and [identity(e) for e in wanted] == [identity(e) for e in table.entries]:
                continue
            try:
                table.store(wanted)
            except OSError:
                self.trouble = TABLE_ERROR  # decided all the same: the Leases hold what is shared

    def _undo(self, keys: list[str], identity: str) -> None:
        """Take a denied decision's record out of the Leases it was written to, on a thread of
        its own: the denial is answered at once, the undo follows within a round trip."""
        if not keys:
            return
        leases, records = self.leases, self.records

        def undo() -> None:
            for key in keys:
                try:
                    leases.update(
                        key,
                        lambda stored: [e for e in stored if records.identity(e) != identity],
                        self.undo_budget(),
                    )
                except (Busy, LeaseFull, DeadlineExceeded, ApiError) as err:
                    log.warning(
                        "could not take the denied record %s out of the Lease of %s: %s", identity, key, err
                    )

        threading.Thread(target=undo, name="coordination-undo", daemon=True).start()


def _release(held: list[HeldTable]) -> None:
    """The tables held, released in the reverse order of their holding (as nested ``with``
    blocks would), every one of them even when one fails."""
    if held:
        table = held.pop()
        try:
            table.release()
        finally:
            _release(held)
