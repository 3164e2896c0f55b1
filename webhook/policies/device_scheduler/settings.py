"""``deviceScheduler``'s settings: which resources are devices, their owners per node pool, the
annotations that name a device, who may bind a device pod and who may allocate a driver's devices."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from ...globs import globs_overlap, matches_any
from ...kube.selectors import LABEL_OPERATORS, LabelSelector
from .. import ALL_MODES, Mode, read_mode

if TYPE_CHECKING:
    from ...formats.reader import Reader

MODES = ALL_MODES
DEFAULT_DEVICE_PATTERNS = ("nvidia.com/*", "amd.com/*", "intel.com/*", "gpu.intel.com/*")


@dataclass(frozen=True, slots=True)
class OwnerRule:
    """``scheduler`` hands out ``resource`` (a name or a glob) on the nodes ``node_selector``
    matches; None: on every node (the map form of ``owners``)."""

    resource: str
    scheduler: str
    node_selector: LabelSelector | None = None

    def applies(self, resource: str, labels: Mapping[str, str] | None) -> bool:
        """``labels`` None: a node not known (only rules for every node apply)."""
        if not fnmatchcase(resource, self.resource):
            return False
        if self.node_selector is None:
            return True
        return labels is not None and self.node_selector.matches(labels)

    @property
    def pool(self) -> str:
        return "every node" if self.node_selector is None else f"nodes {self.node_selector}"


@dataclass(frozen=True, slots=True)
class DeviceSchedulerConfig:
    mode: Mode = Mode.ENFORCE
    resources: tuple[str, ...] = DEFAULT_DEVICE_PATTERNS
    owners: tuple[OwnerRule, ...] = ()  # the first that applies to a node decides
    annotations: tuple[tuple[str, str], ...] = ()  # (annotation key, scheduler)
    autodetect: bool = True
    binders: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (resource pattern, identity globs)
    # (DRA driver name or glob, identity globs): who may write a claim's allocation of its devices.
    allocators: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def allowed_binders(self, resource: str) -> tuple[str, ...] | None:
        return next((who for p, who in self.binders if fnmatchcase(resource, p)), None)

    def allowed_allocators(self, driver: str) -> tuple[str, ...] | None:
        """The identities that may allocate ``driver``'s devices; None: not configured."""
        return next((who for p, who in self.allocators if fnmatchcase(driver, p)), None)

    def is_device(self, resource: str) -> bool:
        return matches_any(resource, self.resources) or any(
            fnmatchcase(resource, rule.resource) for rule in self.owners
        )

    def configured_owner(self, resource: str, labels: Mapping[str, str] | None = None) -> str | None:
        """The owner of ``resource`` on a node with ``labels`` (None: a node not known)."""
        rule = self.owner_rule(resource, labels)
        return rule.scheduler if rule is not None else None

    def owner_rule(self, resource: str, labels: Mapping[str, str] | None) -> OwnerRule | None:
        return next((rule for rule in self.owners if rule.applies(resource, labels)), None)

    def rules_for(self, resource: str) -> list[OwnerRule]:
        return [rule for rule in self.owners if fnmatchcase(resource, rule.resource)]


Settings = DeviceSchedulerConfig
_KEYS = {"mode", "resources", "owners", "annotations", "autodetect", "binders", "allocators"}


def read_settings(reader: Reader, data: Any, where: str) -> DeviceSchedulerConfig:
    data = reader.mapping(data, where, _KEYS)
    resources = reader.strings(data.get("resources", list(DEFAULT_DEVICE_PATTERNS)), f"{where}.resources")
    owners = _owners(reader, data.get("owners") or {}, f"{where}.owners")
    annotations = tuple(reader.mapping(data.get("annotations") or {}, f"{where}.annotations").items())
    for key, owner in annotations:
        if not isinstance(owner, str) or not owner:
            reader.fail(f"{where}.annotations.{key}", "the owner must be a scheduler name")
    for pattern in (*resources, *(rule.resource for rule in owners)):
        if "[" in pattern:
            reader.fail(f"{where}", f"pattern {pattern!r}: only * and ? wildcards are supported")
    return DeviceSchedulerConfig(
        mode=read_mode(reader, data, where, MODES),
        resources=resources,
        owners=owners,
        annotations=annotations,
        autodetect=reader.boolean(data.get("autodetect", True), f"{where}.autodetect", True),
        binders=_identities(reader, data.get("binders"), f"{where}.binders"),
        allocators=_identities(reader, data.get("allocators"), f"{where}.allocators"),
    )


def _identities(reader: Reader, data: Any, where: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``{pattern: [identity globs]}`` (binders by resource, allocators by DRA driver)."""
    return tuple(
        (str(pattern), reader.strings(who, f"{where}.{pattern}"))
        for pattern, who in reader.mapping(data or {}, where).items()
    )


def _owners(reader: Reader, data: Any, where: str) -> tuple[OwnerRule, ...]:
    """The map form (``{resource: scheduler}``, every node) or the list form
    (``[{resource, scheduler, nodeSelector}]``, one rule per node pool, the first that applies
    to a node decides)."""
    if isinstance(data, Mapping):
        rules = []
        for resource, owner in data.items():
            if not isinstance(owner, str) or not owner:
                reader.fail(f"{where}.{resource}", "the owner must be a scheduler name")
                continue
            rules.append(OwnerRule(str(resource), owner))
    else:
        rules = [
            rule
            for i, item in enumerate(reader.sequence(data, where))
            if (rule := _owner_rule(reader, item, f"{where}[{i}]")) is not None
        ]
    _check_overlaps(reader, rules, where)
    return tuple(rules)


def _owner_rule(reader: Reader, data: Any, where: str) -> OwnerRule | None:
    item = reader.mapping(data, where, {"resource", "scheduler", "nodeSelector"})
    resource, scheduler = item.get("resource"), item.get("scheduler")
    if not isinstance(resource, str) or not resource:
        reader.fail(f"{where}.resource", "must be a resource name or pattern, like nvidia.com/gpu")
    if not isinstance(scheduler, str) or not scheduler:
        reader.fail(f"{where}.scheduler", "must be a scheduler name")
    selector = None
    if "nodeSelector" in item:
        selector = _label_selector(reader, item["nodeSelector"], f"{where}.nodeSelector")
    if not isinstance(resource, str) or not resource or not isinstance(scheduler, str) or not scheduler:
        return None
    return OwnerRule(resource, scheduler, selector)


def _label_selector(reader: Reader, data: Any, where: str) -> LabelSelector:
    item = reader.mapping(data, where, {"matchLabels", "matchExpressions"})
    labels = reader.mapping(item.get("matchLabels") or {}, f"{where}.matchLabels")
    for key, value in labels.items():
        if not isinstance(value, str):
            reader.fail(f"{where}.matchLabels.{key}", "must be a string (quote numbers and booleans)")
    expressions = []
    for i, raw in enumerate(reader.sequence(item.get("matchExpressions") or [], f"{where}.matchExpressions")):
        at = f"{where}.matchExpressions[{i}]"
        expression = reader.mapping(raw, at, {"key", "operator", "values"})
        key, operator = expression.get("key"), expression.get("operator")
        values = reader.strings(expression.get("values") or [], f"{at}.values")
        if not isinstance(key, str) or not key:
            reader.fail(f"{at}.key", "must be a label key")
            continue
        if operator not in LABEL_OPERATORS:
            reader.fail(f"{at}.operator", f"{operator!r} is not one of {', '.join(LABEL_OPERATORS)}")
            continue
        if operator in ("In", "NotIn") and not values:
            reader.fail(f"{at}.values", f"{operator} needs at least one value")
        if operator in ("Exists", "DoesNotExist") and values:
            reader.fail(f"{at}.values", f"{operator} takes no values")
        expressions.append((key, operator, values))
    if not labels and not expressions:
        reader.fail(
            where, "must select some nodes (matchLabels or matchExpressions); leave it out for every node"
        )
    return LabelSelector(
        tuple((str(k), v) for k, v in labels.items() if isinstance(v, str)), tuple(expressions)
    )


def _check_overlaps(reader: Reader, rules: list[OwnerRule], where: str) -> None:
    """Two owners of one resource on every node contradict each other; a rule behind one for
    every node never applies."""
    for i, first in enumerate(rules):
        for second in rules[i + 1 :]:
            if first.node_selector is not None or not globs_overlap(first.resource, second.resource):
                continue
            if second.node_selector is None and first.scheduler != second.scheduler:
                reader.fail(
                    where,
                    f"{first.resource!r} (owner {first.scheduler}) and {second.resource!r} (owner "
                    f"{second.scheduler}) match the same resource; a resource can have only one owner "
                    "on a node (give each a nodeSelector for its pool)",
                )
            elif second.node_selector is not None and first.scheduler != second.scheduler:
                reader.fail(
                    where,
                    f"the rule for {second.resource!r} on nodes {second.node_selector} (owner "
                    f"{second.scheduler}) never applies: {first.resource!r} is owned by "
                    f"{first.scheduler} on every node before it (list pools first)",
                )
