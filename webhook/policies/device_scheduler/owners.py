"""Who hands out a device on one node: its configured owner, else the schedulers whose pods hold
it there (and the binds in flight to it). The object check, the bind check, ``explain`` and the
audit ask this."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .. import Mode
from .settings import DeviceSchedulerConfig, OwnerRule

if TYPE_CHECKING:
    from ...state import ClusterState
    from ...state.model import Node

REASON = "MixedDeviceScheduler"
BYPASS = "spec.nodeName"  # the "scheduler" of a pod created on its node: none
NAMED_PODS = 3  # pods per node a message names


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
    if config is None or config.mode == Mode.OFF:
        return None
    if not any(amount > 0 and config.is_device(resource) for resource, amount in requests.items()):
        return None
    return lambda node: node_conflicts(requests, scheduler, node, state, config)


def bind_message(pod: str, scheduler: str, node: str, conflicts: list[NodeOwner], state: ClusterState) -> str:
    """Why a bind of ``pod`` (placed by ``scheduler``) to ``node`` mixes schedulers."""
    parts = [race(c, scheduler, state) for c in conflicts]
    return (
        f"{pod} of scheduler {scheduler} would be bound to {node}, where {'; '.join(parts)}. Two "
        "schedulers handing out the same devices on one node both give away the last one, and the "
        "kubelet fails the second pod with UnexpectedAdmissionError. The scheduler will retry it "
        "elsewhere; keep each scheduler on its own nodes (policies.deviceScheduler.owners with a "
        "nodeSelector)."
    )


def race(owner: NodeOwner, scheduler: str, state: ClusterState | None) -> str:
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
