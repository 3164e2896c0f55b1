"""``deviceScheduler`` in the audit: nodes where one device resource is already held by pods of
more than one scheduler, or by scheduled pods and pods whose controller set nodeName itself,
or by pods other than its configured owner's, judged as a bind to the node is (``node_conflicts``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ...kube.quantity import format_amount
from .. import Finding, Subject
from .owners import BYPASS, REASON

if TYPE_CHECKING:
    from ...kube.rejection import Owner
    from ...state.inventory import Inventory
    from ...state.model import Node, NodeUsage
    from .settings import DeviceSchedulerConfig


def pinned_pods(inventory: Inventory) -> frozenset[str]:
    """Keys of the device-holding pods whose controller chain pins nodeName."""
    return frozenset(
        key for key, owner in inventory.device_pod_owners.items() if _pinned_by_controller(inventory, owner)
    )


def _pinned_by_controller(inventory: Inventory, owner: Owner | None) -> bool:
    seen: set[str] = set()
    while owner is not None and owner.uid not in seen:
        seen.add(owner.uid)
        workload = inventory.workload(owner)
        if workload is None:
            return False
        if workload.node_name:
            return True
        owner = workload.owner
    return False


def mixed(
    node: Node,
    usage: NodeUsage,
    held: Mapping[str, Mapping[str, int]],
    devices: DeviceSchedulerConfig,
    bypass: frozenset[str],
) -> list[Finding]:
    """The device resources of ``node`` whose holders race: one finding each.

    ``held``: the state's counts of the node's device holders per scheduler
    (``ClusterState.held_devices``); ``bypass``: keys of pods whose controller set nodeName
    (they count as their own holder)."""
    holders = _holders(usage, held, devices, bypass)
    findings = []
    for resource, counts in sorted(holders.items()):
        # Judged as a bind to this node is: the owner configured for the node's pool, else the
        # schedulers whose pods hold the device here.
        owner = devices.configured_owner(resource, node.labels)
        if len(counts) < 2 and (owner is None or owner in counts):
            continue
        allocatable = node.allocatable.get(resource, 0)
        used = usage.requested.get(resource, 0)
        fmt = lambda n, r=resource: format_amount(r, n)  # noqa: E731
        listing = ", ".join(
            f"{'pods that set spec.nodeName themselves' if h == BYPASS else h} ({_pods(n)})"
            for h, n in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        )
        advice = (
            f"its configured owner on this node is {owner}: move the other pods to it"
            if owner
            else "give it one owner per node pool (policies.deviceScheduler.owners: "
            f"[{{resource: {resource}, scheduler: SCHEDULER, nodeSelector: {{matchLabels: POOL}}}}])"
        )
        findings.append(
            Finding(
                REASON,
                f"node {node.name}: {resource} is held by {listing}; {fmt(used)} of {fmt(allocatable)} "
                f"allocated. Each keeps its own count of free devices, so two can bind the last one and "
                f"the kubelet fails the second pod with UnexpectedAdmissionError; {advice}.",
                node=node.name,
                severity="high" if used >= allocatable else "medium",
                subject=Subject("", "Node", node.name, "v1"),
                resource=resource,
                count=sum(counts.values()),
            )
        )
    return findings


def _holders(
    usage: NodeUsage,
    held: Mapping[str, Mapping[str, int]],
    devices: DeviceSchedulerConfig,
    bypass: frozenset[str],
) -> dict[str, Counter[str]]:
    """Who holds each device resource on the node. The state's counts leave the pods' records
    untouched: the server audits in its master, whose state the workers share copy-on-write,
    and reading every record there (a reference count bumped) copied it into every worker. Only
    pods whose controller set nodeName (``bypass``, known where the workloads were read:
    ``admit-guard audit``) need a scan of the node's pods, to count as their own holder."""
    if not bypass:
        return {resource: Counter(counts) for resource, counts in held.items() if devices.is_device(resource)}
    holders: dict[str, Counter[str]] = {}
    for key, record in usage.pods.items():
        for resource in record.devices:
            if devices.is_device(resource):
                holder = BYPASS if key in bypass else record.scheduler
                holders.setdefault(resource, Counter())[holder] += 1
    return holders


def _pods(n: int) -> str:
    return f"{n} pod" if n == 1 else f"{n} pods"
