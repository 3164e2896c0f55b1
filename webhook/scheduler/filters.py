"""The scheduler's view of one node: would kube-scheduler's filters let the pod go there?

The kubelet and the scheduler disagree on purpose in places. The kubelet ignores an extended
resource its node does not advertise (``removeMissingExtendedResources``: a cluster-level
resource); the scheduler's ``NodeResourcesFit`` counts it as zero allocatable, so a 2-GPU pod
never lands on a CPU-only node. The kubelet checks only ``NoExecute`` taints; the scheduler's
``TaintToleration`` also ``NoSchedule``, and ``NodeUnschedulable`` keeps cordoned nodes out. So
"where could it go" is answered here, and "node X would reject it" by the kubelet's checks.

The filters, from kube-scheduler's default plugins (``pkg/scheduler/framework/plugins``):
``nodeunschedulable``, ``tainttoleration``, ``nodeaffinity``, ``nodeports`` and
``noderesources/fit.go`` (``fitsRequest``), in the words of their status messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..checks.kubelet import PodUnderReview
from ..kube.ports import port_conflicts
from ..kube.resources import is_scalar_resource
from ..kube.selectors import matches_node_selector_and_affinity
from ..kube.tolerations import Taint, tolerates, untolerated_taint
from ..kube.workloads import PodShape
from ..state.model import Node, NodeUsage

# What the DaemonSet controller adds to every pod it creates (``util.AddOrUpdateDaemonPodTolerations``):
# its pods land on not-ready, unreachable, pressured and cordoned nodes all the same.
DAEMON_TOLERATIONS = tuple(
    {"key": f"node.kubernetes.io/{key}", "operator": "Exists", "effect": effect}
    for key, effect in (
        ("not-ready", "NoExecute"),
        ("unreachable", "NoExecute"),
        ("disk-pressure", "NoSchedule"),
        ("memory-pressure", "NoSchedule"),
        ("pid-pressure", "NoSchedule"),
        ("unschedulable", "NoSchedule"),
        ("network-unavailable", "NoSchedule"),
    )
)
SCHEDULING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
_UNSCHEDULABLE = Taint("node.kubernetes.io/unschedulable", "", "NoSchedule")
_NATIVE = ("cpu", "memory", "ephemeral-storage")

UNSCHEDULABLE = "node(s) were unschedulable"
AFFINITY = "node(s) didn't match Pod's node affinity/selector"
PORTS = "node(s) didn't have free ports for the requested pod ports"
TOO_MANY_PODS = "Too many pods"


def tolerations_of(shape: PodShape, spec: Mapping[str, Any] | None = None) -> list[Any]:
    """The tolerations the pods of ``shape`` will have: a DaemonSet's controller adds its own."""
    spec = shape.spec if spec is None else spec
    tolerations = spec.get("tolerations")
    tolerations = list(tolerations) if isinstance(tolerations, list) else []
    if shape.kind == "DaemonSet":
        tolerations += DAEMON_TOLERATIONS
    return tolerations


def placeable(spec: Mapping[str, Any], node: Node, tolerations: list[Any] | None = None) -> bool:
    """Whether the scheduler could ever place the pod on ``node``, whatever the node's load:
    not cordoned, every NoSchedule and NoExecute taint tolerated, nodeSelector and required node
    affinity matched. (A pod's nodes, for the questions "which pool can it reach?".)"""
    if tolerations is None:
        tolerations = spec.get("tolerations") if isinstance(spec.get("tolerations"), list) else []
    if node.unschedulable and not any(tolerates(t, _UNSCHEDULABLE) for t in tolerations):
        return False
    if untolerated_taint(node.taints, tolerations, SCHEDULING_EFFECTS) is not None:
        return False
    return matches_node_selector_and_affinity(spec, node.labels, node.name)


def scheduler_filters(
    pod: PodUnderReview, node: Node, usage: NodeUsage, tolerations: list[Any] | None = None
) -> list[str]:
    """Why kube-scheduler's filters would not place ``pod`` on ``node`` now (empty: they would),
    one status message per failing filter, in the scheduler's words and its plugin order."""
    usage = usage.without(pod.record.key)
    if tolerations is None:
        raw = pod.spec.get("tolerations")
        tolerations = raw if isinstance(raw, list) else []
    reasons = []
    if node.unschedulable and not any(tolerates(t, _UNSCHEDULABLE) for t in tolerations):
        reasons.append(UNSCHEDULABLE)
    taint = untolerated_taint(node.taints, tolerations, SCHEDULING_EFFECTS)
    if taint is not None:
        shown = f"{taint.key}: {taint.value}" if taint.value else taint.key
        reasons.append(f"node(s) had untolerated taint {{{shown}}}")
    if not matches_node_selector_and_affinity(pod.spec, node.labels, node.name):
        reasons.append(AFFINITY)
    if any(port_conflicts(p, usage.host_ports) for p in pod.record.host_ports):
        reasons.append(PORTS)
    reasons += insufficient(pod.record.requests, node.allocatable, usage)
    return reasons


def insufficient(requests: Mapping[str, int], allocatable: Mapping[str, int], usage: NodeUsage) -> list[str]:
    """``NodeResourcesFit``: every resource the node lacks, extended ones it does not advertise
    included (allocatable zero)."""
    reasons = []
    if usage.pod_count + 1 > allocatable.get("pods", 0):
        reasons.append(TOO_MANY_PODS)
    used = usage.requested
    scalars = sorted(name for name in requests if is_scalar_resource(name))
    for name in (*_NATIVE, *scalars):
        wanted = requests.get(name, 0)
        if wanted > 0 and wanted > allocatable.get(name, 0) - used.get(name, 0):
            reasons.append(f"Insufficient {name}")
    return reasons
