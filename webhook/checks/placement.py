"""Where a pod could go: the kubelet's verdict on other nodes, as if the pod were bound there.

``explain`` asks it of every node; denial messages ask it of a bounded number of nodes (a
webhook must not scan a 5,000-node cluster per request), to name a few that would admit the
pod now, or to say none would.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ..state.model import ClusterState, Node
from .failure import Failure
from .kubelet import PodUnderReview, kubelet_admission

MESSAGE_SCAN = 32  # nodes examined for a denial message
MESSAGE_NAMES = 3  # nodes named in it


class SysctlAllowlists(Protocol):
    """Which unsafe sysctls each node's kubelet allows (``nodeAdmission``'s settings)."""

    def unsafe_sysctls_for(self, labels: Mapping[str, str]) -> tuple[str, ...]: ...


def unpinned(pod: PodUnderReview) -> PodUnderReview:
    """The pod with its own ``spec.nodeName`` set aside: the question is where it could go."""
    if "nodeName" not in pod.spec:
        return pod
    return PodUnderReview(pod.metadata, {k: v for k, v in pod.spec.items() if k != "nodeName"}, pod.record)


def verdict(
    pod: PodUnderReview, node: Node, state: ClusterState, config: SysctlAllowlists | None = None
) -> list[Failure]:
    """Every reason the kubelet on ``node`` would reject ``pod`` (empty: it would admit it)."""
    unsafe = config.unsafe_sysctls_for(node.labels) if config is not None else ()
    return kubelet_admission(pod, node, state.usage(node.name), unsafe)


@dataclass(frozen=True, slots=True)
class Candidates:
    """Up to ``MESSAGE_NAMES`` nodes that would admit the pod, from the nodes scanned."""

    admitting: tuple[str, ...]
    scanned: int
    total: int

    def sentence(self) -> str:
        if self.admitting:
            return f"Nodes that would admit it now: {', '.join(self.admitting)}."
        if self.scanned < self.total:
            return f"None of the first {self.scanned} of {self.total} nodes would admit it now."
        return f"None of the {self.total} nodes would admit it now."


def candidates(
    pod: PodUnderReview,
    state: ClusterState,
    *,
    skip: Iterable[str] = (),
    config: SysctlAllowlists | None = None,
) -> Candidates:
    """A few nodes that would admit ``pod``; stops at ``MESSAGE_NAMES`` found or
    ``MESSAGE_SCAN`` examined."""
    pod, skipped = unpinned(pod), set(skip)
    admitting: list[str] = []
    scanned = 0
    for name, node in state.nodes.items():
        if name in skipped:
            continue
        if scanned == MESSAGE_SCAN or len(admitting) == MESSAGE_NAMES:
            break
        scanned += 1
        if not verdict(pod, node, state, config):
            admitting.append(name)
    return Candidates(tuple(admitting), scanned, len(state.nodes) - len(skipped & state.nodes.keys()))
