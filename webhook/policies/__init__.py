"""Policies: each looks at one object and returns findings; the engine applies modes.

A policy is one module of this package, listed once in ``registry.POLICIES``; the engine, the
config reader, the static policies (``vap.py``) and the docs iterate that tuple. A module
exposes what ``Policy`` describes: its name (the config key and the metric label), its
reason codes, the modes it supports, what of the object it needs (``READS``), its settings
(a frozen dataclass and the function that reads them from the config, with errors naming
the field), ``check(review, context) -> findings``, and the CEL form of its rule when the
API server can enforce it alone (``STATIC``, else None). Optional hooks (see ``Policy``) give
it the other paths: a bind, a DRA allocation, the audit, and ``check`` without cluster state.
Every path returns the one ``Finding`` type; the engine, the guards, the audit and the dry run
turn findings into warnings, violations and audit records, each in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from ..checks import PodUnderReview
from ..kube.dra import ClaimAllocation, ResourceClaim
from ..kube.errors import FieldError
from ..kube.workloads import PodShape
from ..state.model import Node, NodeUsage

if TYPE_CHECKING:
    from ..config import Config
    from ..formats.reader import Reader
    from ..state import ClusterState
    from ..state.inventory import Inventory

Patch = tuple[dict[str, Any], ...]


class Mode(StrEnum):
    """What a policy does with its findings. A ``str``: configs, JSON and messages spell it."""

    ENFORCE = "enforce"  # deny
    WARN = "warn"  # allow, with admission warnings
    AUDIT = "audit"  # allow, record only
    FIX = "fix"  # mutate where the policy can repair the object, else deny
    OFF = "off"

    @property
    def denies(self) -> bool:
        """Whether a finding that cannot be repaired is a denial (a bind, an allocation)."""
        return self in (Mode.ENFORCE, Mode.FIX)


ALL_MODES = tuple(Mode)
NO_FIX = tuple(m for m in ALL_MODES if m != Mode.FIX)  # for policies that cannot repair an object

# What a policy needs of the object under review (``READS``). The engine runs a policy only
# when the review has it; a pod whose fields are unreadable leaves ``POD_FIELDS`` policies
# unchecked, answered per failOpen.
ANY_OBJECT = "object"  # any kind: ``review.shape`` and ``review.pod`` may be None
POD_SHAPE = "shape"  # a Pod or a workload's pod template: ``review.shape`` is set
POD_FIELDS = "pod"  # and its requests, ports and sysctls read: ``review.pod`` is set

# The reason of what a policy says without cluster state (``check_stateless``): a check skipped.
NO_CLUSTER_STATE = "NoClusterState"


# What a policy coordinates between replicas (``COORDINATES``, optional): the one policy per
# path whose mode switches the guard's records on, in whose name the guard's own denials go.
BINDS = "binds"
ALLOCATIONS = "allocations"


@dataclass(frozen=True, slots=True)
class Review:
    """The object under review, with the pod it stands for (requests computed once)."""

    obj: Mapping[str, Any]
    shape: PodShape | None  # None when the object creates no pods (``ANY_OBJECT`` policies)
    pod: PodUnderReview | None  # None when its fields are unreadable (see ``unreadable``)
    operation: str
    old_shape: PodShape | None = None
    unreadable: FieldError | None = None
    old_obj: Mapping[str, Any] | None = None  # the stored object of an UPDATE
    user: str = ""  # who asks (``userInfo.username``)
    # A custom resource's template: where it is (``spec.tasks[0].template``), and the scheduler
    # its pods get when their spec names none (a Volcano Job's ``spec.schedulerName``).
    template: str = ""
    scheduler_default: str | None = None
    old_scheduler_default: str | None = None

    @property
    def namespace(self) -> str:
        return (self.obj.get("metadata") or {}).get("namespace") or "default"

    @property
    def name(self) -> str:
        metadata = self.obj.get("metadata") or {}
        return metadata.get("name") or metadata.get("generateName") or "<unnamed>"

    @property
    def description(self) -> str:
        kind = self.shape.kind if self.shape is not None else self.obj.get("kind")
        where = f" (template {self.template})" if self.template else ""
        return f"{kind} {self.namespace}/{self.name}{where}"

    @property
    def scheduler(self) -> str:
        """The scheduler the pod's pods really get: its own ``schedulerName``, else the one its
        custom resource gives them, else default-scheduler."""
        return _scheduler(self.shape, self.scheduler_default)

    @property
    def old_scheduler(self) -> str:
        """The scheduler the stored object's pods get (an UPDATE)."""
        return _scheduler(self.old_shape, self.old_scheduler_default)


def template_subject(review: Review) -> str:
    """The object and, of a custom resource, which template: ``PyTorchJob ns/job (spec.x)``."""
    where = f" ({review.template})" if review.template else ""
    return f"{review.shape.kind} {review.namespace}/{review.name}{where}"


def _scheduler(shape: PodShape | None, default: str | None) -> str:
    own = shape.spec.get("schedulerName") if shape is not None else None
    if isinstance(own, str) and own:
        return own
    return default or "default-scheduler"


@dataclass(frozen=True, slots=True)
class Subject:
    """The object an audit finding is about, as a PolicyReport names it."""

    namespace: str  # "" for cluster-scoped objects (a Node)
    kind: str
    name: str
    api_version: str = ""
    uid: str = ""


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing a policy objects to, on any path (an object, a bind, an allocation, the audit,
    a check without cluster state).

    ``fix`` is the JSONPatch that cures it, or None when the policy cannot (or must not) fix
    it; ``advisory`` findings only ever become warnings (e.g. "no cluster state to check"),
    and from the audit, what it could not judge (``message`` says which input is missing).
    The audit's findings also say how bad (``severity``: high, medium or low), about what
    (``subject``), which resource or device, and how many pods or claims (``count``).
    """

    reason: str
    message: str
    node: str | None = None
    fix: Patch | None = None
    advisory: bool = False
    severity: str = ""
    subject: Subject | None = None
    resource: str = ""
    count: int = 0
    # Why a refusal was downgraded to a warning (``checks.failure.FINGERPRINT_MISMATCH``), "" if not.
    doubt: str = ""

    # The audit report's names for a finding's fields (its JSON contract says ``type``).
    @property
    def type(self) -> str:
        return self.reason

    @property
    def namespace(self) -> str:
        return self.subject.namespace if self.subject is not None else ""

    @property
    def kind(self) -> str:
        return self.subject.kind if self.subject is not None else ""

    @property
    def name(self) -> str:
        return self.subject.name if self.subject is not None else ""

    @property
    def api_version(self) -> str:
        return self.subject.api_version if self.subject is not None else ""

    @property
    def uid(self) -> str:
        return self.subject.uid if self.subject is not None else ""


@dataclass(frozen=True, slots=True)
class Context:
    """What a policy may read besides the object: the state, the config (its own settings
    are ``config.policy(NAME)``), why the state is unusable (if it is), and the time the
    caller says it is (the engine has no clock)."""

    state: ClusterState | None
    config: Config
    unavailable: str | None = None
    now: float | None = None


@dataclass(frozen=True, slots=True)
class Bind:
    """A pod bound to a node, as a policy's ``check_bind`` judges it: a scheduler's Binding, or
    a pod created with ``spec.nodeName`` (``created``). Read at one moment of the state (its
    lock held): ``usage`` is the node's usage with the binds in flight to it counted, and
    ``in_flight`` their (scheduler, requests)."""

    pod: PodUnderReview
    node: Node
    state: ClusterState
    usage: NodeUsage
    in_flight: tuple[tuple[str, Mapping[str, int]], ...]
    pod_name: str  # "pod NAMESPACE/NAME", as messages name it
    who: str  # the binder, or the pod's creator
    created: bool = False


@dataclass(frozen=True, slots=True)
class Allocation:
    """A DRA allocation written to a ResourceClaim's status, as a policy's ``check_allocation``
    judges it: the claim (read once), who wrote it, and the allocations allowed and not yet in
    the state's device index (``in_flight``), which count as if they were."""

    claim: ResourceClaim
    writer: str
    state: ClusterState
    in_flight: tuple[ClaimAllocation, ...] = ()


@dataclass(frozen=True, slots=True)
class AuditScope:
    """What a policy's ``audit`` judges: an inventory (its ``state``, and for the command's
    audit the workloads and Failed pods), and of its nodes those in ``nodes``: the server's
    periodic audit takes a chunk at a time under the state's lock (None: every node)."""

    inventory: Inventory
    nodes: Sequence[str] | None = None

    def node_names(self) -> Sequence[str]:
        return self.inventory.state.nodes if self.nodes is None else self.nodes


def audit_reads(policy: Any) -> dict[str, str]:
    """Each of a policy's audit types and the inventory input it is judged from: its
    ``AUDIT_READS``, one input for every type, or a mapping from type to input where its types
    read different inputs (``nodeAdmission``: the pods per node, and the Failed pods)."""
    reads = policy.AUDIT_READS
    if isinstance(reads, Mapping):
        return {finding_type: reads[finding_type] for finding_type in policy.AUDITS}
    return {finding_type: reads for finding_type in policy.AUDITS}


@dataclass(frozen=True, slots=True)
class AuditPass:
    """A policy's audit of the live state, a chunk at a time: the server's periodic audit holds
    the state's lock for one chunk, never for the whole cluster. ``keys`` lists what there is to
    judge (None: the state lacks the policy's input, its types are not published), ``step``
    judges a chunk of them, ``findings`` says what the steps found. ``separable``: each key's
    findings are its own, none gathered across chunks, so its keys may be judged in separate
    processes (the replica's audit does, to bound what each copies)."""

    keys: Callable[[ClusterState], Sequence[str] | None]
    step: Callable[[ClusterState, Sequence[str]], None]
    findings: Callable[[ClusterState], list[Finding]]
    chunk: int
    separable: bool = False


@dataclass(frozen=True, slots=True)
class StaticPolicy:
    """A policy's rule as a ValidatingAdmissionPolicy (CEL), for rules that need no node
    state: the API server enforces it even while the guard is down (``vap.py`` renders it)."""

    resource_rules: list[dict[str, Any]]
    variables: list[dict[str, str]]
    validations: list[dict[str, str]]


class Policy(Protocol):
    """What a policy module exposes (a module satisfies this protocol)."""

    NAME: str
    REASONS: tuple[str, ...]
    MODES: tuple[str, ...]
    READS: str
    STATIC: StaticPolicy | None
    Settings: type

    def read_settings(self, reader: Reader, data: Mapping[str, Any], where: str) -> Any: ...

    def check(self, review: Review, context: Context) -> list[Finding]: ...

    # Optional hooks, one per path a request or command can take; a policy implements those it
    # acts on, and the guards iterate ``registry`` instead of naming policies:
    #
    #   check_bind(bind: Bind, context: Context) -> list[Finding]
    #       a pod bound to a node (``pods/binding``, or created with spec.nodeName), judged
    #       inside the bind guard's coordinated decision, the binds in flight counted.
    #   check_allocation(allocation: Allocation, context: Context) -> list[Finding]
    #       a ``resourceclaims/status`` write that sets an allocation, judged inside the
    #       allocation guard's coordinated decision, the allocations in flight counted.
    #   audit(scope: AuditScope, context: Context) -> list[Finding]
    #       what in the cluster already breaks the rule (``admit-guard audit``, the server's
    #       periodic audit): findings with a severity, a subject and a count, of the types in
    #       ``AUDITS`` (a tuple, in report order), read from the inventory's ``AUDIT_READS``
    #       (``state.inventory.WORKLOADS``, ``FAILED_PODS``, ``PODS``: per node, or ``CLAIMS``;
    #       or a mapping from each type to its input, ``audit_reads``); where that input was
    #       not read, the audit says the types were not judged. The server's periodic audit
    #       passes a chunk of nodes (``AuditScope.nodes``) and publishes only the ``PODS`` types. With it,
    #       ``audit_terms(config) -> dict``: settings the report states in its summary
    #       (``stormThreshold``).
    #   explain(pod: PodUnderReview, scheduler: str, context: Context) -> Callable[[Node], tuple]
    #       ``admit-guard explain``: for each node the scheduler could pick, why the guard would
    #       still refuse a bind there ("REASON: why" lines), beyond the kubelet's checks; with
    #       ``EXPLAIN_WORDS``: each reason's short word in the summary.
    #   audit_pass(config: Config) -> AuditPass
    #       the server's periodic audit of what the live state holds beyond its nodes (claims,
    #       open breakers), a chunk at a time; the policies that audit per node (``PODS``) need
    #       none: the audit takes their nodes in chunks itself.
    #   check_stateless(review: Review, context: Context) -> list[Finding]
    #       ``check`` without cluster state (``admit-guard check`` with no ``--cluster``): what
    #       the policy can still say of one template, as advisory ``NO_CLUSTER_STATE`` findings
    #       naming the check that was skipped.


def read_mode(reader: Reader, data: Mapping[str, Any], where: str, allowed: tuple[str, ...]) -> Mode:
    """``mode``, ``enforce`` when absent. YAML 1.1 reads a bare ``off`` as false."""
    mode = data.get("mode", "enforce")
    if mode is False:
        return Mode.OFF
    if mode is True:
        reader.fail(
            f"{where}.mode",
            f"true is not a mode: YAML reads a bare on/yes/true as true; write one of {', '.join(allowed)}",
        )
        return Mode.ENFORCE
    if mode not in allowed:
        reader.fail(f"{where}.mode", f"{mode!r} is not one of {', '.join(allowed)}")
        return Mode.ENFORCE
    return Mode(mode)
