"""The DRA allocation guard: allocations in flight, so no two claims are handed the same device.

Between an allowed ``resourceclaims/status`` write and the watch event that shows it, the
device index does not know the allocation: another scheduler's write for the same device, on
another thread, worker or replica, would pass. As for binds (``binding.py``), every allowed
allocation is recorded before it is answered, per pool, through the coordination package
(``coordination/``): in the replica's table and, across replicas, in a Lease per pool. A later
write is judged against the index plus these records; one that loses is denied
``DeviceAlreadyAllocated`` like any other. When a record counts, and what it holds, is
``coordination/allocations.py``'s.

Every pool's Lease is read and judged before any is written, within one time budget
(``reservations.budgetSeconds``, below the webhook's timeout): past it, or when a Lease cannot
take the record, the answer is ``ReservationBusy``, never a late or unchecked one. Only pools
the state knows are coordinated. Dry runs are judged the same way and write nothing. Deadlines
and fail-open rules are the bind guard's: the settings of ``policies.nodeAdmission.reservations``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

from . import admission
from .admission import VALIDATE, AdmissionRequest, Outcome, is_claim_status
from .config import Config
from .coordination.allocations import MAX_RESULTS, InFlight, counts, in_flight, kept
from .coordination.budget import Budget, Busy, DeadlineExceeded
from .coordination.lease import LeaseFull, LeaseStore
from .coordination.table import LocalTable
from .coordination.transaction import (
    API_ERROR,
    BUSY,
    DEADLINE,
    STATE_UNAVAILABLE,
    TABLE_ERROR,
    UNKNOWN_POOL,
    Records,
    TableFailed,
    Transaction,
)
from .engine import Decision, Violation
from .kube.dra import ClaimAllocation, ResourceClaim, resource_claim_from
from .kube.errors import FieldError
from .policies import Mode, device_allocation
from .state.apiserver import ApiError
from .state.source import StateSource

POLICY = device_allocation.NAME
# A claim's record is stored under each pool it holds devices of.
IN_FLIGHT_RECORDS = Records("allocation", identity=lambda e: e.claim, keys=lambda e: e.pools)


class AllocationGuard:
    """Records allowed allocations per pool, and judges each against those still in flight."""

    def __init__(
        self, config: Config, local: LocalTable | None, leases: LeaseStore | None = None, clock=time.time
    ) -> None:
        self.config = config
        self.local = local
        self.leases = leases
        self.clock = clock

    def judges(self, req: AdmissionRequest) -> bool:
        """Whether this guard judges the request's allocation (its policy denies or warns here):
        then it judges it whole, against the index and the records in flight together, and the
        engine need not judge it first."""
        return self.config.active(POLICY, req.namespace, req.user, req.groups) in (Mode.ENFORCE, Mode.WARN)

    def review(
        self, req: AdmissionRequest, source: StateSource, outcome: Outcome, *, verified: bool = False
    ) -> Outcome:
        """An allocation write: judged against the index and the allocations in flight, and
        recorded when it fits (a dry run is judged and records nothing). ``outcome``: what the
        engine answered, or an allowing one when the engine did not judge it. ``verified``: the
        caller proved it is the API server."""
        if not is_claim_status(req) or not outcome.allowed or req.obj is None:
            return outcome
        if not device_allocation.is_allocation_write(req.obj, req.old_obj, req.operation):
            return outcome
        mode = self.config.active(POLICY, req.namespace, req.user, req.groups)
        if mode not in (Mode.ENFORCE, Mode.WARN):
            return outcome
        try:
            claim = resource_claim_from(req.obj)  # the one read of the claim
        except FieldError as err:
            if outcome.decision is not None:
                return outcome  # the engine answered for an unreadable claim
            return admission.unchecked(req, VALIDATE, f"{req.kind} field {err}", self.config)
        allocation = claim.allocation
        if allocation is None:
            return outcome
        self._allocators(outcome, req, allocation)
        if len(allocation.results) > MAX_RESULTS:
            return _deny(
                outcome,
                [("Invalid", f"status.allocation.devices.results: Too many: {len(allocation.results)}: "
                  f"must have at most {MAX_RESULTS} items (the API server refuses this write)")],
                code=422,
            )  # fmt: skip
        settings = self.config.node_admission.reservations
        now = self.clock()
        version = str((req.old_obj or {}).get("metadata", {}).get("resourceVersion") or "")
        confirm = None if verified else now + settings.confirm_seconds
        try:
            new = in_flight(claim.key, req.obj, version, now + settings.ttl_seconds, confirm)
        except ValueError as err:
            return _busy(outcome, str(err))
        judge = _Judge(new, claim, source, req, now)
        transaction = Transaction(
            IN_FLIGHT_RECORDS, self.local, self.leases, Budget.of(settings), lambda: Budget.of(settings)
        )
        try:
            pools, unknown = _pools(new, source)
            fits = transaction.run(pools, new, judge, judge.keep, coordinated=True, write=not req.dry_run)
        except _StateGone as err:
            return _unchecked(outcome, STATE_UNAVAILABLE, str(err))
        except (Busy, LeaseFull) as err:
            return _busy(outcome, str(err))
        except DeadlineExceeded as err:
            return _unchecked(outcome, DEADLINE, str(err))
        except ApiError as err:
            return _unchecked(outcome, API_ERROR, str(err))
        except TableFailed as err:
            return _unchecked(outcome, TABLE_ERROR, str(err))
        finally:
            outcome.table_trouble = transaction.trouble
        if fits:
            if unknown:
                _unchecked(
                    outcome,
                    UNKNOWN_POOL,
                    f"pools {', '.join(unknown)} are in no ResourceSlice the guard knows; their devices "
                    "were not checked against allocations in flight",
                )
            return outcome
        if mode == Mode.WARN:
            for f in judge.findings:
                outcome.response.setdefault("warnings", []).append(f"[{POLICY}] {f.reason}: {f.message}")
            return outcome
        return _deny(outcome, [(f.reason, f.message) for f in judge.findings])

    def _allocators(self, outcome: Outcome, req: AdmissionRequest, allocation: ClaimAllocation) -> None:
        """An allocation written by an identity the driver's ``allocators`` do not include: a
        ``MixedDeviceScheduler`` warning (like binders: a denial would make it retry forever)."""
        device = self.config.device_scheduler
        if device.mode == Mode.OFF or not device.allocators:
            return
        for driver in sorted({r.driver for r in allocation.results}):
            allowed = device.allowed_allocators(driver)
            if allowed is not None and not any(fnmatchcase(req.user, p) for p in allowed):
                outcome.response.setdefault("warnings", []).append(
                    f"[deviceScheduler] MixedDeviceScheduler: ResourceClaim {req.namespace}/{req.name} was "
                    f"allocated devices of {driver} by {req.user or 'an unknown writer'}; only "
                    f"{', '.join(allowed)} should allocate them."
                )


@dataclass(slots=True)
class _Judge:
    """One allocation judged against the index plus the records still in flight, at one
    moment of the state (its lock held); the records that ended are not written back."""

    new: InFlight
    claim: ResourceClaim
    source: StateSource
    req: AdmissionRequest
    now: float
    findings: list = field(default_factory=list)
    dropped: set[str] = field(default_factory=set)

    def __call__(self, entries: list[InFlight]) -> bool:
        with self.source.reading() as view:
            state = view.state
            if state is None or state.devices is None:
                raise _StateGone(view.unavailable or "no device state")
            others = [e for e in entries if e.claim != self.new.claim]
            self.dropped.update(e.claim for e in others if not kept(e, state, self.now))
            flying = [e.allocation for e in others if counts(e, state, self.now)]
            self.findings[:] = device_allocation.allocation_findings(self.claim, state, self.req.user, flying)
        return not self.findings

    def keep(self, entry: InFlight) -> bool:
        return entry.claim not in self.dropped


def _pools(new: InFlight, source: StateSource) -> tuple[list[str], list[str]]:
    """The record's pools the state knows (coordinated, in order) and those it does not: a
    Lease per pool is made only for pools some ResourceSlice publishes."""
    with source.reading() as view:
        state = view.state
        if state is None or state.devices is None:
            raise _StateGone(view.unavailable or "no device state")
        known = {p: state.devices.pool(*p.split("/", 1)) is not None for p in new.pools}
    return sorted(p for p, k in known.items() if k), sorted(p for p, k in known.items() if not k)


class _StateGone(Exception):
    """No device state to judge against."""


def _unchecked(outcome: Outcome, why: str, detail: str) -> Outcome:
    outcome.fail_open = why
    outcome.error = f"allocation not checked against allocations in flight ({why}): {detail}"
    outcome.response.setdefault("warnings", []).append(
        f"admit-guard did not check this allocation against allocations in flight and allowed it: {detail}"
    )
    return outcome


def _busy(outcome: Outcome, why: str) -> Outcome:
    return _deny(
        outcome,
        [(BUSY, f"the allocation was not decided: {why}. The scheduler will retry it.")],
        code=429,
    )


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
