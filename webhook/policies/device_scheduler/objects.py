"""``deviceScheduler`` on a pod or a template at CREATE and UPDATE: placeable somewhere without
mixing schedulers, and, bound to its node from the start, racing no owner there."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from ...kube.workloads import display_path
from ...scheduler.filters import placeable, tolerations_of
from ...state.model import DEFAULT_SCHEDULER
from .. import Finding, Review
from .owners import BYPASS, REASON, Device, NodeOwner, node_owner, race
from .settings import DeviceSchedulerConfig, OwnerRule

if TYPE_CHECKING:
    from ...state import ClusterState
    from ...state.model import Node

NAMED_NODES = 5  # nodes a message names


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


def check(review: Review, settings: DeviceSchedulerConfig, state: ClusterState | None) -> list[Finding]:
    """The pod or template of ``review``: what its devices race, on its node or where it can go."""
    devices = devices_of(review, settings)
    if not devices or (review.old_shape is not None and _unchanged(review)):
        return []
    node = review.shape.spec.get("nodeName")
    if node:
        return _pinned(review, devices, str(node), state, settings)
    return _unpinned(review, devices, state, settings)


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
    listing = "; ".join(race(c, BYPASS, state) for c in conflicts)
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
        f"{racing[0].node}: {', '.join(race(o, scheduler, state) for o in racing)}"
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
