"""The DRA allocation guard: allocations in flight, so no two claims are handed the same device.

Between an allowed ``resourceclaims/status`` write and the watch event that shows it, the
device index does not know the allocation: another scheduler's write for the same device, on
another thread, worker or replica, would pass. As for binds (``binding.py``), every allowed
allocation is recorded before it is answered, per pool: in the replica's table and, across
replicas, in a Lease per pool (``admit-guard-pool-<driver>-<pool>``) replaced with its
``resourceVersion`` (etcd is the arbiter). A later write is judged against the index plus
these records; one that loses is denied ``DeviceAlreadyAllocated`` like any other.

A record ends only on evidence that its write landed or was undone, never because the state
is older than the record: real writers update a claim just before the write the guard judges
(kube-scheduler's ``bindClaim`` adds the delete-protection finalizer with an Update, then writes
the allocation), so a review's ``oldObject`` is often newer than the watch. The state's
resourceVersion of the claim is compared with the one the write replaced (comparable since
v1.35, ``kube/resource_version.py``): older or the same, the record counts; newer and
allocated, the write landed and the index counts it (the record stays, not counted, for
replicas whose watch lags); newer and not allocated, or the claim deleted, it was overtaken or
undone and the record ends. Otherwise it ends with its TTL or, for an unauthenticated caller,
its confirmation time.

A record holds what counts and nothing else (the results' devices, shares and consumed
capacity: never the claim's opaque parameters), within ``MAX_RESULTS`` results and
``MAX_RECORD_BYTES``. A decision reads every pool's Lease and judges against all of them
before it writes any, within one time budget (``reservations.budgetSeconds``, below the
webhook's timeout): past it, or when a Lease cannot take the record, the answer is
``ReservationBusy``, never a late or unchecked one, and a write that loses its pool to a sibling
after the others were written is undone. Only pools the state knows are coordinated. Dry runs
are judged the same way and write nothing. Deadlines and fail-open rules are the bind guard's:
the settings of ``policies.nodeAdmission.reservations``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

import orjson

from .admission import AdmissionRequest, Outcome, is_claim_status
from .config import Config
from .engine import Decision, Violation
from .kube.dra import ClaimAllocation, claim_allocation_from
from .kube.errors import FieldError
from .kube.resource_version import compare_resource_versions
from .policies import device_allocation
from .state.apiserver import ApiError
from .state.devices import DeviceIndex
from .state.model import ClusterState
from .state.reservations import (
    Budget,
    Busy,
    Codec,
    DeadlineExceeded,
    LeaseFull,
    LeaseRead,
    LeaseStore,
    LocalTable,
    collect_ended,
)
from .state.source import StateSource

POLICY = device_allocation.NAME
POOL_LEASE_PREFIX = "admit-guard-pool-"
ANNOTATION = "admit-guard.io/allocations"
API_ERROR, DEADLINE, TABLE_ERROR, STATE_UNAVAILABLE, UNKNOWN_POOL = (
    "api-error",
    "deadline",
    "table-error",
    "state-unavailable",
    "unknown-pool",
)
BUSY = "ReservationBusy"
# resource.k8s.io/v1 ``AllocationResultsMaxSize``: the API server refuses a longer allocation, so
# only a forged review names more (and would make the guard coordinate that many pools).
MAX_RESULTS = 32
# A record of 32 results with their consumed capacity stays far below this; a pool's Lease
# (256 KiB of annotations) then holds dozens of the largest.
MAX_RECORD_BYTES = 16 * 1024
# The fields of a result that say what it holds (``holds``); the rest is not recorded.
RESULT_FIELDS = ("request", "driver", "pool", "device", "adminAccess", "shareID", "consumedCapacity")

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class InFlight:
    """An allocation allowed and not yet seen: the claim's record as the index would hold it."""

    claim: str  # the claim's key (uid)
    version: str  # the claim's resourceVersion the write replaces
    record: Mapping[str, Any]  # metadata and status.allocation.devices.results, what counts of them
    expires: float
    confirm_by: float | None = None

    @property
    def allocation(self) -> ClaimAllocation | None:
        return claim_allocation_from(self.record)[1]

    @property
    def pools(self) -> set[str]:
        allocation = self.allocation
        return {"/".join(r.key[:2]) for r in allocation.results} if allocation is not None else set()

    def as_json(self) -> dict[str, Any]:
        data = {"claim": self.claim, "version": self.version, "record": self.record, "expires": self.expires}
        if self.confirm_by is not None:
            data["confirmBy"] = self.confirm_by
        return data

    @classmethod
    def from_json(cls, data: Any) -> InFlight | None:
        try:
            confirm = data.get("confirmBy")
            entry = cls(
                str(data["claim"]),
                str(data["version"]),
                dict(data["record"]),
                float(data["expires"]),
                float(confirm) if confirm is not None else None,
            )
            return entry if entry.allocation is not None else None
        except (KeyError, TypeError, ValueError, AttributeError, FieldError):
            return None  # a foreign or damaged entry holds nothing


IN_FLIGHT = Codec.listing(InFlight)

# Where a record's write stands in a state: not seen yet (it counts), landed (the index counts
# it), or ended (overtaken, undone, or its claim deleted).
PENDING, LANDED, ENDED = "pending", "landed", "ended"


def landing(entry: InFlight, devices: DeviceIndex) -> str:
    """Where ``entry``'s write stands in this index, on evidence only (see the module doc)."""
    version = devices.version(entry.claim)
    if version is None:
        return ENDED if devices.deleted(entry.claim) else PENDING
    order = compare_resource_versions(version, entry.version)
    if version == entry.version or (order is not None and order < 0):
        return PENDING  # the state has not caught up with the write (or the claim's update before it)
    if devices.claim(entry.claim) is not None:
        return LANDED
    return ENDED if order is not None else PENDING  # unordered versions: only the TTL tells


def kept(entry: InFlight, state: ClusterState, now: float) -> bool:
    """Whether a record is written back: until its TTL, unless it ended; an unauthenticated
    caller's record also ends at its confirmation time unless the state shows it landed. A
    state without devices is no evidence: kept until the TTL."""
    if entry.expires <= now:
        return False
    if state.devices is None:
        return True
    stands = landing(entry, state.devices)
    if stands == ENDED:
        return False
    return stands == LANDED or entry.confirm_by is None or now < entry.confirm_by


def counts(entry: InFlight, state: ClusterState, now: float) -> bool:
    """Whether a record adds to what the index holds: kept, and its write not yet seen."""
    return state.devices is not None and kept(entry, state, now) and landing(entry, state.devices) == PENDING


class AllocationGuard:
    """Records allowed allocations per pool, and judges each against those still in flight."""

    def __init__(
        self, config: Config, local: LocalTable | None, leases: LeaseStore | None = None, clock=time.time
    ) -> None:
        self.config = config
        self.local = local
        self.leases = leases
        self.clock = clock

    def review(
        self, req: AdmissionRequest, source: StateSource, outcome: Outcome, *, verified: bool = False
    ) -> Outcome:
        """An allocation the engine allowed: judged again with the allocations in flight, and
        recorded when it still fits (a dry run is judged and records nothing). ``verified``: the
        caller proved it is the API server."""
        if not is_claim_status(req) or not outcome.allowed or req.obj is None:
            return outcome
        if not device_allocation.is_allocation_write(req.obj, req.old_obj, req.operation):
            return outcome
        mode = self.config.policy(POLICY).mode
        if mode in ("off", "audit") or self._exempt(req):
            return outcome
        self._allocators(outcome, req)
        try:
            key, allocation = claim_allocation_from(req.obj)
        except FieldError:
            return outcome  # the engine answered for an unreadable claim
        if allocation is None:
            return outcome
        if len(allocation.results) > MAX_RESULTS:
            return _deny(
                outcome,
                [("Invalid", f"status.allocation.devices.results: Too many: {len(allocation.results)}: "
                  f"must have at most {MAX_RESULTS} items (the API server refuses this write)")],
                code=422,
            )  # fmt: skip
        settings = self.config.node_admission.reservations
        record = _record(req.obj)
        if len(record) > MAX_RECORD_BYTES:
            return _busy(outcome, f"its record would take {len(record)} bytes, over {MAX_RECORD_BYTES}")
        now = self.clock()
        version = str((req.old_obj or {}).get("metadata", {}).get("resourceVersion") or "")
        confirm = None if verified else now + settings.confirm_seconds
        new = InFlight(key, version, orjson.loads(record), now + settings.ttl_seconds, confirm)
        budget = Budget.start(settings.wait_seconds, settings.deadline_seconds, settings.budget_seconds)
        findings: list = []
        try:
            pools, unknown = self._pools(new, source)
            fits = _Decision(self, new, source, req, now, budget, findings, outcome).run(pools)
        except _StateGone as err:
            return _unchecked(outcome, STATE_UNAVAILABLE, str(err))
        except (Busy, LeaseFull) as err:
            return _busy(outcome, str(err))
        except DeadlineExceeded as err:
            return _unchecked(outcome, DEADLINE, str(err))
        except ApiError as err:
            return _unchecked(outcome, API_ERROR, str(err))
        except _TableFailed as err:
            return _unchecked(outcome, TABLE_ERROR, str(err))
        if fits:
            if unknown:
                _unchecked(
                    outcome,
                    UNKNOWN_POOL,
                    f"pools {', '.join(unknown)} are in no ResourceSlice the guard knows; their devices "
                    "were not checked against allocations in flight",
                )
            return outcome
        if mode == "warn":
            for f in findings:
                outcome.response.setdefault("warnings", []).append(f"[{POLICY}] {f.reason}: {f.message}")
            return outcome
        return _deny(outcome, [(f.reason, f.message) for f in findings])

    def _pools(self, new: InFlight, source: StateSource) -> tuple[list[str], list[str]]:
        """The record's pools the state knows (coordinated, in order) and those it does not: a
        Lease per pool is made only for pools some ResourceSlice publishes."""
        with source.reading() as view:
            state = view.state
            if state is None or state.devices is None:
                raise _StateGone(view.unavailable or "no device state")
            known = {p: state.devices.pool(*p.split("/", 1)) is not None for p in new.pools}
        return sorted(p for p, k in known.items() if k), sorted(p for p, k in known.items() if not k)

    def _exempt(self, req: AdmissionRequest) -> bool:
        return req.namespace in self.config.excluded_namespaces or self.config.exempts(
            POLICY, req.namespace, req.user, req.groups
        )

    def _allocators(self, outcome: Outcome, req: AdmissionRequest) -> None:
        """An allocation written by an identity the driver's ``allocators`` do not include: a
        ``MixedDeviceScheduler`` warning (like binders: a denial would make it retry forever)."""
        device = self.config.device_scheduler
        if device.mode == "off" or not device.allocators:
            return
        try:
            _, allocation = claim_allocation_from(req.obj)
        except FieldError:
            return
        for driver in sorted({r.driver for r in allocation.results}):
            allowed = device.allowed_allocators(driver)
            if allowed is not None and not any(fnmatchcase(req.user, p) for p in allowed):
                outcome.response.setdefault("warnings", []).append(
                    f"[deviceScheduler] MixedDeviceScheduler: ResourceClaim {req.namespace}/{req.name} was "
                    f"allocated devices of {driver} by {req.user or 'an unknown writer'}; only "
                    f"{', '.join(allowed)} should allocate them."
                )


class _Decision:
    """One allocation judged over the replica's tables and the pools' Leases.

    Every pool's table is locked (in order) for the whole decision. The records they hold are
    judged first: a denial by them needs no round trip. Then every pool's Lease is read and the
    allocation judged against all of them together, before any is written: a denial leaves
    nothing behind. The writes follow, each with the resourceVersion read; one that loses to a
    sibling reads that pool again and judges again, and if it no longer fits, the pools already
    written are undone (off the request's path: the answer is not delayed past the budget).
    """

    def __init__(
        self,
        guard: AllocationGuard,
        new: InFlight,
        source: StateSource,
        req: AdmissionRequest,
        now: float,
        budget: Budget,
        findings: list,
        outcome: Outcome,
    ) -> None:
        self.guard, self.new, self.source, self.req = guard, new, source, req
        self.now, self.budget, self.findings, self.outcome = now, budget, findings, outcome
        self.dropped: set[str] = set()  # records that ended: not written back

    def run(self, pools: list[str]) -> bool:
        write = not self.req.dry_run
        with ExitStack() as stack:
            held = self._locked_tables(stack, pools)
            seen = _merged(*(h.entries for h in held))
            if not self._judge(seen):
                return False  # the replica's own records deny: no round trip
            leases = self.guard.leases
            if leases is not None and pools:
                reads = {pool: leases.read(pool, self.budget) for pool in pools}
                seen = _merged(seen, *(r.records for r in reads.values()))
                if not self._judge(seen):
                    return False
                if write:
                    seen = self._write_leases(leases, reads, seen)
                    if seen is None:
                        return False
            if write:
                self._store_tables(pools, held, seen)
        return True

    def _judge(self, entries: list[InFlight]) -> bool:
        with self.source.reading() as view:
            state = view.state
            if state is None or state.devices is None:
                raise _StateGone(view.unavailable or "no device state")
            others = [e for e in entries if e.claim != self.new.claim]
            self.dropped.update(e.claim for e in others if not kept(e, state, self.now))
            flying = [e.allocation for e in others if counts(e, state, self.now)]
            self.findings[:] = device_allocation.allocation_findings(
                self.req.obj, state, self.req.user, flying
            )
        return not self.findings

    def _keep(self, entry: InFlight) -> bool:
        return entry.claim not in self.dropped and entry.claim != self.new.claim

    def _write_leases(
        self, leases: LeaseStore, reads: dict[str, LeaseRead], seen: list[InFlight]
    ) -> list[InFlight] | None:
        """Write the record to every pool's Lease; the records seen, or None when a sibling won
        a pool meanwhile and the allocation no longer fits (what was written is undone)."""
        written: list[str] = []
        try:
            for pool, read in reads.items():
                while not leases.write(
                    read, [*(e for e in read.records if self._keep(e)), self.new], self.budget
                ):
                    if self.budget.waiting() <= 0:
                        raise Busy(f"the Lease of pool {pool} kept changing under other writers")
                    read = leases.read(pool, self.budget)
                    seen = _merged(seen, read.records)
                    if not self._judge(seen):
                        _undo(leases, written, self.new.claim, self.guard.config)
                        return None
                written.append(pool)
        except (Busy, LeaseFull):  # denied: nothing may stay (an outage allows, and keeps them)
            _undo(leases, written, self.new.claim, self.guard.config)
            raise
        return seen

    def _locked_tables(self, stack: ExitStack, pools: list[str]) -> list:
        local = self.guard.local
        if local is None:
            return []
        try:
            return [stack.enter_context(local.locked(p, self.budget.wait_until)) for p in pools]
        except OSError as err:
            stack.close()
            self.outcome.table_trouble = TABLE_ERROR
            if self.guard.leases is None:
                raise _TableFailed(f"the allocation table failed: {err}") from None
            return []

    def _store_tables(self, pools: list[str], held: list, seen: list[InFlight]) -> None:
        for pool, table in zip(pools, held, strict=False):  # every pool's table, or none
            try:
                table.store(
                    [
                        *(e for e in _merged(table.entries, seen) if self._keep(e) and pool in e.pools),
                        self.new,
                    ]
                )
            except OSError:
                self.outcome.table_trouble = TABLE_ERROR  # the Leases hold what must be shared


class _StateGone(Exception):
    """No device state to judge against."""


class _TableFailed(Exception):
    """The replica's table failed and no Lease coordinates: nothing held the decision."""


def _merged(*stores: list[InFlight]) -> list[InFlight]:
    seen: dict[str, InFlight] = {}
    for entries in stores:
        for entry in entries:
            seen.setdefault(entry.claim, entry)
    return list(seen.values())


def _record(obj: Mapping[str, Any]) -> bytes:
    """What an allocation holds, as JSON: the claim's identity and its results' devices, shares
    and consumed capacity. Nothing the writer put beside them (opaque driver parameters,
    unknown fields) is copied: the record must serialize and stay small whatever the claim."""
    metadata = obj.get("metadata") or {}
    results = obj["status"]["allocation"]["devices"].get("results") or []
    kept = [
        {k: _plain(r[k]) for k in RESULT_FIELDS if k in r and r[k] is not None}
        for r in results
        if isinstance(r, Mapping)
    ]
    return orjson.dumps(
        {
            "metadata": {k: str(metadata[k]) for k in ("namespace", "name", "uid") if k in metadata},
            "status": {"allocation": {"devices": {"results": kept}}},
        }
    )


def _plain(value: Any) -> Any:
    """A result field as the parser read it: a string, a flag, or a map of quantities."""
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    return value if isinstance(value, bool) else str(value)


def _undo(leases: LeaseStore, pools: list[str], claim: str, config: Config) -> None:
    """Take a denied allocation's record out of the pools' Leases it was written to, on a
    thread of its own: the denial is answered at once, the undo follows within a round trip."""
    if not pools:
        return
    settings = config.node_admission.reservations

    def undo() -> None:
        for pool in pools:
            budget = Budget.start(settings.wait_seconds, settings.deadline_seconds, settings.budget_seconds)
            try:
                leases.update(pool, lambda stored: [e for e in stored if e.claim != claim], budget)
            except (Busy, LeaseFull, DeadlineExceeded, ApiError) as err:
                log.warning(
                    "could not undo the denied allocation of claim %s in pool %s: %s", claim, pool, err
                )

    threading.Thread(target=undo, name="allocation-undo", daemon=True).start()


def collect_leases(leases: LeaseStore, source: StateSource, now: float) -> int:
    """Delete the pool Leases whose every record ended in the state: how many went (none
    while the state has no devices to judge by)."""
    return collect_ended(
        leases, lambda e, state, at: state.devices is None or kept(e, state, at), source, now
    )


def _busy(outcome: Outcome, why: str) -> Outcome:
    return _deny(
        outcome,
        [(BUSY, f"the allocation was not decided: {why}. The scheduler will retry it.")],
        code=429,
    )


def _unchecked(outcome: Outcome, why: str, detail: str) -> Outcome:
    outcome.fail_open = why
    outcome.error = f"allocation not checked against allocations in flight ({why}): {detail}"
    outcome.response.setdefault("warnings", []).append(
        f"admit-guard did not check this allocation against allocations in flight and allowed it: {detail}"
    )
    return outcome


def _deny(outcome: Outcome, findings: list[tuple[str, str]], code: int = 403) -> Outcome:
    reasons = list(dict.fromkeys(reason for reason, _ in findings))
    lines = [f"{reason}: {message}" for reason, message in findings]
    text = lines[0] if len(lines) == 1 else " ".join(f"({i}) {line}" for i, line in enumerate(lines, 1))
    outcome.response["allowed"] = False
    outcome.response["status"] = {
        "code": code,
        "reason": ",".join(reasons),
        "message": f"admit-guard: {text}",
    }
    outcome.reasons = reasons
    outcome.decision = Decision(allowed=False, violations=[Violation(POLICY, r, m) for r, m in findings])
    return outcome


def allocation_stores(directory, api, namespace: str) -> tuple[LocalTable, LeaseStore | None]:
    """The replica's allocation table under ``directory`` and, with an API server, a Lease per
    pool in ``namespace``."""
    leases = None
    if api is not None:
        leases = LeaseStore(api, namespace, prefix=POOL_LEASE_PREFIX, annotation=ANNOTATION, codec=IN_FLIGHT)
    return LocalTable(directory, IN_FLIGHT), leases
