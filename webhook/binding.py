"""The bind-time guard: ``pods/binding`` reviews, and the reservations that keep two binds from
being handed the same capacity.

A scheduler's Binding reaches the kubelet unchecked: two schedulers that each see a node's
last GPU free both bind, and the kubelet fails one pod with ``UnexpectedAdmissionError``. Here
the pod (found in the live state, pending) is checked with the kubelet's rules on the target
node, against the node's usage plus the capacity already reserved for binds allowed but not
yet visible in the watch. A denied bind is clean: kube-scheduler unreserves the pod and retries
it elsewhere. Wherever the guard does not know (pod or node not in the state, state not ready,
API errors, the deadline), it allows with a warning and counts why.

What is judged is the policies': every policy with a ``check_bind`` hook (the registry's
``BIND_POLICIES``) is asked inside one coordinated decision (``coordination/``), with the binds
in flight to the node counted; their findings become the verdict by each policy's mode, as the
engine's do. It names no policy: the one that declares ``COORDINATES = BINDS`` (the registry's
``BIND_COORDINATOR``) switches reservations on, and the guard's own denials go in its name.
I/O lives here (the reservation stores); the checks are the policies' pure ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

from .admission import AdmissionRequest, Outcome, ReviewError, allowed_unchecked, deny, respond
from .checks import PodUnderReview
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
from .engine import Decision, apply_finding
from .kube.errors import MAPPING
from .kube.numa import REFUSING_POLICIES
from .policies import Bind, Context, Finding, Mode
from .policies.registry import BIND_COORDINATOR, BIND_POLICIES
from .state.apiserver import ApiError
from .state.model import ClusterState, Node, PodRecord, is_mirror
from .state.source import StateSource
from .state.topology import is_memory

POLICY = BIND_COORDINATOR.NAME
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
    if not isinstance(metadata, MAPPING):
        raise ReviewError("request.object.metadata: missing or not an object (a Binding)")
    if not isinstance(target, MAPPING) or not isinstance(target.get("name"), str) or not target["name"]:
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
        modes = self._modes(target.namespace, req)
        if not modes:
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
            if POLICY not in modes:
                return outcome
            if self.config.policy(POLICY).unknown_node == "deny":
                return deny(
                    outcome,
                    POLICY,
                    "UnknownNode",
                    f"node {target.node} does not exist: {pod_name}, bound by "
                    f"{req.user or 'an unknown binder'}, would never run. "
                    "The scheduler will retry elsewhere.",
                )
            return _unchecked(outcome, NODE_UNKNOWN, f"node {target.node} is not in the guard's state")
        pod = PodUnderReview(record.pending.metadata, record.pending.spec, record)
        return self._judge(outcome, source, pod, node, req, pod_name, modes, verified, created=False)

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
        node_name = spec.get("nodeName") if isinstance(spec, MAPPING) else None
        if not node_name or not outcome.allowed or req.dry_run or req.kind != "Pod":
            return outcome
        if req.operation != "CREATE":
            return outcome  # an update of a placed pod: the kubelet admits a pod once
        pod = outcome.decision.pod if outcome.decision is not None else None
        if pod is None or is_mirror(pod.metadata):
            return outcome  # unreadable fields (the engine answered for them), or a mirror pod
        modes = self._modes(req.namespace, req)
        if POLICY not in modes:
            return outcome
        with source.reading() as view:
            node = view.state.nodes.get(node_name) if view.state is not None else None
        if node is None:
            return outcome
        name = f"pod {req.namespace}/{req.name}"
        return self._judge(
            outcome, source, pod, node, req, name, modes, verified, created=True, judged=judged
        )

    def _modes(self, namespace: str, req: AdmissionRequest) -> dict[str, Mode]:
        """The bind hooks' policies active for this request, with their modes."""
        modes = {p.NAME: self.config.active(p.NAME, namespace, req.user, req.groups) for p in BIND_POLICIES}
        return {name: mode for name, mode in modes.items() if mode != Mode.OFF}

    # -- the decision, inside the stores' read-check-write ------------------------------

    def _judge(
        self,
        outcome: Outcome,
        source: StateSource,
        pod: PodUnderReview,
        node: Node,
        req: AdmissionRequest,
        pod_name: str,
        modes: dict[str, Mode],
        verified: bool,
        *,
        created: bool,
        judged: Judged | None = None,
    ) -> Outcome:
        """Every bind hook over the pod on ``node`` with the binds in flight there counted,
        inside one coordinated decision; the reservation is written when nothing denies and
        the coordinating policy (the node's capacity) is active."""
        settings = self.config.reservations
        now = self.clock()
        confirm = None if verified else settings.confirm_seconds
        new = Reservation.of(pod.record, node.name, settings.ttl_seconds, now, confirm)
        found: dict[str, list[Finding]] = {}
        dropped: set[str] = set()  # entries of pods that ended or expired: not written back
        who = req.user

        def decide(stored: list[Reservation]) -> bool:
            # The node's usage and which reservations still count are read at one moment, under
            # the state's lock: a watch event between the two would count a pod in neither.
            entries = [r for r in stored if r.pod != new.pod]
            with source.reading() as view:
                state = view.state
                if state is None:
                    raise _StateGone(view.unavailable or "no state")
                dropped.update(r.pod for r in entries if not kept(r, state, now))
                held = [r for r in entries if counts(r, state, now)]
                found.clear()
                if not held and judged is not None and state is judged[0] and state.revision == judged[1]:
                    return True  # the engine's verdict, on the same state
                usage = usage_with(state.usage(node.name), held, state)
                in_flight = tuple((r.scheduler, r.requests) for r in held)
                bind = Bind(pod, node, state, usage, in_flight, pod_name, who, created)
                context = Context(state, self.config)
                for policy in BIND_POLICIES:
                    if policy.NAME in modes:
                        findings = policy.check_bind(bind, context)
                        if findings:
                            found[policy.NAME] = findings
            return not any(
                modes[name].denies and not f.advisory for name, findings in found.items() for f in findings
            )

        capacity = modes.get(POLICY)
        transaction = Transaction(
            RESERVATION_RECORDS, self.local, self.leases, Budget.of(settings), lambda: Budget.of(settings)
        )
        try:
            transaction.run(
                [node.name],
                new,
                decide,
                lambda r: r.pod not in dropped,
                coordinated=capacity is not None and self._coordinated(pod.record, node),
                write=capacity is not None and not req.dry_run,
                stands=None if judged is None else partial(_stands, source, judged),
            )
        except _StateGone as err:
            return _unchecked(outcome, STATE_UNAVAILABLE, f"{pod_name} to {node.name}: {err}")
        except (Busy, LeaseFull) as err:
            return self._busy(
                outcome, capacity, pod_name, node.name, created, str(err), settings.wait_seconds
            )
        except DeadlineExceeded as err:
            return _unchecked(outcome, DEADLINE, f"{pod_name} to {node.name}: {err}")
        except ApiError as err:
            return _unchecked(outcome, API_ERROR, f"{pod_name} to {node.name}: {err}")
        except TableFailed as err:
            return _unchecked(outcome, TABLE_ERROR, f"{pod_name} to {node.name}: {err}")
        finally:
            outcome.table_trouble = transaction.trouble
        if not found:
            return outcome
        decision = Decision()
        for name, findings in found.items():
            for finding in findings:
                apply_finding(decision, name, modes[name], finding)
        previous = outcome.decision  # the engine's, for a pod created with spec.nodeName
        if previous is not None:
            decision.audited[:0] = previous.audited
            decision.pod = previous.pod
        return respond(outcome, decision)

    def _busy(
        self,
        outcome: Outcome,
        mode: Mode | None,
        pod_name: str,
        node: str,
        created: bool,
        why: str,
        wait: float,
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
        return deny(outcome, POLICY, BUSY, message, node=node, code=429)

    def _coordinated(self, record: PodRecord, node: Node) -> bool:
        """Whether the bind is coordinated across replicas (through the node's Lease): it asks
        for a resource the config coordinates, or for NUMA-aligned resources on a node whose
        topology manager can refuse (two replicas must not hand one zone's CPUs to two pods)."""
        devices = self.config.device_resources
        settings = self.config.reservations
        if any(amount and settings.coordinated(r, devices) for r, amount in record.requests.items()):
            return True
        topology = self.config.topology.for_node(node) if record.numa else None
        if topology is None or topology.policy not in REFUSING_POLICIES:
            return False
        memory_manager = any(is_memory(r) for r in topology.resources)
        return any(not unit.on(topology.resources, memory_manager).empty for unit in record.numa)


def _stands(source: StateSource, judged: Judged) -> bool:
    """Whether the engine's verdict stands: the state is the one, at the revision, it was
    reached on (compared by identity: a state's equality would compare the cluster)."""
    with source.reading() as view:
        state = view.state
        return state is not None and state is judged[0] and state.revision == judged[1]


class _StateGone(Exception):
    """The state became unavailable between reading the pod and deciding."""


def _unchecked(outcome: Outcome, why: str, detail: str) -> Outcome:
    return allowed_unchecked(outcome, why, "binding", detail)
