"""Policies: each looks at one object and returns findings; the engine applies modes.

A policy is one module of this package, listed once in ``registry.POLICIES``; the engine, the
config reader, the static policies (``vap.py``) and the docs iterate that tuple. A module
exposes what ``Policy`` describes: its name (the config key and the metric label), its
reason codes, the modes it supports, what of the object it needs (``READS``), its settings
(a frozen dataclass and the function that reads them from the config, with errors naming
the field), ``check(review, context) -> findings``, and the CEL form of its rule when the
API server can enforce it alone (``STATIC``, else None).
"""

from __future__ import annotations

from collections.abc import Mapping
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
    from ..reader import Reader
    from ..state import ClusterState

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


def _scheduler(shape: PodShape | None, default: str | None) -> str:
    own = shape.spec.get("schedulerName") if shape is not None else None
    if isinstance(own, str) and own:
        return own
    return default or "default-scheduler"


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing a policy objects to.

    ``fix`` is the JSONPatch that cures it, or None when the policy cannot (or must not) fix
    it; ``advisory`` findings only ever become warnings (e.g. "no cluster state to check").
    """

    reason: str
    message: str
    node: str | None = None
    fix: Patch | None = None
    advisory: bool = False
    # Why a refusal was downgraded to a warning (``checks.failure.FINGERPRINT_MISMATCH``), "" if not.
    doubt: str = ""


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
