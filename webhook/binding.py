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
from .coordination.budget import Budget, Busy, DeadlineExceeded
from .coordination.lease import LeaseFull, LeaseStore
from .coordination.reservations import Reservation, counts, kept, usage_with
from .coordination.table import LocalTable
from .coordination.transaction import (
    API_ERROR,
    BUSY,
    DEADLINE,
    NODE_UNKNOWN,
    POD_UNKNOWN,
    STATE_UNAVAILABLE,
    TABLE_ERROR,
    WAITED,
    Records,
    TableFailed,
    Transaction,
)
from .engine import Decision, Violation
from .policies import Mode, device_allocation
from .policies.device_scheduler import REASON as MIXED
from .policies.device_scheduler import bind_message, node_conflicts
from .state.apiserver import ApiError
from .state.model import ClusterState, Node, PodRecord, is_mirror
from .state.source import StateSource

POLICY = "nodeAdmission"
DEVICE_POLICY = "deviceScheduler"  # a bind that brings a second scheduler's device pod to a node
# A reservation is stored under its node.
RESERVATION_RECORDS = Records("reservation", identity=lambda r: r.pod, keys=lambda r: (r.node,))


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
    namespace = req.namespace or metadata.get("namespace") or "default"  # the request's decides
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

    def review(
        self,
        req: AdmissionRequest,
        source: StateSource,
        *,
        verified: bool = False,
        target: BindingTarget | None = None,
    ) -> Outcome:
        """A Binding: the pod and node are read under the state's lock; the reservation's
        round trips happen outside it (the informer must keep applying events).

        ``verified``: the caller proved it is the API server (a client certificate); otherwise
        the reservation lasts only until its confirmation time unless the state shows the pod.
        ``target``: the Binding's pod and node, when the caller has read them already."""
        target = target or binding_target(req)
        pod_name = f"pod {target.namespace}/{target.name}"
        outcome = Outcome(req, {"uid": req.uid, "allowed": True})
        mode = self.config.active(POLICY, target.namespace, req.user, req.groups)
        checks_node = mode != Mode.OFF
        device_mode = self.config.active(DEVICE_POLICY, target.namespace, req.user, req.groups)
        if not checks_node and device_mode == Mode.OFF:
            return outcome
        mixing: str | None = None
        with source.reading() as view:
            state = view.state
            if state is None or view.unavailable is not None:
                why = view.unavailable or "no state"
                return _unchecked(outcome, STATE_UNAVAILABLE, f"{pod_name} to {target.node}: {why}")
            record = state.find_pod(target.uid, target.namespace, target.name)
            node = state.nodes.get(target.node)
            elsewhere = _claims_elsewhere(state, record, pod_name, target.node)
            if (
                device_mode != Mode.OFF
                and record is not None
                and record.pending is not None
                and node is not None
            ):
                mixing = _mixing(record, node, state, self.config, pod_name)
        if record is None or record.pending is None:
            return _unchecked(outcome, POD_UNKNOWN, f"{pod_name} is not a pending pod in the guard's state")
        allocation_mode = self.config.active(device_allocation.NAME, target.namespace, req.user, req.groups)
        if elsewhere is not None and allocation_mode == Mode.ENFORCE:
            return _deny(
                outcome, elsewhere.reason, elsewhere.message, node=target.node, policy=device_allocation.NAME
            )
        if node is None:
            if not checks_node:
                return outcome
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
        if mixing is not None:
            if device_mode.denies:  # a bind cannot be repaired, only refused
                return _deny(outcome, MIXED, mixing, node=node.name, policy=DEVICE_POLICY)
            if device_mode == Mode.WARN:
                outcome.response.setdefault("warnings", []).append(f"[{DEVICE_POLICY}] {MIXED}: {mixing}")
        if checks_node:
            pod = PodUnderReview(record.pending.metadata, record.pending.spec, record)
            outcome = self._reserve_or_deny(
                outcome,
                source,
                pod,
                node,
                req,
                pod_name,
                mode,
                verified,
                created=False,
                rivals_mode=device_mode if mixing is None else Mode.OFF,  # already said
            )
        if mixing is not None and device_mode == Mode.AUDIT:
            outcome.decision = outcome.decision or Decision()
            outcome.decision.audited.append(Violation(DEVICE_POLICY, MIXED, mixing, node.name))
            outcome.reasons = [*(outcome.reasons or []), MIXED]
        return outcome

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
        mode = self.config.active(POLICY, req.namespace, req.user, req.groups)
        if mode == Mode.OFF:
            return outcome
        with source.reading() as view:
            node = view.state.nodes.get(node_name) if view.state is not None else None
        if node is None:
            return outcome
        name = f"pod {req.namespace}/{req.name}"
        return self._reserve_or_deny(
            outcome, source, pod, node, req, name, mode, verified, created=True, judged=judged
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
        mode: Mode,
        verified: bool,
        *,
        created: bool,
        judged: Judged | None = None,
        rivals_mode: Mode = Mode.OFF,
    ) -> Outcome:
        """``rivals_mode``: deviceScheduler's mode for binds in flight of other schedulers' device
        pods to the node (two binds to a node with no device pod yet, in the same instant)."""
        settings = self.config.node_admission.reservations
        budget = Budget.of(settings)
        now = self.clock()
        unsafe = self.config.node_admission.unsafe_sysctls_for(node.labels)
        confirm = None if verified else settings.confirm_seconds
        new = Reservation.of(pod.record, node.name, settings.ttl_seconds, now, confirm)
        failures: list[Failure] = []
        rivals: list[str] = []  # why binds in flight make this one mix device schedulers
        dropped: set[str] = set()  # entries of pods that ended or expired: not written back

        def decide(stored: list[Reservation]) -> bool:
            # The node's usage and which reservations still count are read at one moment, under
            # the state's lock: a watch event between the two would count a pod in neither.
            entries = [r for r in stored if r.pod != new.pod]
            with source.reading() as view:
                if view.state is None:
                    raise _StateGone(view.unavailable or "no state")
                dropped.update(r.pod for r in entries if not kept(r, view.state, now))
                held = [r for r in entries if counts(r, view.state, now)]
                rivals[:] = self._rivals(pod.record, node, view.state, held, pod_name, rivals_mode)
                if rivals and rivals_mode.denies:
                    return False
                if not held and judged is not None and judged == (view.state, view.state.revision):
                    return True  # the engine's verdict, on the same state
                usage = usage_with(view.state.usage(node.name), held)
                failures[:] = kubelet_admission(pod, node, usage, unsafe)
            return not failures or mode in (Mode.WARN, Mode.AUDIT)

        transaction = Transaction(
            RESERVATION_RECORDS, self.local, self.leases, budget, lambda: Budget.of(settings)
        )
        try:
            transaction.run(
                [node.name],
                new,
                decide,
                lambda r: r.pod not in dropped,
                coordinated=self._coordinated(pod.record),
                write=not req.dry_run,
            )
        except _StateGone as err:
            return _unchecked(outcome, STATE_UNAVAILABLE, f"{pod_name} to {node.name}: {err}")
        except (Busy, LeaseFull) as err:
            return self._busy(outcome, mode, pod_name, node.name, created, str(err), settings.wait_seconds)
        except DeadlineExceeded as err:
            return _unchecked(outcome, DEADLINE, f"{pod_name} to {node.name}: {err}")
        except ApiError as err:
            return _unchecked(outcome, API_ERROR, f"{pod_name} to {node.name}: {err}")
        except TableFailed as err:
            return _unchecked(outcome, TABLE_ERROR, f"{pod_name} to {node.name}: {err}")
        finally:
            outcome.table_trouble = transaction.trouble
        if rivals:
            if rivals_mode.denies:  # a bind cannot be repaired, only refused
                return _deny(outcome, MIXED, rivals[0], node=node.name, policy=DEVICE_POLICY)
            if rivals_mode == Mode.WARN:
                outcome.response.setdefault("warnings", []).append(f"[{DEVICE_POLICY}] {MIXED}: {rivals[0]}")
            else:
                outcome.decision = outcome.decision or Decision()
                outcome.decision.audited.append(Violation(DEVICE_POLICY, MIXED, rivals[0], node.name))
                outcome.reasons = [*(outcome.reasons or []), MIXED]
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
        if mode == Mode.WARN:
            outcome.response.setdefault("warnings", []).append(f"[{POLICY}] {first.reason}: {message}")
            return outcome
        if mode == Mode.AUDIT:
            outcome.reasons = [f.reason for f in failures]
            outcome.decision = Decision(
                audited=[Violation(POLICY, f.reason, message, node.name) for f in failures]
            )
            return outcome
        return _deny(outcome, first.reason, message, [f.reason for f in failures], node.name)

    def _busy(
        self, outcome: Outcome, mode: Mode, pod_name: str, node: str, created: bool, why: str, wait: float
    ) -> Outcome:
        """Other decisions on the node outlasted the wait: never allowed unchecked, since they
        may have taken the capacity this one asks for. Denied so the scheduler (or the
        controller) tries again; in warn and audit modes only said."""
        message = (
            f"{pod_name} to {node} was not decided: other binds to {node} were still being decided "
            f"after {wait:g} s ({why}). "
            + ("Its controller will create it again." if created else "The scheduler will retry it.")
        )
        if mode in (Mode.WARN, Mode.AUDIT):
            return _unchecked(outcome, WAITED, message)
        return _deny(outcome, BUSY, message, node=node, code=429)

    def _rivals(
        self,
        record: PodRecord,
        node: Node,
        state: ClusterState,
        held: list[Reservation],
        pod_name: str,
        mode: Mode,
    ) -> list[str]:
        """Why the binds in flight to ``node`` (``held``) make this bind mix device schedulers."""
        if mode == Mode.OFF or not held:
            return []
        in_flight = [(r.scheduler, r.requests) for r in held]
        device = self.config.device_scheduler
        conflicts = node_conflicts(record.requests, record.scheduler, node, state, device, in_flight)
        return [bind_message(pod_name, record.scheduler, node.name, conflicts, state)] if conflicts else []

    def _coordinated(self, record: PodRecord) -> bool:
        devices = self.config.device_scheduler.resources
        settings = self.config.node_admission.reservations
        return any(amount and settings.coordinated(r, devices) for r, amount in record.requests.items())

    def _binders(self, outcome: Outcome, record: PodRecord, user: str, pod_name: str) -> None:
        """A device pod bound by an identity its resource's binders do not include: a warning
        whatever ``deviceScheduler``'s mode but ``off`` (a permanent bind denial would make that
        scheduler retry forever)."""
        device = self.config.device_scheduler
        if device.mode == Mode.OFF:
            return
        for resource, amount in record.requests.items():
            allowed = device.allowed_binders(resource) if amount else None
            if allowed is not None and not any(fnmatchcase(user, p) for p in allowed):
                outcome.response.setdefault("warnings", []).append(
                    f"[deviceScheduler] MixedDeviceScheduler: {pod_name} requests {resource} and was bound "
                    f"by {user or 'an unknown binder'}; only {', '.join(allowed)} should bind it."
                )


def _claims_elsewhere(
    state: ClusterState, record: PodRecord | None, pod_name: str, node: str
) -> device_allocation.Finding | None:
    """A pending pod's DRA claim allocated for devices ``node`` cannot use: the claims reserved
    for it, and those its spec names (``FailedPrepareDynamicResources`` on that node)."""
    if state.devices is None or record is None or record.pending is None:
        return None
    allocations = {a.key: a for a in state.devices.reserved_for(record.key)}
    entries = record.pending.spec.get("resourceClaims")
    for entry in entries if isinstance(entries, list) else ():
        name = entry.get("resourceClaimName") if isinstance(entry, Mapping) else None
        known = state.devices.named(record.pending.namespace, name) if isinstance(name, str) else None
        if known is not None and known[1] is not None:
            allocations[known[0]] = known[1]
    then = "The scheduler will retry it elsewhere."
    for allocation in allocations.values():
        finding = device_allocation.claim_elsewhere(pod_name, allocation, node, state, then)
        if finding is not None:
            return finding
    return None


class _StateGone(Exception):
    """The state became unavailable between reading the pod and deciding."""


def _mixing(record: PodRecord, node: Node, state: ClusterState, config: Config, pod_name: str) -> str | None:
    """Why binding this pod to ``node`` mixes device schedulers there (read under the state's
    lock: the node's device pods as they are at the moment of the race), or None."""
    device = config.device_scheduler
    conflicts = node_conflicts(record.requests, record.scheduler, node, state, device)
    if not conflicts:
        return None
    return bind_message(pod_name, record.scheduler, node.name, conflicts, state)


def _unchecked(outcome: Outcome, why: str, detail: str) -> Outcome:
    outcome.fail_open = why
    outcome.error = f"binding not checked ({why}): {detail}"
    outcome.response.setdefault("warnings", []).append(
        f"admit-guard did not check this binding and allowed it: {detail}"
    )
    return outcome


def _deny(
    outcome: Outcome,
    reason: str,
    message: str,
    reasons: list[str] | None = None,
    node: str | None = None,
    code: int = 403,
    policy: str = POLICY,
) -> Outcome:
    outcome.response["allowed"] = False
    outcome.response["status"] = {
        "code": code,
        "reason": reason,
        "message": f"admit-guard: {reason}: {message}",
    }
    outcome.reasons = reasons or [reason]
    outcome.decision = Decision(
        allowed=False, violations=[Violation(policy, r, message, node) for r in outcome.reasons]
    )
    return outcome
