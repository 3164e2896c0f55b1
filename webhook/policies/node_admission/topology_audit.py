"""``nodeAdmission`` in the audit, for the topology manager (issue 27 item 3): the pods the
kubelet's topology manager already rejected, by owner, and the nodes whose NodeResourceTopology
does not count the pods on them.

``TopologyRejectedPods``: Failed pods with ``TopologyAffinityError`` or ``SMTAlignmentError``
(both the topology manager's admit handler, ``GetAllocateResourcesPodAdmitHandler``), grouped
as the storm audit groups (the top controller). The storm audit counts the same pods among an
owner's rejections of every reason once they reach its threshold; this finding says why they
keep coming back (kube-scheduler cannot see NUMA zones) and what to do, and names the storm
finding when there is one: the same pods, two questions.

``StaleNodeResourceTopology``: the NRT publishes ``nodeTopologyPodsFingerprint`` and it is not
the fingerprint of the pods the guard knows bound on the node (``checks.topology.PodsSeen``,
the check's own test: where it fails, the check warns instead of refusing there). That is
upstream's definition of an NRT that does not reflect the node's pods (scheduler-plugins'
``overreserve`` cache resyncs on it, topology-admission-spec §6.4); an NRT's age is not shown
by any field, so no clock is guessed.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from ...checks.topology import PodsSeen
from ...kube.reasons import SMT_ALIGNMENT_ERROR, TOPOLOGY_AFFINITY_ERROR
from .. import Context, Finding, Mode, Subject
from ..storm_breaker import NAME as STORM_BREAKER
from ..storm_breaker.storms import StormGroup, cleanup_command, is_storm, storm_groups

if TYPE_CHECKING:
    from ...state.inventory import Inventory
    from ...state.model import ClusterState, Node, NodeUsage
    from . import TopologyConfig

TOPOLOGY_REJECTED = "TopologyRejectedPods"
STALE_TOPOLOGY = "StaleNodeResourceTopology"
# What the topology manager's admit handler fails a pod with (topology-admission-spec §1.2, §9).
TOPOLOGY_REASONS = (TOPOLOGY_AFFINITY_ERROR, SMT_ALIGNMENT_ERROR)
NODES_SHOWN = 5  # the nodes a finding names; the rest are counted


def topology_rejections(inventory: Inventory, context: Context, topology: TopologyConfig) -> list[Finding]:
    """One finding per owner (top controller; per namespace without one) with pods the topology
    manager rejected, outside the excluded namespaces."""
    config = context.config
    storms_reported = config.mode(STORM_BREAKER) != Mode.OFF
    findings = []
    for group in storm_groups(inventory, context.now):
        if group.namespace in config.excluded_namespaces:
            continue
        pods = [p for p in group.pods if p.reason in TOPOLOGY_REASONS]
        if not pods:
            continue
        storm = storms_reported and is_storm(group, config.policy(STORM_BREAKER), config)
        rejected = StormGroup(group.namespace, group.owner, pods)
        findings.append(_rejected(rejected, inventory.state, topology, storm))
    return findings


def _rejected(group: StormGroup, state: ClusterState, topology: TopologyConfig, storm: bool) -> Finding:
    owner = group.owner
    of = (
        f"of {owner.kind} {group.namespace}/{owner.name}"
        if owner
        else f"without a controller in {group.namespace}"
    )
    reasons = Counter(p.reason for p in group.pods)
    nodes = Counter(p.node or "<no node>" for p in group.pods)
    shown = "; ".join(
        f"{name} {n} ({_node_view(name, state, topology)})" for name, n in nodes.most_common(NODES_SHOWN)
    )
    more = f"; and {len(nodes) - NODES_SHOWN} more nodes" if len(nodes) > NODES_SHOWN else ""
    message = (
        f"{_pods(group.count)} {of} {'was' if group.count == 1 else 'were'} rejected by the kubelet's "
        f"topology manager and {'is' if group.count == 1 else 'are'} still present (Failed): reasons "
        f"{', '.join(f'{r} {n}' for r, n in reasons.most_common())}; nodes {shown}{more}. "
        "kube-scheduler cannot see NUMA zones: it counts a node's CPUs, memory and devices as one "
        "pool, so it sends each replacement back to a node whose zones cannot hold the pod. "
        "'admit-guard explain -f <the owner's manifest> --cluster <snapshot>' names the nodes where "
        "some zone set the node's policy accepts fits, with their zones; steer the pods there "
        "(nodeSelector, affinity, or scheduler-plugins' NodeResourceTopologyMatch), and with the "
        "guard's pods/binding webhook such binds are denied before the kubelet fails the pod."
        + (_SMT if SMT_ALIGNMENT_ERROR in reasons else "")
        + (f" The same pods are counted in this owner's {_STORM} finding." if storm else "")
        + f" Clean up: {cleanup_command(group)}"
    )
    return Finding(
        TOPOLOGY_REJECTED,
        message,
        node=nodes.most_common(1)[0][0] if len(nodes) == 1 else None,
        # More than one: the scheduler already sent a replacement back to a node that refused it.
        severity="high" if group.count > 1 else "medium",
        subject=Subject(
            group.namespace,
            owner.kind if owner else "Pod",
            owner.name if owner else "",
            owner.api_version if owner else "v1",
            owner.uid if owner else "",
        ),
        count=group.count,
    )


_STORM = "AdmissionStorm"
_SMT = (
    " SMTAlignmentError: the node's CPU manager runs with full-pcpus-only, so each Guaranteed "
    "container's whole CPUs must be a multiple of its threads per core."
)


def _node_view(name: str, state: ClusterState, topology: TopologyConfig) -> str:
    """What the guard's topology check knows of the node: whether it can predict the refusal."""
    node = state.nodes.get(name)
    if node is None:
        return "not in the state"
    seen = topology.for_node(node)
    if seen is None or seen.policy is None:
        return "no NodeResourceTopology with a policy: the guard cannot predict it there"
    return f"NRT policy {seen.policy}, scope {seen.effective_scope}"


def stale_topology(node: Node, usage: NodeUsage, topology: TopologyConfig) -> list[Finding]:
    """The node, when its NRT's pods fingerprint is not that of the pods the guard knows there."""
    seen_topology = topology.for_node(node)
    if seen_topology is None or not seen_topology.fingerprint:
        return []
    seen = PodsSeen(seen_topology, usage)
    if seen.fingerprint_matches() is not False:
        return []
    known = seen.known_pods()
    since = sum(1 for key in usage.unaccounted if (r := usage.pods.get(key)) is not None and r.key == key)
    lag = (
        f" {_pods(since)} {'was' if since == 1 else 'were'} bound since the NRT last changed: "
        "the exporter may just not have caught up; if the finding stays, it is stuck."
        if since
        else ""
    )
    return [
        Finding(
            STALE_TOPOLOGY,
            f"node {node.name}: its NodeResourceTopology's nodeTopologyPodsFingerprint "
            f"{seen_topology.fingerprint} is not the fingerprint of the {_pods(known)} the guard knows "
            f"bound there ({seen.known_fingerprint()}, method "
            f"{seen_topology.fingerprint_method or 'all'}): its per-zone available amounts do not "
            "count the same pods, so the guard only warns of TopologyAffinityError on this node (and "
            "scheduler-plugins' overreserve cache keeps its pessimistic view of it until they "
            f"match).{lag} Check the exporter on the node (nfd-topology-updater or "
            "resource-topology-exporter: running, its update interval, its pod fingerprint method).",
            node=node.name,
            severity="medium",
            subject=Subject("", "Node", node.name, "v1"),
            count=known,
        )
    ]


def _pods(n: int) -> str:
    return f"{n} pod" if n == 1 else f"{n} pods"
