"""The DRA allocation guard: allocations in flight, so no two claims are handed the same device.

Between an allowed ``resourceclaims/status`` write and the watch event that shows it, the
device index does not know the allocation: another scheduler's write for the same device, on
another thread, worker or replica, would pass. As for binds (``binding.py``), every allowed
allocation is recorded before it is answered, per pool: in the replica's table and, across
replicas, in a Lease per pool (``admit-guard-pool-<driver>-<pool>``) replaced with its
``resourceVersion`` (etcd is the arbiter). A later write is judged against the index plus
these records; one that loses is denied ``DeviceAlreadyAllocated`` like any other.

A record counts until its claim changes in the state (the write landed: the index counts it
from then on; or something else changed the claim), its TTL passes, or, for an
unauthenticated caller, its confirmation time passes without the claim showing allocated.
Deallocation frees a device at once: the index drops it, and the record had stopped counting
when the allocation landed. Dry runs reserve nothing. Deadlines and fail-open rules are the
bind guard's: the settings of ``policies.nodeAdmission.reservations``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from .admission import AdmissionRequest, Outcome, is_claim_status
from .config import Config
from .engine import Decision, Violation
from .kube.dra import ClaimAllocation, claim_allocation_from
from .kube.errors import FieldError
from .policies import device_allocation
from .state.apiserver import ApiError
from .state.model import ClusterState
from .state.reservations import Budget, Busy, Codec, DeadlineExceeded, LeaseStore, LocalTable
from .state.source import StateSource

POLICY = device_allocation.NAME
POOL_LEASE_PREFIX = "admit-guard-pool-"
ANNOTATION = "admit-guard.io/allocations"
API_ERROR, DEADLINE, TABLE_ERROR, STATE_UNAVAILABLE = (
    "api-error",
    "deadline",
    "table-error",
    "state-unavailable",
)


@dataclass(frozen=True, slots=True)
class InFlight:
    """An allocation allowed and not yet seen: the claim's record as the index would hold it."""

    claim: str  # the claim's key (uid)
    version: str  # the claim's resourceVersion the write replaces
    record: Mapping[str, Any]  # metadata and status.allocation, as written
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


def kept(entry: InFlight, state: ClusterState, now: float) -> bool:
    """Whether a record is written back: until its TTL, while its write has not landed (and,
    for an unauthenticated caller, until its confirmation time); once landed, while the claim
    stays allocated, for replicas whose watch lags. A claim changed and not allocated (the
    write was overtaken, or the claim deallocated since) drops it."""
    if entry.expires <= now or state.devices is None:
        return False
    version = state.devices.version(entry.claim)
    if version is not None and version != entry.version:
        return state.devices.claim(entry.claim) is not None
    return entry.confirm_by is None or now < entry.confirm_by


def counts(entry: InFlight, state: ClusterState, now: float) -> bool:
    """Whether a record adds to what the index holds: kept, and its claim not changed since."""
    if not kept(entry, state, now):
        return False
    version = state.devices.version(entry.claim)
    return version is None or version == entry.version


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
        recorded when it still fits. ``verified``: the caller proved it is the API server."""
        if not is_claim_status(req) or not outcome.allowed or req.dry_run or req.obj is None:
            return outcome
        if not device_allocation.is_allocation_write(req.obj, req.old_obj, req.operation):
            return outcome
        mode = self.config.policy(POLICY).mode
        if mode in ("off", "audit") or self._exempt(req):
            return outcome
        self._allocators(outcome, req)
        try:
            key, _ = claim_allocation_from(req.obj)
        except FieldError:
            return outcome  # the engine answered for an unreadable claim
        settings = self.config.node_admission.reservations
        now = self.clock()
        version = str((req.old_obj or {}).get("metadata", {}).get("resourceVersion") or "")
        confirm = None if verified else now + settings.confirm_seconds
        new = InFlight(key, version, _record(req.obj), now + settings.ttl_seconds, confirm)
        pools = sorted(new.pools)
        budget = Budget.start(settings.wait_seconds, settings.deadline_seconds)
        findings: list = []
        try:
            fits = self._decide(pools, new, source, req, now, budget, findings, outcome)
        except _StateGone as err:
            return _unchecked(outcome, STATE_UNAVAILABLE, str(err))
        except Busy as err:
            return _deny(
                outcome,
                [("ReservationBusy", f"other allocations in pools {', '.join(pools)} were still being "
                  f"decided after {settings.wait_seconds:g} s ({err}); the scheduler will retry.")],
                code=429,
            )  # fmt: skip
        except DeadlineExceeded as err:
            return _unchecked(outcome, DEADLINE, str(err))
        except ApiError as err:
            return _unchecked(outcome, API_ERROR, str(err))
        except _TableFailed as err:
            return _unchecked(outcome, TABLE_ERROR, str(err))
        if fits:
            return outcome
        if mode == "warn":
            for f in findings:
                outcome.response.setdefault("warnings", []).append(f"[{POLICY}] {f.reason}: {f.message}")
            return outcome
        return _deny(outcome, [(f.reason, f.message) for f in findings])

    def _decide(
        self,
        pools: list[str],
        new: InFlight,
        source: StateSource,
        req: AdmissionRequest,
        now: float,
        budget: Budget,
        findings: list,
        outcome: Outcome,
    ) -> bool:
        """Lock every pool's table (in order), judge against the index plus what the tables
        and the pools' Leases hold in flight, and record ``new`` in each. A table that fails
        leaves the Leases to coordinate (``table-error``); without Leases nothing would."""
        dropped: set[str] = set()

        def judge(entries: list[InFlight]) -> bool:
            with source.reading() as view:
                state = view.state
                if state is None or state.devices is None:
                    raise _StateGone(view.unavailable or "no device state")
                others = [e for e in entries if e.claim != new.claim]
                dropped.update(e.claim for e in others if not kept(e, state, now))
                flying = [e.allocation for e in others if counts(e, state, now)]
                findings[:] = device_allocation.allocation_findings(req.obj, state, req.user, flying)
            return not findings

        def keep(entry: InFlight) -> bool:
            return entry.claim not in dropped and entry.claim != new.claim

        with ExitStack() as stack:
            held = self._locked_tables(stack, pools, budget, outcome)
            local = _merged(*(h.entries for h in held))
            if not judge(local):
                return False  # the replica's own records deny: no round trip
            seen = list(local)
            for pool in pools if self.leases is not None else ():
                leased: list[InFlight] = []

                def change(stored: list[InFlight], leased=leased, seen=seen) -> list[InFlight] | None:
                    leased[:] = stored
                    if not judge(_merged(seen, stored)):
                        return None
                    return [*(e for e in stored if keep(e)), new]

                if self.leases.update(pool, change, budget) is None:
                    return False
                seen = _merged(seen, leased)
            for pool, table in zip(pools, held, strict=False):  # every pool's table, or none
                try:
                    table.store(
                        [*(e for e in _merged(table.entries, seen) if keep(e) and pool in e.pools), new]
                    )
                except OSError:
                    outcome.table_trouble = TABLE_ERROR  # the Leases hold what must be shared
        return True

    def _locked_tables(self, stack: ExitStack, pools: list[str], budget: Budget, outcome: Outcome) -> list:
        if self.local is None:
            return []
        try:
            return [stack.enter_context(self.local.locked(p, budget.wait_until)) for p in pools]
        except OSError as err:
            stack.close()
            outcome.table_trouble = TABLE_ERROR
            if self.leases is None:
                raise _TableFailed(f"the allocation table failed: {err}") from None
            return []

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


def _record(obj: Mapping[str, Any]) -> dict[str, Any]:
    metadata = obj.get("metadata") or {}
    return {
        "metadata": {k: metadata[k] for k in ("namespace", "name", "uid") if k in metadata},
        "status": {"allocation": (obj.get("status") or {}).get("allocation")},
    }


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
