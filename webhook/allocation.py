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
and fail-open rules are the bind guard's: the settings of ``config.reservations``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from . import admission
from .admission import VALIDATE, AdmissionRequest, Outcome, allowed_unchecked, deny, is_claim_status, respond
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
from .dra.judge import missing_pools
from .engine import Decision, apply_finding
from .kube.dra import ResourceClaim, is_allocation_write, resource_claim_from
from .kube.errors import FieldError
from .policies import Allocation, Context, Finding, Mode
from .policies.registry import ALLOCATION_COORDINATOR
from .policies.registry import ALLOCATION_POLICIES as HOOKED
from .state.apiserver import ApiError
from .state.source import StateSource

POLICY = ALLOCATION_COORDINATOR.NAME
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
        if not is_allocation_write(req.obj, req.old_obj, req.operation):
            return outcome
        if not self.judges(req):
            return outcome
        modes = {p.NAME: self.config.active(p.NAME, req.namespace, req.user, req.groups) for p in HOOKED}
        modes = {name: mode for name, mode in modes.items() if mode != Mode.OFF}
        try:
            claim = resource_claim_from(req.obj)  # the one read of the claim
        except FieldError as err:
            if outcome.decision is not None:
                return outcome  # the engine answered for an unreadable claim
            return admission.unchecked(req, VALIDATE, f"{req.kind} field {err}", self.config)
        allocation = claim.allocation
        if allocation is None:
            return outcome
        if len(allocation.results) > MAX_RESULTS:
            return deny(
                outcome,
                POLICY,
                "Invalid",
                f"status.allocation.devices.results: Too many: {len(allocation.results)}: must have at "
                f"most {MAX_RESULTS} items (the API server refuses this write)",
                code=422,
            )
        settings = self.config.reservations
        now = self.clock()
        version = str((req.old_obj or {}).get("metadata", {}).get("resourceVersion") or "")
        confirm = None if verified else now + settings.confirm_seconds
        try:
            new = in_flight(claim.key, req.obj, version, now + settings.ttl_seconds, confirm)
        except ValueError as err:
            return _busy(outcome, str(err))
        judge = _Judge(
            new, claim, source, req, now, self.config, {n: m for n, m in modes.items() if m != Mode.OFF}
        )
        transaction = Transaction(
            IN_FLIGHT_RECORDS, self.local, self.leases, Budget.of(settings), lambda: Budget.of(settings)
        )
        try:
            pools, unknown = _pools(new, claim, source)
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
        if fits and unknown:
            _unchecked(
                outcome,
                UNKNOWN_POOL,
                f"pools {', '.join(unknown)} are in no ResourceSlice the guard knows; their devices "
                "were not checked against allocations in flight",
            )
        decision = Decision()
        for name, findings in judge.found.items():
            for finding in findings:
                apply_finding(decision, name, judge.modes[name], finding)
        return respond(outcome, decision)


@dataclass(slots=True)
class _Judge:
    """One allocation judged by every policy's ``check_allocation`` against the index plus the
    records still in flight, at one moment of the state (its lock held); the records that ended
    are not written back."""

    new: InFlight
    claim: ResourceClaim
    source: StateSource
    req: AdmissionRequest
    now: float
    config: Config
    modes: dict[str, Mode]  # the active policies with the hook
    found: dict[str, list[Finding]] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)

    def __call__(self, entries: list[InFlight]) -> bool:
        with self.source.reading() as view:
            state = view.state
            if state is None or state.devices is None:
                raise _StateGone(view.unavailable or "no device state")
            others = [e for e in entries if e.claim != self.new.claim]
            self.dropped.update(e.claim for e in others if not kept(e, state, self.now))
            flying = tuple(e.allocation for e in others if counts(e, state, self.now))
            allocation = Allocation(self.claim, self.req.user, state, flying)
            context = Context(state, self.config)
            self.found = {}
            for policy in HOOKED:
                if policy.NAME in self.modes:
                    findings = policy.check_allocation(allocation, context)
                    if findings:
                        self.found[policy.NAME] = findings
        return not any(
            self.modes[name].denies and not f.advisory for name, fs in self.found.items() for f in fs
        )

    def keep(self, entry: InFlight) -> bool:
        return entry.claim not in self.dropped


def _pools(new: InFlight, claim: ResourceClaim, source: StateSource) -> tuple[list[str], list[str]]:
    """The record's pools the state knows (coordinated, in order) and those it does not
    (``missing_pools``): a Lease per pool is made only for pools some ResourceSlice publishes."""
    with source.reading() as view:
        state = view.state
        if state is None or state.devices is None:
            raise _StateGone(view.unavailable or "no device state")
        missing = {"/".join(key) for key in missing_pools(claim, state.devices)}
    return sorted(new.pools - missing), sorted(missing)


class _StateGone(Exception):
    """No device state to judge against."""


def _unchecked(outcome: Outcome, why: str, detail: str) -> Outcome:
    return allowed_unchecked(outcome, why, "allocation against allocations in flight", detail)


def _busy(outcome: Outcome, why: str) -> Outcome:
    message = f"the allocation was not decided: {why}. The scheduler will retry it."
    return deny(outcome, POLICY, BUSY, message, code=429)
