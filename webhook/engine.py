"""``evaluate``: every policy over one object, modes applied, one ``Decision`` out.

Pure: no I/O, no clock, no globals. The CLI, the admission server and the policy test suite
all call this function, so a verdict in CI is the verdict in the cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonpatch

from .checks import PodUnderReview
from .config import Config
from .kube.errors import FieldError, mapping_at
from .kube.workloads import TemplateShape, display_path
from .policies import ANY_OBJECT, POD_FIELDS, Context, Finding, Mode, Review
from .policies.registry import POLICIES
from .state import ClusterState

OPERATIONS = ("CREATE", "UPDATE")


@dataclass(frozen=True, slots=True)
class Violation:
    policy: str
    reason: str
    message: str
    node: str | None = None


@dataclass(slots=True)
class Decision:
    """``violations`` deny; ``audited`` are recorded only; ``fixed`` are what ``patch`` repairs."""

    allowed: bool = True
    violations: list[Violation] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    patch: list[dict[str, Any]] | None = None
    audited: list[Violation] = field(default_factory=list)
    fixed: list[Violation] = field(default_factory=list)
    # The pod's fields could not be read: the policies that needed them did not run (named
    # in ``unchecked``); the others did. The caller answers those per failOpen.
    unreadable: FieldError | None = None
    unchecked: list[str] = field(default_factory=list)
    # The pod the policies judged (its requests computed once), for callers that check it again.
    pod: PodUnderReview | None = None
    # Why refusals were said as warnings only (``Finding.doubt``), one entry each: for the metric.
    doubts: list[str] = field(default_factory=list)

    @property
    def fix_notes(self) -> list[str]:
        return [f"[{v.policy}] fixed {v.reason}: {v.message}" for v in self.fixed]

    @property
    def notices(self) -> list[str]:
        """Everything a person should read: warnings, then what the patch fixes."""
        return [*self.warnings, *self.fix_notes]


def evaluate(
    obj: Mapping[str, Any],
    operation: str,
    state: ClusterState | None,
    config: Config,
    *,
    old_object: Mapping[str, Any] | None = None,
    user: str = "",
    groups: tuple[str, ...] = (),
    state_unavailable: str | None = None,
    now: float | None = None,
    unreadable: FieldError | None = None,
) -> Decision:
    """Decide on one object. Raises ``FieldError`` (with the full field path) when the object
    has no readable pod at all; a pod whose fields are unreadable (a malformed quantity) is
    still judged by the policies that do not need them (``Decision.unreadable``).

    ``state`` None means "no cluster state": checks that need node state become warnings.
    ``state_unavailable`` says why live state should have been there but is not usable (not
    yet synced, too old): node checks then answer per ``config.fail_open``. ``now`` (wall-clock
    seconds) is when the storm breakers are asked; without it they are not consulted.
    ``unreadable``: a part of the object the caller could not read (nested past the JSON
    parser's limit); the pod's fields then count as unreadable, as for a malformed one.
    Kinds that create no pods, and operations other than CREATE/UPDATE, pass untouched.
    """
    decision = Decision()
    if operation not in OPERATIONS:
        return decision
    templates = config.workloads.shapes(obj)
    if templates is None and not _ANY_OBJECT_POLICIES:
        return decision
    namespace = mapping_at(obj, "metadata", "metadata").get("namespace") or "default"
    if namespace in config.excluded_namespaces:
        return decision
    old_object = old_object if operation == "UPDATE" else None
    old_templates = _by_path(config.workloads.shapes(old_object) if old_object else None)
    run = _Run(obj, operation, old_object, user, config, namespace, groups, unreadable)
    context = Context(state, config, state_unavailable, now)
    if templates is None:
        run.judge(decision, _ANY_OBJECT_POLICIES, None, None, context)
    for template in templates or ():
        old = old_templates.get(template.shape.path)
        run.judge(decision, _POLICIES, template, old, context)
    decision.allowed = not decision.violations
    decision.patch = run.patch or None
    if not decision.unchecked:
        decision.unreadable = None
    return decision


@dataclass(slots=True)
class _Run:
    """One object through the policies, a template at a time; ``obj`` is the object as it will
    be stored (each fix applied), so later policies and templates judge the repaired object."""

    obj: Mapping[str, Any]
    operation: str
    old_object: Mapping[str, Any] | None
    user: str
    config: Config
    namespace: str
    groups: tuple[str, ...]
    unreadable: FieldError | None = None  # cut by the caller: the pod's fields are not read
    patch: list[dict[str, Any]] = field(default_factory=list)

    def judge(
        self,
        decision: Decision,
        policies,
        template: TemplateShape | None,
        old: TemplateShape | None,
        context: Context,
    ) -> None:
        review = _review(self.obj, self.operation, old, template, self.old_object, self.user, self.unreadable)
        for policy, needs_pod in policies:
            name = policy.NAME
            mode = self.config.active(name, self.namespace, self.user, self.groups)
            if mode == Mode.OFF:
                continue
            if needs_pod and review.pod is None:
                if name not in decision.unchecked:
                    decision.unchecked.append(name)
                continue
            for finding in policy.check(review, context):
                fix = apply_finding(decision, name, mode, finding)
                if fix:
                    # Later policies judge the object as it will be stored.
                    self.patch.extend(fix)
                    self.obj = _patched(self.obj, fix)
                    again = self._again(template)
                    review = _review(
                        self.obj, self.operation, old, again, self.old_object, self.user, self.unreadable
                    )
        if decision.unreadable is None:
            decision.unreadable = review.unreadable
        if decision.pod is None:
            decision.pod = review.pod

    def _again(self, template: TemplateShape | None) -> TemplateShape | None:
        """The same template, read again from the repaired object."""
        if template is None:
            return None
        found = _by_path(self.config.workloads.shapes(self.obj)).get(template.shape.path)
        return found if found is not None else template


def _by_path(templates: list[TemplateShape] | None) -> dict[str, TemplateShape]:
    return {t.shape.path: t for t in templates or ()}


def apply_finding(decision: Decision, policy: str, mode: Mode, finding: Finding):
    """Record one finding according to its policy's mode (a warning, an audit record, a fix or
    a violation): the one place this is decided, for objects, binds and allocations. Returns
    the patch to apply, if any."""
    violation = Violation(policy, finding.reason, finding.message, finding.node)
    if finding.doubt:
        decision.doubts.append(finding.doubt)
    if finding.advisory or mode == Mode.WARN:
        decision.warnings.append(f"[{policy}] {finding.reason}: {finding.message}")
    elif mode == Mode.AUDIT:
        decision.audited.append(violation)
    elif mode == Mode.FIX and finding.fix is not None:
        decision.fixed.append(violation)
        return finding.fix
    else:
        decision.violations.append(violation)
    return None


def _patched(obj: Mapping[str, Any], fix) -> Mapping[str, Any]:
    try:
        return jsonpatch.apply_patch(obj, list(fix))
    except RecursionError:  # the deep copy of an absurdly nested object
        raise FieldError("spec", "nested too deeply to read") from None


def _review(
    obj: Mapping[str, Any],
    operation: str,
    old: TemplateShape | None,
    template: TemplateShape | None,
    old_object: Mapping[str, Any] | None,
    user: str,
    unreadable: FieldError | None = None,
) -> Review:
    """Build the review; pod-relative field errors get the path inside the whole object.
    ``unreadable``: a part the caller could not read, so the pod's fields count as unreadable."""
    old_shape = old.shape if old is not None else None
    if template is None:
        return Review(obj, None, None, operation, old_shape, old_obj=old_object, user=user)
    shape = template.shape
    extra = {
        "template": template.where,
        "scheduler_default": template.scheduler,
        "old_scheduler_default": old.scheduler if old is not None else None,
    }
    if unreadable is not None:
        return Review(obj, shape, None, operation, old_shape, unreadable, old_object, user, **extra)
    try:
        pod = PodUnderReview.from_shape(shape)
    except FieldError as err:
        prefix = display_path(shape.path)
        unreadable = FieldError(f"{prefix}.{err.field}", err.message) if prefix else err
        return Review(obj, shape, None, operation, old_shape, unreadable, old_object, user, **extra)
    return Review(obj, shape, pod, operation, old_shape, None, old_object, user, **extra)


# (policy, whether it needs the pod's fields), in registry order; objects that create no pods
# meet only the policies that read any object.
_POLICIES = tuple((policy, policy.READS == POD_FIELDS) for policy in POLICIES)
_ANY_OBJECT_POLICIES = tuple(entry for entry in _POLICIES if entry[0].READS == ANY_OBJECT)
