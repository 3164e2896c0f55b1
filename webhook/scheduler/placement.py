"""Where a pod could go: nodes kube-scheduler's filters would pick and whose kubelet would admit it.

The scheduler's view decides where a pod can go (a node without the GPUs it asks for, a cordoned
node or one with a NoSchedule taint it does not tolerate is never a place for it, whatever its
kubelet would say); the kubelet's verdict stays for "node X would reject it". ``explain`` asks
both of every node; denial messages ask them of a bounded number of nodes (a webhook must not
scan a 5,000-node cluster per request), to name a few where the pod fits now, or to say none do.
Both count the cluster's nodes the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ..checks.dynamic_resources import dynamic_resources
from ..checks.failure import Failure
from ..checks.kubelet import KubeletConfig, PodUnderReview, kubelet_admission
from ..kube.resources import is_extended_resource
from ..state.model import ClusterState, Node
from .filters import placeable, scheduler_filters

MESSAGE_SCAN = 32  # nodes examined for a denial message
MESSAGE_NAMES = 3  # nodes named in it


class KubeletSettings(Protocol):
    """What each node's kubelet runs with (``nodeAdmission``'s settings): unsafe sysctls, the
    topology manager."""

    def kubelet_for(self, node: Node) -> KubeletConfig: ...


def unpinned(pod: PodUnderReview) -> PodUnderReview:
    """The pod with its own ``spec.nodeName`` set aside: the question is where it could go."""
    if "nodeName" not in pod.spec:
        return pod
    return PodUnderReview(pod.metadata, {k: v for k, v in pod.spec.items() if k != "nodeName"}, pod.record)


def verdict(
    pod: PodUnderReview, node: Node, state: ClusterState, config: KubeletSettings | None = None
) -> list[Failure]:
    """Every reason the kubelet on ``node`` would reject ``pod`` (empty: it would admit it)."""
    kubelet = config.kubelet_for(node) if config is not None else None
    return kubelet_admission(pod, node, state.usage(node.name), kubelet)


@dataclass(frozen=True, slots=True)
class Placement:
    """One node, both ways: why the scheduler's filters would not pick it, and why its kubelet
    would reject the pod (each empty when they would)."""

    node: str
    scheduler: tuple[str, ...]
    kubelet: tuple[Failure, ...]

    @property
    def fits(self) -> bool:
        return not self.scheduler and not self.kubelet


def placement(
    pod: PodUnderReview,
    node: Node,
    state: ClusterState,
    config: KubeletSettings | None = None,
    tolerations: list | None = None,
    namespace: str = "default",
) -> Placement:
    """``pod`` (unpinned) on ``node``: the scheduler's filters (its claims' devices included)
    and the kubelet's admission. ``namespace``: the pod's, where its claims live."""
    scheduler = scheduler_filters(pod, node, state.usage(node.name), tolerations)
    claims = dynamic_resources(pod.spec, namespace, node, state)
    if claims is not None:
        scheduler.append(claims)
    return Placement(node.name, tuple(scheduler), tuple(verdict(pod, node, state, config)))


def fits(
    pod: PodUnderReview,
    node: Node,
    state: ClusterState,
    config: KubeletSettings | None = None,
    tolerations: list | None = None,
    namespace: str = "default",
) -> bool:
    """``placement(...).fits``, the cheapest questions first (a message asks it of many nodes)."""
    if tolerations is None:
        raw = pod.spec.get("tolerations")
        tolerations = raw if isinstance(raw, list) else []
    if not placeable(pod.spec, node, tolerations):
        return False
    return (
        not scheduler_filters(pod, node, state.usage(node.name), tolerations)
        and dynamic_resources(pod.spec, namespace, node, state) is None
        and not verdict(pod, node, state, config)
    )


@dataclass(frozen=True, slots=True)
class Candidates:
    """Up to ``MESSAGE_NAMES`` nodes where the pod fits, from the nodes scanned. ``offering``:
    the extended resource that limited the scan to the nodes advertising it ("" for none), and
    ``total`` the count of those nodes (else of the cluster's)."""

    admitting: tuple[str, ...]
    scanned: int
    total: int
    offering: str = ""

    def sentence(self) -> str:
        if self.admitting:
            return f"Nodes it fits on now: {', '.join(self.admitting)}."
        nodes = f"nodes with {self.offering}" if self.offering else "nodes"
        if self.scanned < self.total:
            return f"It fits on none of the first {self.scanned} of {self.total} {nodes} now."
        return f"It fits on none of the {self.total} {nodes} now."


def candidates(
    pod: PodUnderReview,
    state: ClusterState,
    *,
    skip: Iterable[str] = (),
    config: KubeletSettings | None = None,
    tolerations: list | None = None,
    namespace: str = "default",
    refused: Callable[[Node], bool] | None = None,
) -> Candidates:
    """A few nodes where ``pod`` fits (the scheduler would pick them, the kubelet would admit it);
    stops at ``MESSAGE_NAMES`` found or ``MESSAGE_SCAN`` examined. ``skip``: nodes known to
    reject it, not examined again but counted, as ``explain`` counts them. ``refused``: nodes
    a policy would deny it on (another scheduler owns its devices there): never suggested."""
    pod, skipped = unpinned(pod), set(skip)
    resource, offering = _offering(pod, state)
    admitting: list[str] = []
    scanned = 0
    for name in offering:
        if scanned == MESSAGE_SCAN or len(admitting) == MESSAGE_NAMES:
            break
        scanned += 1
        node = state.nodes.get(name)
        if node is None or name in skipped or (refused is not None and refused(node)):
            continue
        if fits(pod, node, state, config, tolerations, namespace):
            admitting.append(name)
    total = len(offering) if resource else len(state.nodes)
    return Candidates(tuple(admitting), scanned, total, resource)


def _offering(pod: PodUnderReview, state: ClusterState) -> tuple[str, list[str] | Mapping[str, Node]]:
    """The nodes worth examining: those that advertise every extended resource the pod asks for
    (the scheduler places it nowhere else), with the resource that says so ("" for all nodes).
    The message counts these, so that a scan of every GPU node never reads as one cut short."""
    extended = [r for r, amount in pod.record.requests.items() if amount > 0 and is_extended_resource(r)]
    if not extended:
        return "", state.nodes
    offering = set(state.nodes_offering(extended[0]))
    for resource in extended[1:]:
        offering &= state.nodes_offering(resource)
    return " and ".join(extended), sorted(offering)
