"""``deviceScheduler``: one scheduler per device resource on a node.

Two schedulers that each keep their own count of a node's free GPUs will both hand out the
last one; the kubelet's device manager then fails the second pod with
``UnexpectedAdmissionError``. The race is per node, so ownership is too: configured per node
pool (``owners`` with a node selector; the map form means every node), or detected from the
device pods already on a node. Nothing is decided by a cluster-wide count: many clusters run
one scheduler on one GPU pool and another on the next, and they never collide.

- A pod or template must be placeable somewhere without mixing: the nodes it can reach (its
  nodeSelector, required node affinity, tolerations) that offer the device must include one
  its scheduler owns, or, where nothing is configured, one whose device pods are all its
  scheduler's (or that has none). A pod that can reach nodes of two configured owners is
  denied naming both: it must select one pool.
- A pod created with ``spec.nodeName`` bypasses every scheduler: on a node with an owner, or
  with device pods of any scheduler, it races them.
- A Binding (``binding.py``) that brings a device pod of scheduler S to a node whose device
  pods belong to T is denied there, at the moment of the race (``node_conflicts``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from ..globs import globs_overlap, matches_any
from ..kube.selectors import LABEL_OPERATORS, LabelSelector
from ..kube.workloads import display_path
from ..scheduler.filters import placeable, tolerations_of
from ..state.model import DEFAULT_SCHEDULER
from . import ALL_MODES, POD_FIELDS, Allocation, Bind, Context, Finding, Mode, Review, read_mode

if TYPE_CHECKING:
    from ..formats.reader import Reader
    from ..state import ClusterState
    from ..state.model import Node

NAME = "deviceScheduler"
REASON = "MixedDeviceScheduler"
REASONS = (REASON,)
MODES = ALL_MODES
READS = POD_FIELDS
STATIC = None  # owners can be detected from the pods on nodes: no static form
DEFAULT_DEVICE_PATTERNS = ("nvidia.com/*", "amd.com/*", "intel.com/*", "gpu.intel.com/*")
BYPASS = "spec.nodeName"  # the "scheduler" of a pod created on its node: none
NAMED_NODES = 5  # nodes a message names
NAMED_PODS = 3  # pods per node a message names


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


# -- who hands out a device on one node -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class Device:
    """Something a pod asks for that one scheduler must hand out: an extended resource, or a
    configured annotation (a GPU fraction) whose owner is the same on every node."""

    name: str
    resource: bool  # an extended resource: nodes offer it, pods on nodes hold it
    annotation_owner: str | None = None

    def configured(self, config: DeviceSchedulerConfig, labels: Mapping[str, str] | None) -> OwnerRule | None:
        if not self.resource:
            return OwnerRule(self.name, self.annotation_owner or "")
        return config.owner_rule(self.name, labels)

    def everywhere(self, config: DeviceSchedulerConfig) -> OwnerRule | None:
        """The owner on every node, when the first rule for it has no node selector."""
        if not self.resource:
            return OwnerRule(self.name, self.annotation_owner or "")
        rules = config.rules_for(self.name)
        return rules[0] if rules and rules[0].node_selector is None else None


@dataclass(frozen=True, slots=True)
class NodeOwner:
    """Who hands out ``device`` on ``node``: its configured owner, or (nothing configured) the
    schedulers whose bound pods hold it there now."""

    device: str
    node: str
    configured: OwnerRule | None
    holders: Mapping[str, int]
    # Schedulers whose device pods were bound here by binds allowed and not yet in the watch.
    in_flight: frozenset[str] = frozenset()

    def others(self, scheduler: str) -> list[str]:
        """The schedulers a pod of ``scheduler`` would race on this node."""
        if self.configured is not None:
            return [] if self.configured.scheduler == scheduler else [self.configured.scheduler]
        return sorted(s for s in self.holders if s != scheduler)


def node_owner(
    device: Device,
    node: str,
    labels: Mapping[str, str] | None,
    state: ClusterState | None,
    config: DeviceSchedulerConfig,
) -> NodeOwner:
    configured = device.configured(config, labels)
    holders: Mapping[str, int] = {}
    if configured is None and config.autodetect and state is not None and device.resource:
        holders = state.device_holders(node, device.name)
    return NodeOwner(device.name, node, configured, holders)


def node_conflicts(
    requests: Mapping[str, int],
    scheduler: str,
    node: Node,
    state: ClusterState,
    config: DeviceSchedulerConfig,
    in_flight: Iterable[tuple[str, Mapping[str, int]]] = (),
) -> list[NodeOwner]:
    """A pod of ``scheduler`` asking for ``requests`` arrives on ``node`` (a bind): every device
    whose owner there is another scheduler. The bind guard and the audit ask this.

    ``in_flight``: (scheduler, requests) of the binds to ``node`` allowed and not yet in the
    watch. Where nothing is configured they hold the device as bound pods do: two binds of two
    schedulers' pods to a node with no device pod yet, in the same instant, must not both pass."""
    found = []
    for resource, amount in requests.items():
        if amount > 0 and config.is_device(resource):
            owner = node_owner(Device(resource, True), node.name, node.labels, state, config)
            if owner.configured is None and config.autodetect:
                pending = {s for s, asked in in_flight if s and asked.get(resource)}
                holders = {**dict.fromkeys(pending, 0), **owner.holders}
                owner = NodeOwner(owner.device, owner.node, None, holders, frozenset(pending))
            if owner.others(scheduler):
                found.append(owner)
    return found


def owned_by_others(
    requests: Mapping[str, int], scheduler: str, state: ClusterState, config: DeviceSchedulerConfig | None
) -> Callable[[Node], list[NodeOwner]] | None:
    """For the nodes a message or ``explain`` suggests: on which a pod of ``scheduler`` asking
    for ``requests`` would race another scheduler for its devices (what a bind there is denied
    for). None when nothing can race: the policy is off, or the pod asks for no device."""
    if config is None or config.mode == "off":
        return None
    if not any(amount > 0 and config.is_device(resource) for resource, amount in requests.items()):
        return None
    return lambda node: node_conflicts(requests, scheduler, node, state, config)


def bind_message(pod: str, scheduler: str, node: str, conflicts: list[NodeOwner], state: ClusterState) -> str:
    """Why a bind of ``pod`` (placed by ``scheduler``) to ``node`` mixes schedulers."""
    parts = [_race(c, scheduler, state) for c in conflicts]
    return (
        f"{pod} of scheduler {scheduler} would be bound to {node}, where {'; '.join(parts)}. Two "
        "schedulers handing out the same devices on one node both give away the last one, and the "
        "kubelet fails the second pod with UnexpectedAdmissionError. The scheduler will retry it "
        "elsewhere; keep each scheduler on its own nodes (policies.deviceScheduler.owners with a "
        "nodeSelector)."
    )


def _race(owner: NodeOwner, scheduler: str, state: ClusterState | None) -> str:
    if owner.configured is not None:
        rule = owner.configured
        return f"{owner.device} is owned by {rule.scheduler} (configured for {rule.pool})"
    held = []
    for other in owner.others(scheduler):
        pods = state.device_pods(owner.node, owner.device, other) if state is not None else []
        shown = ", ".join(pods[:NAMED_PODS]) + (
            f" and {len(pods) - NAMED_PODS} more" if len(pods) > NAMED_PODS else ""
        )
        if not shown and other in owner.in_flight:
            shown = "a bind allowed and not yet in the guard's watch"
        held.append(f"{other} ({shown})" if shown else other)
    return f"{owner.device} is held by pods of {' and '.join(held)}"


def check_bind(bind: Bind, context: Context) -> list[Finding]:
    """A scheduler's Binding of a device pod: a warning when the binder is not among the
    resource's ``binders`` (a denial would make that scheduler retry forever), and
    ``MixedDeviceScheduler`` when the node's device is another scheduler's, by configuration,
    by the device pods bound there, or by binds in flight to it. Pods created with
    ``spec.nodeName`` are judged at CREATE (``check``)."""
    if bind.created:
        return []
    config = context.config.policy(NAME)
    record = bind.pod.record
    findings = [
        Finding(
            REASON,
            f"{bind.pod_name} requests {resource} and was bound by {bind.who or 'an unknown binder'}; only "
            f"{', '.join(allowed)} should bind it.",
            advisory=True,
        )
        for resource, amount in record.requests.items()
        for allowed in ((config.allowed_binders(resource) if amount else None),)
        if allowed is not None and not any(fnmatchcase(bind.who, p) for p in allowed)
    ]
    conflicts = node_conflicts(
        record.requests, record.scheduler, bind.node, bind.state, config, bind.in_flight
    )
    if conflicts:
        message = bind_message(bind.pod_name, record.scheduler, bind.node.name, conflicts, bind.state)
        findings.append(Finding(REASON, message, bind.node.name))
    return findings


def check_allocation(allocation: Allocation, context: Context) -> list[Finding]:
    """An allocation written by an identity the driver's ``allocators`` do not include: a
    warning, like a binder's (a denial would make that scheduler retry forever)."""
    config = context.config.policy(NAME)
    written = allocation.claim.allocation
    if not config.allocators or written is None:
        return []
    writer = allocation.writer
    return [
        Finding(
            REASON,
            f"ResourceClaim {allocation.claim.claim} was allocated devices of {driver} by "
            f"{writer or 'an unknown writer'}; only {', '.join(allowed)} should allocate them.",
            advisory=True,
        )
        for driver in sorted({r.driver for r in written.results})
        for allowed in (config.allowed_allocators(driver),)
        if allowed is not None and not any(fnmatchcase(writer, p) for p in allowed)
    ]


# -- the policy: pods and templates at CREATE and UPDATE ------------------------------------


def devices_of(review: Review, config: DeviceSchedulerConfig) -> list[Device]:
    """What the pod asks for that one scheduler must hand out."""
    devices = [
        Device(resource, True)
        for resource, amount in review.pod.record.requests.items()
        if amount > 0 and config.is_device(resource)
    ]
    annotations = review.shape.metadata.get("annotations") or {}
    devices += [
        Device(f"annotation {key}", False, owner) for key, owner in config.annotations if key in annotations
    ]
    return devices


def check(review: Review, context: Context) -> list[Finding]:
    settings = context.config.policy(NAME)
    devices = devices_of(review, settings)
    if not devices or (review.old_shape is not None and _unchanged(review)):
        return []
    node = review.shape.spec.get("nodeName")
    if node:
        return _pinned(review, devices, str(node), context.state, settings)
    return _unpinned(review, devices, context.state, settings)


def _pinned(
    review: Review,
    devices: list[Device],
    node_name: str,
    state: ClusterState | None,
    config: DeviceSchedulerConfig,
) -> list[Finding]:
    """A pod on its node from the start: no scheduler placed it, so any owner there is raced."""
    node = state.nodes.get(node_name) if state is not None else None
    labels = node.labels if node is not None else None
    owners = [node_owner(d, node_name, labels, state, config) for d in devices]
    conflicts = [o for o in owners if o.others(BYPASS)]
    if not conflicts:
        return []
    different = _different_owners(review, owners)
    if different:
        return different
    schedulers = sorted({s for c in conflicts for s in c.others(BYPASS)})
    fix = schedulers[0] if len(schedulers) == 1 else " or ".join(schedulers)
    listing = "; ".join(_race(c, BYPASS, state) for c in conflicts)
    return [
        Finding(
            REASON,
            f"{review.description} sets spec.nodeName={node_name!r} and asks for devices, bypassing "
            f"every scheduler, on a node where {listing}. The owner does not know these devices are "
            f"taken and will hand them out again. {_unpin(review, schedulers, fix)}",
            node=node_name,
        )
    ]


def _different_owners(review: Review, owners: list[NodeOwner]) -> list[Finding]:
    """One pod asking for devices that different schedulers own: no scheduler can place it."""
    configured = {o.device: o.configured for o in owners if o.configured is not None}
    if len({rule.scheduler for rule in configured.values()}) < 2:
        return []
    listing = "; ".join(
        f"{device} is owned by {rule.scheduler} (configured for {rule.pool})"
        for device, rule in configured.items()
    )
    return [
        Finding(
            REASON,
            f"{review.description} asks for devices with different owners: {listing}. One pod has one "
            "scheduler; split it into separate pods.",
        )
    ]


def _unpinned(
    review: Review, devices: list[Device], state: ClusterState | None, config: DeviceSchedulerConfig
) -> list[Finding]:
    """Where the scheduler may place it: the nodes it can reach that offer its devices."""
    scheduler = review.scheduler
    rules = [d.everywhere(config) for d in devices]
    if all(rule is not None for rule in rules):  # owned on every node: no node needs reading
        owners = [NodeOwner(d.name, "", rule, {}) for d, rule in zip(devices, rules, strict=True)]
        return _different_owners(review, owners) or _wrong_owner(review, scheduler, owners)
    reachable = _reachable(review, devices, state)
    first = next(reachable, None) if reachable is not None else None
    if first is None:
        return _by_selectors(review, scheduler, devices, config)
    return _by_nodes(review, scheduler, devices, itertools.chain((first,), reachable), state, config)


def _reachable(review: Review, devices: list[Device], state: ClusterState | None) -> Iterator[Node] | None:
    """The nodes the pod can be placed on that offer every device it asks for (lazily: a safe
    node ends the search); None without state or with no node offering them."""
    if state is None:
        return None
    offering: set[str] | None = None
    for device in devices:
        if device.resource:
            names = state.nodes_offering(device.name)
            offering = set(names) if offering is None else offering & names
    if not offering:
        return None
    tolerations = tolerations_of(review.shape)
    spec = review.shape.spec
    return (
        node
        for name in offering
        if (node := state.nodes.get(name)) is not None and placeable(spec, node, tolerations)
    )


def _by_nodes(
    review: Review,
    scheduler: str,
    devices: list[Device],
    nodes: Iterable[Node],
    state: ClusterState,
    config: DeviceSchedulerConfig,
) -> list[Finding]:
    """Deny when a configured owner of a node it can reach is another scheduler, or when every
    node it can reach already holds another scheduler's device pods; any safe node allows it
    (and, when no owner is configured for its devices, ends the search)."""
    configured_elsewhere: dict[str, list[str]] = {}  # other owner → nodes
    own_pool: list[str] = []
    occupied: list[list[NodeOwner]] = []
    unconfigured = all(d.resource and not config.rules_for(d.name) for d in devices)
    safe = False
    for node in nodes:
        owners = [node_owner(d, node.name, node.labels, state, config) for d in devices]
        different = _different_owners(review, owners)
        if different:
            return different
        others = {s for o in owners if o.configured is not None for s in o.others(scheduler)}
        for other in others:
            configured_elsewhere.setdefault(other, []).append(node.name)
        if others:
            continue
        if any(o.configured is not None for o in owners):
            own_pool.append(node.name)
        racing = [o for o in owners if o.others(scheduler)]
        if racing:
            occupied.append(racing)
            continue
        safe = True
        if unconfigured:
            return []  # a safe place, and no pool of another owner to find
    if configured_elsewhere:
        pools = {owner: sorted(names) for owner, names in configured_elsewhere.items()}
        return _wrong_pool(review, scheduler, pools, sorted(own_pool), config)
    if safe or not occupied:
        return []
    occupied.sort(key=lambda racing: racing[0].node)
    return [_everywhere_mixed(review, scheduler, occupied, state)]


def _wrong_pool(
    review: Review,
    scheduler: str,
    elsewhere: dict[str, list[str]],
    own_pool: list[str],
    config: DeviceSchedulerConfig,
) -> list[Finding]:
    pools = "; ".join(f"{owner} owns them on {_nodes(nodes)}" for owner, nodes in sorted(elsewhere.items()))
    if own_pool or len(elsewhere) > 1:
        owners = sorted({*elsewhere, *([scheduler] if own_pool else [])})
        mine = f"; {scheduler} owns them on {_nodes(own_pool)}" if own_pool else ""
        return [
            Finding(
                REASON,
                f"{review.description} uses schedulerName {scheduler!r} and can land on nodes of "
                f"{len(owners)} owners of its devices: {pools}{mine}. Select one pool with a "
                f"nodeSelector or required node affinity, and use its owner as {_scheduler_field(review)}.",
            )
        ]
    [(owner, nodes)] = elsewhere.items()
    return [
        _wrong_scheduler(review, scheduler, owner, f"it can reach only nodes {owner} owns ({_nodes(nodes)})")
    ]


def _wrong_owner(review: Review, scheduler: str, owners: list[NodeOwner]) -> list[Finding]:
    """Owners that do not depend on the node (every node, or the pod's selector decides)."""
    wrong = sorted({o.configured.scheduler for o in owners if o.configured is not None} - {scheduler})
    if not wrong:
        return []
    listing = "; ".join(
        f"{o.device} is owned by {o.configured.scheduler} (configured)" for o in owners if o.configured
    )
    return [_wrong_scheduler(review, scheduler, wrong[0], listing)]


def _wrong_scheduler(review: Review, scheduler: str, owner: str, why: str) -> Finding:
    message = (
        f"{review.description} uses schedulerName {scheduler!r}, but {why}. Two schedulers handing "
        f"out the same devices make the kubelet fail pods with UnexpectedAdmissionError. Set "
        f"{_scheduler_field(review)}: {owner}."
    )
    return Finding(REASON, message, fix=_scheduler_fix(review, scheduler, owner))


def _unpin(review: Review, owners: list[str], fix: str) -> str:
    """What to change: the pin always; the scheduler only when it is not already the owner."""
    pin = f"{display_path(review.shape.path)}.spec.nodeName" if review.shape.path else "spec.nodeName"
    if review.scheduler in owners:
        return f"Drop {pin}: {review.scheduler}, its scheduler, places it."
    return f"Drop {pin} and set {_scheduler_field(review)}: {fix}."


def _scheduler_field(review: Review) -> str:
    """Where the pods' schedulerName is set. An operator's kind has none of its own in ``spec``
    (a RayCluster's lives in each template), so its message names the template's field; a Pod
    or a built-in controller keeps the short ``spec.schedulerName`` people know."""
    if not review.template:
        return "spec.schedulerName"
    return f"{review.template}.spec.schedulerName"


def _scheduler_fix(review: Review, scheduler: str, owner: str):
    """The API server fills in default-scheduler before any webhook runs, so it means "unset";
    any other scheduler was chosen on purpose and is never silently rewritten."""
    if scheduler != DEFAULT_SCHEDULER:
        return None
    op = "replace" if "schedulerName" in review.shape.spec else "add"
    return ({"op": op, "path": f"{review.shape.path}/spec/schedulerName", "value": owner},)


def _everywhere_mixed(
    review: Review, scheduler: str, occupied: list[list[NodeOwner]], state: ClusterState
) -> Finding:
    """Every node it can reach holds another scheduler's device pods: wherever it lands, it mixes."""
    shown = "; ".join(
        f"{racing[0].node}: {', '.join(_race(o, scheduler, state) for o in racing)}"
        for racing in occupied[:NAMED_NODES]
    )
    more = f" and {len(occupied) - NAMED_NODES} more nodes" if len(occupied) > NAMED_NODES else ""
    # A scheduler that is alone on one of those nodes would place it without mixing.
    alone = [racing[0].others(scheduler) for racing in occupied if len(racing) == 1]
    candidates = sorted({o[0] for o in alone if len(o) == 1})
    owner = candidates[0] if len(candidates) == 1 else None
    then = (
        f"Set {_scheduler_field(review)}: {owner}, or keep it off those nodes."
        if owner
        else "Keep it to nodes of its own scheduler (nodeSelector), or give the devices an owner per pool "
        "(policies.deviceScheduler.owners)."
    )
    return Finding(
        REASON,
        f"{review.description} uses schedulerName {scheduler!r}, and every node it can reach that offers "
        f"its devices already holds another scheduler's device pods ({shown}{more}). Wherever it lands, two "
        "schedulers hand out that node's devices and the kubelet fails one pod with "
        f"UnexpectedAdmissionError. {then}",
        fix=_scheduler_fix(review, scheduler, owner) if owner else None,
    )


def _by_selectors(
    review: Review, scheduler: str, devices: list[Device], config: DeviceSchedulerConfig
) -> list[Finding]:
    """No nodes to read: the pools the pod's nodeSelector does not exclude, in rule order (a
    pool its selector implies holds all its nodes; nothing after it is reached)."""
    selector = review.shape.spec.get("nodeSelector")
    wanted = {str(k): str(v) for k, v in selector.items()} if isinstance(selector, Mapping) else {}
    reached: dict[str, list[OwnerRule]] = {}
    for device in devices:
        for rule in _pools_reached(device, config, wanted):
            reached.setdefault(rule.scheduler, []).append(rule)
    if not reached or set(reached) == {scheduler}:
        return []
    if len(reached) > 1:
        pools = "; ".join(
            f"{owner} owns {rules[0].resource} on {rules[0].pool}" for owner, rules in sorted(reached.items())
        )
        return [
            Finding(
                REASON,
                f"{review.description} uses schedulerName {scheduler!r} and its nodeSelector reaches "
                f"pools of {len(reached)} owners of its devices: {pools}. Select one pool with a "
                f"nodeSelector, and use its owner as {_scheduler_field(review)}.",
            )
        ]
    [(owner, rules)] = reached.items()
    why = f"{rules[0].resource} is owned by {owner} on {rules[0].pool} (configured)"
    return [_wrong_scheduler(review, scheduler, owner, why)]


def _pools_reached(
    device: Device, config: DeviceSchedulerConfig, wanted: Mapping[str, str]
) -> Iterable[OwnerRule]:
    if not device.resource:
        yield OwnerRule(device.name, device.annotation_owner or "")
        return
    for rule in config.rules_for(device.name):
        if rule.node_selector is None or rule.node_selector.implied_by(wanted):
            yield rule
            return
        if not rule.node_selector.excludes(wanted):
            yield rule


def _nodes(names: list[str]) -> str:
    shown = ", ".join(names[:NAMED_NODES])
    return shown + (f" and {len(names) - NAMED_NODES} more" if len(names) > NAMED_NODES else "")


def _unchanged(review: Review) -> bool:
    """An UPDATE that keeps scheduler, nodeName and devices as they were is never refused."""
    old, new = review.old_shape.spec, review.shape.spec
    return (
        review.old_scheduler == review.scheduler
        and old.get("nodeName") == new.get("nodeName")
        and old.get("containers") == new.get("containers")
        and old.get("initContainers") == new.get("initContainers")
        and (review.old_shape.metadata.get("annotations") or {})
        == (review.shape.metadata.get("annotations") or {})
    )
