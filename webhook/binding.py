"""The bind-time guard: ``pods/binding`` reviews, and the reservations that keep two binds from
being handed the same capacity.

A scheduler's Binding reaches the kubelet unchecked: two schedulers that each see a node's
last GPU free both bind, and the kubelet fails one pod with ``UnexpectedAdmissionError``. Here
the pod (found in the live state, pending) is checked with the kubelet's rules on the target
node, against the node's usage plus the capacity already reserved for binds allowed but not
yet visible in the watch. A denied bind is clean: kube-scheduler unreserves the pod and retries
it elsewhere. Wherever the guard does not know (pod or node not in the state, state not ready,
API errors, the deadline), it allows with a warning and counts why.

I/O lives here (the reservation stores); the kubelet checks are the engine's pure ones.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase

from .admission import AdmissionRequest, Outcome, ReviewError
from .checks import Failure, PodUnderReview, kubelet_admission
from .config import Config
from .engine import Decision, Violation
from .state.apiserver import ApiError
from .state.model import ClusterState, Node, PodRecord, is_mirror
from .state.reservations import (
    DeadlineExceeded,
    LeaseStore,
    LocalTable,
    Reservation,
    counts,
    kept,
    usage_with,
)
from .state.source import StateSource

POLICY = "nodeAdmission"
# Why a bind was allowed unchecked: a closed set, for the metric.
POD_UNKNOWN, STATE_UNAVAILABLE, NODE_UNKNOWN, API_ERROR, DEADLINE = (
    "pod-unknown",
    "state-unavailable",
    "node-unknown",
    "api-error",
    "deadline",
)


# The state a verdict was reached on, and its revision then.
Judged = tuple[ClusterState, int]


@dataclass(frozen=True, slots=True)
class BindingTarget:
    uid: str
    namespace: str
    name: str
    node: str


def is_binding(req: AdmissionRequest) -> bool:
    """``pods/binding`` (the subresource schedulers use) or the legacy ``bindings`` resource."""
    return req.operation == "CREATE" and (
        req.kind == "Binding" or req.resource == "bindings" or req.sub_resource == "binding"
    )


def binding_target(req: AdmissionRequest) -> BindingTarget:
    """The pod and node of a Binding object; ``ReviewError`` names a missing field."""
    obj = req.obj or {}
    metadata = obj.get("metadata")
    target = obj.get("target")
    if not isinstance(metadata, Mapping):
        raise ReviewError("request.object.metadata: missing or not an object (a Binding)")
    if not isinstance(target, Mapping) or not isinstance(target.get("name"), str) or not target["name"]:
        raise ReviewError("request.object.target.name: missing (a Binding names its node)")
    if target.get("kind", "Node") != "Node":
        raise ReviewError(f"request.object.target.kind: {target.get('kind')!r}, expected Node")
    name = metadata.get("name") or req.name
    if not isinstance(name, str) or not name:
        raise ReviewError("request.object.metadata.name: missing (the pod to bind)")
    namespace = metadata.get("namespace") or req.namespace or "default"
    return BindingTarget(str(metadata.get("uid") or ""), str(namespace), name, target["name"])


class BindGuard:
    """Checks binds (and pods created with ``spec.nodeName``) and records their reservations."""

    def __init__(
        self, config: Config, local: LocalTable | None, leases: LeaseStore | None = None, clock=time.time
    ) -> None:
        self.config = config
        self.local = local
        self.leases = leases
        self.clock = clock

    def review(self, req: AdmissionRequest, source: StateSource, *, verified: bool = False) -> Outcome:
        """A Binding: the pod and node are read under the state's lock; the reservation's
        round trips happen outside it (the informer must keep applying events)."""
        deadline = time.monotonic() + self.config.node_admission.reservations.deadline_seconds
        target = binding_target(req)
        pod_name = f"pod {target.namespace}/{target.name}"
        outcome = Outcome(req, {"uid": req.uid, "allowed": True})
        mode = self.config.node_admission.mode
        if mode == "off" or self._exempt(target.namespace, req):
            return outcome
        with source.reading() as view:
            state = view.state
            if state is None or view.unavailable is not None:
                why = view.unavailable or "no state"
                return _unchecked(outcome, STATE_UNAVAILABLE, f"{pod_name} to {target.node}: {why}")
            record = state.find_pod(target.uid, target.namespace, target.name)
            node = state.nodes.get(target.node)
        if record is None or record.pending is None:
            return _unchecked(outcome, POD_UNKNOWN, f"{pod_name} is not a pending pod in the guard's state")
        if node is None:
            if self.config.node_admission.unknown_node == "deny":
                return _deny(
                    outcome,
                    "UnknownNode",
                    f"node {target.node} does not exist: {pod_name}, bound by "
                    f"{req.user or 'an unknown binder'}, would never run. "
                    "The scheduler will retry elsewhere.",
                )
            return _unchecked(outcome, NODE_UNKNOWN, f"node {target.node} is not in the guard's state")
        self._binders(outcome, record, req.user, pod_name)
        pod = PodUnderReview(record.pending.metadata, record.pending.spec, record)
        return self._reserve_or_deny(outcome, source, pod, node, req, pod_name, mode, deadline, created=False)

    def review_created(
        self,
        req: AdmissionRequest,
        source: StateSource,
        outcome: Outcome,
        judged: Judged | None = None,
        *,
        verified: bool = False,
    ) -> Outcome:
        """A pod CREATE with ``spec.nodeName`` the engine allowed: re-check it against the
        reservations of in-flight binds and reserve its capacity the same way.

        ``judged``: the state and its revision the engine's verdict was reached at. While the
        node holds no reservation and the state is still at that revision, the re-check could
        only repeat that verdict, so it is not run again.
        """
        spec = (req.obj or {}).get("spec")
        node_name = spec.get("nodeName") if isinstance(spec, Mapping) else None
        if not node_name or not outcome.allowed or req.dry_run or req.kind != "Pod":
            return outcome
        if req.operation != "CREATE":
            return outcome  # an update of a placed pod: the kubelet admits a pod once
        pod = outcome.decision.pod if outcome.decision is not None else None
        if pod is None or is_mirror(pod.metadata):
            return outcome  # unreadable fields (the engine answered for them), or a mirror pod
        mode = self.config.node_admission.mode
        if mode == "off" or self._exempt(req.namespace, req):
            return outcome
        with source.reading() as view:
            node = view.state.nodes.get(node_name) if view.state is not None else None
        if node is None:
            return outcome
        deadline = time.monotonic() + self.config.node_admission.reservations.deadline_seconds
        name = f"pod {req.namespace}/{req.name}"
        return self._reserve_or_deny(
            outcome, source, pod, node, req, name, mode, deadline, created=True, judged=judged
        )

    # -- the decision, inside the stores' read-check-write ------------------------------

    def _reserve_or_deny(
        self,
        outcome: Outcome,
        source: StateSource,
        pod: PodUnderReview,
        node: Node,
        req: AdmissionRequest,
        pod_name: str,
        mode: str,
        deadline: float,
        *,
        created: bool,
        judged: Judged | None = None,
    ) -> Outcome:
        settings = self.config.node_admission.reservations
        now = self.clock()
        unsafe = self.config.node_admission.unsafe_sysctls_for(node.labels)
        new = Reservation.of(pod.record, node.name, settings.ttl_seconds, now)
        failures: list[Failure] = []
        dropped: set[str] = set()  # entries of pods that ended or expired: not written back

        def decide(stored: list[Reservation]) -> bool:
            # The node's usage and which reservations still count are read at one moment, under
            # the state's lock: a watch event between the two would count a pod in neither.
            entries = {r.pod: r for r in stored if r.pod != new.pod}.values()  # the table mirrors Leases
            with source.reading() as view:
                if view.state is None:
                    raise _StateGone(view.unavailable or "no state")
                dropped.update(r.pod for r in entries if not kept(r, view.state, now))
                held = [r for r in entries if counts(r, view.state, now)]
                if not held and judged is not None and judged == (view.state, view.state.revision):
                    return True  # the engine's verdict, on the same state
                usage = usage_with(view.state.usage(node.name), held)
                failures[:] = kubelet_admission(pod, node, usage, unsafe)
            return not failures or mode in ("warn", "audit")

        def keep(reservation: Reservation) -> bool:
            return reservation.pod not in dropped

        write = not req.dry_run

        leases = self.leases if self._coordinated(pod.record) else None

        def through_lease(local: list[Reservation]) -> bool:
            """The Lease's read-check-write, inside the table's: one decision over both."""
            return leases.reserve(
                new, lambda leased: decide([*local, *leased]), keep, write=write, deadline=deadline
            )

        inner = through_lease if leases is not None else decide
        try:
            if self.local is not None:
                self.local.reserve(new, inner, keep, write=write, deadline=deadline)
            else:
                inner([])
        except _StateGone as err:
            return _unchecked(outcome, STATE_UNAVAILABLE, f"{pod_name} to {node.name}: {err}")
        except DeadlineExceeded as err:
            return _unchecked(outcome, DEADLINE, f"{pod_name} to {node.name}: {err} past the deadline")
        except (ApiError, OSError) as err:
            why = DEADLINE if time.monotonic() >= deadline else API_ERROR
            return _unchecked(outcome, why, f"{pod_name} to {node.name}: {err}")
        if not failures:
            return outcome
        who = (
            f"created with spec.nodeName by {req.user or 'an unknown user'}"
            if created
            else f"bound by {req.user or 'an unknown binder'}"
        )
        then = (
            "Drop spec.nodeName to let the scheduler place it."
            if created
            else "The scheduler will retry it elsewhere."
        )
        first = failures[0]
        message = (
            f"the kubelet on {node.name} would reject {pod_name}, {who}: {first.reason}: "
            f"{first.message.rstrip()} ({first.hint}). Capacity reserved for binds not yet visible counts. "
            f"{then}"
        )
        if mode == "warn":
            outcome.response.setdefault("warnings", []).append(f"[{POLICY}] {first.reason}: {message}")
            return outcome
        if mode == "audit":
            outcome.reasons = [f.reason for f in failures]
            outcome.decision = Decision(
                audited=[Violation(POLICY, f.reason, message, node.name) for f in failures]
            )
            return outcome
        return _deny(outcome, first.reason, message, [f.reason for f in failures], node.name)

    def _exempt(self, namespace: str, req: AdmissionRequest) -> bool:
        """Excluded namespaces and the ``nodeAdmission`` exemptions, as the engine applies them."""
        return namespace in self.config.excluded_namespaces or self.config.exempts(
            POLICY, namespace, req.user, req.groups
        )

    def _coordinated(self, record: PodRecord) -> bool:
        devices = self.config.device_scheduler.resources
        settings = self.config.node_admission.reservations
        return any(amount and settings.coordinated(r, devices) for r, amount in record.requests.items())

    def _binders(self, outcome: Outcome, record: PodRecord, user: str, pod_name: str) -> None:
        """A device pod bound by an identity its resource's binders do not include: a warning
        whatever ``deviceScheduler``'s mode but ``off`` (a permanent bind denial would make that
        scheduler retry forever)."""
        device = self.config.device_scheduler
        if device.mode == "off":
            return
        for resource, amount in record.requests.items():
            allowed = device.allowed_binders(resource) if amount else None
            if allowed is not None and not any(fnmatchcase(user, p) for p in allowed):
                outcome.response.setdefault("warnings", []).append(
                    f"[deviceScheduler] MixedDeviceScheduler: {pod_name} requests {resource} and was bound "
                    f"by {user or 'an unknown binder'}; only {', '.join(allowed)} should bind it."
                )


class _StateGone(Exception):
    """The state became unavailable between reading the pod and deciding."""


def _unchecked(outcome: Outcome, why: str, detail: str) -> Outcome:
    outcome.fail_open = why
    outcome.error = f"binding not checked ({why}): {detail}"
    outcome.response.setdefault("warnings", []).append(
        f"admit-guard did not check this binding and allowed it: {detail}"
    )
    return outcome


def _deny(
    outcome: Outcome, reason: str, message: str, reasons: list[str] | None = None, node: str | None = None
) -> Outcome:
    outcome.response["allowed"] = False
    outcome.response["status"] = {
        "code": 403,
        "reason": reason,
        "message": f"admit-guard: {reason}: {message}",
    }
    outcome.reasons = reasons or [reason]
    outcome.decision = Decision(
        allowed=False, violations=[Violation(POLICY, r, message, node) for r in outcome.reasons]
    )
    return outcome
