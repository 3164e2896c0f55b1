"""The admission pipeline: one AdmissionReview in, one ``Outcome`` out, whoever asks.

The server (``serve/``) frames HTTP and calls ``Pipeline``; the policy test suite's binds go
through it too. A review is routed once, by what the API server says it is (resource,
subresource, operation), and each object is read once:

- ``pods/binding`` (or ``bindings``): the Binding's pod and node are read here, then judged by
  the bind guard against the state and the binds in flight (``binding.py``);
- ``resourceclaims/status`` setting an allocation, where the allocation guard's policy enforces
  or warns and the guard runs: judged once, by the guard, against the device index and the
  allocations in flight together (``allocation.py``), never first by the engine alone;
- anything else: the engine (``admission.review``), then, for a pod created with
  ``spec.nodeName``, its capacity reserved like a bind's, and for the first pod of an owner whose
  storm breaker waits for a probe, the probe slot claimed (``coordination/probes.py``).

Round trips to the API server (Leases) happen outside the state's lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import admission
from .admission import VALIDATE, AdmissionRequest, Outcome, is_claim_status
from .allocation import AllocationGuard
from .binding import BindGuard, BindingTarget, binding_target, is_binding
from .config import Config
from .coordination.probes import SharedProbes
from .kube.dra import is_allocation_write
from .kube.rejection import controller_owner
from .state import waiting
from .state.model import ClusterState
from .state.source import StateSource
from .state.storm import StormBreakers

BIND, ALLOCATION, OBJECT = "bind", "allocation", "object"


@dataclass(frozen=True, slots=True)
class Routed:
    """A review read and routed: its request, its route, and a Binding's pod and node."""

    request: AdmissionRequest
    route: str
    target: BindingTarget | None = None


def read_review(body: bytes) -> Routed:
    """Parse and route a review body; ``ReviewError`` (the body's problem: 400) names the field,
    a Binding's included."""
    return route(admission.parse_review(body))


def route(req: AdmissionRequest) -> Routed:
    """Where a request goes, decided once."""
    if is_binding(req):
        return Routed(req, BIND, binding_target(req))
    obj = req.obj
    if is_claim_status(req) and obj is not None and is_allocation_write(obj, req.old_obj, req.operation):
        return Routed(req, ALLOCATION)
    return Routed(req, OBJECT)


class Pipeline:
    """The guard's answer to routed reviews, from one state source and config.

    ``observe``: called with the state under its lock once per object review (the server
    publishes the storm breakers' gauges from it)."""

    def __init__(
        self,
        config: Config,
        source: StateSource,
        *,
        bind_guard: BindGuard | None = None,
        allocation_guard: AllocationGuard | None = None,
        probes: SharedProbes | None = None,
        observe: Callable[[ClusterState], None] | None = None,
    ) -> None:
        self.config, self.source = config, source
        self.bind_guard, self.allocation_guard = bind_guard, allocation_guard
        self.probes = probes or SharedProbes(None, None, 0.0, 0.0)
        self.observe = observe

    def decide(self, routed: Routed, endpoint: str, *, verified: bool, now: float) -> Outcome:
        req = routed.request
        validating = endpoint == VALIDATE
        if routed.route == BIND:
            if self.bind_guard is None or not validating:
                return Outcome.allowing(req)
            if self.bind_guard.leases is not None:  # said before any work a thread would redo
                waiting.before_waiting("the API server (a bind the Leases may coordinate)")
            return self.bind_guard.review(req, self.source, verified=verified, target=routed.target)
        if routed.route == ALLOCATION and validating and self._guard_judges_allocations(req):
            if self.allocation_guard.leases is not None:
                waiting.before_waiting("the API server (an allocation the Leases may coordinate)")
            return self.allocation_guard.review(req, self.source, Outcome.allowing(req), verified=verified)
        outcome, judged, storm = self._engine(req, endpoint, now)
        owner = _probe_owner(storm, req, outcome, now) if validating else None
        if owner is not None:
            waiting.before_waiting("a storm probe's claim")  # a retry would find the slot taken
        if owner is not None and not self.probes.claim(storm, owner, now):  # round trips: no lock held
            outcome = self._engine(req, endpoint, now)[0]  # another probe holds the slot: the breaker denies
        if validating and self.bind_guard is not None:
            outcome = self.bind_guard.review_created(req, self.source, outcome, judged, verified=verified)
        return outcome

    def _engine(self, req: AdmissionRequest, endpoint: str, now: float):
        """The engine's verdict, the state and revision it was reached at, and the breakers."""
        with self.source.reading() as view:
            state = view.state
            outcome = admission.review(req, endpoint, state, self.config, view.unavailable, now)
            if state is None:
                return outcome, None, None
            if self.observe is not None:
                self.observe(state)
            return outcome, (state, state.revision), state.storm

    def _guard_judges_allocations(self, req: AdmissionRequest) -> bool:
        """The allocation guard judges an allocation whole (index and records in flight) where
        its policy denies or warns and there are devices to judge against; otherwise the
        engine answers (audit mode records, no device state is said)."""
        if self.allocation_guard is None or not self.allocation_guard.judges(req):
            return False
        with self.source.reading() as view:  # without devices, the engine says why not
            return view.unavailable is None and view.state is not None and view.state.devices is not None


def _probe_owner(
    storm: StormBreakers | None, req: AdmissionRequest, outcome: Outcome, now: float
) -> str | None:
    """The owner whose probe an allowed pod would be (its breaker waits for one), or None. The
    pod passes only if it takes the probe slot, so the owner's next pods are denied until the
    probe runs or is rejected."""
    if storm is None or not storm.breakers or not outcome.allowed or req.dry_run:
        return None
    if req.operation != "CREATE" or req.kind != "Pod" or req.obj is None:
        return None
    owner = controller_owner(req.obj)
    return owner.uid if owner is not None and storm.verdict(owner.uid, now).probe else None
