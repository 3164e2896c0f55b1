"""The audit: what in a cluster already breaks the guard's rules, and where storms left damage.

Pure: an ``Inventory`` (or a bare ``ClusterState``), the config and the current time come in,
findings come out. The checks are the engine's own (``pinnedNodeName``'s message and the
kubelet's admission for the node), so an audit finding and a denial say the same thing.

Four finding types, each one small function:

- ``PinnedNodeName``: a top-level workload whose template pins ``nodeName``, with the kubelet's
  verdict on that node for one more pod;
- ``AdmissionStorm``: Failed pods the kubelet rejected at admission, grouped by their
  controller resolved to the top (Pod → ReplicaSet → Deployment, Pod → Job → CronJob);
  groups below the storm breaker's threshold are not storms;
- ``MixedDeviceScheduler``: nodes where one device resource is held by pods of more than one
  scheduler, or by scheduled pods and pods whose controller set nodeName itself;
- ``Overcommitted``: nodes whose active pods request more of a resource than is allocatable;
- ``DeviceAlreadyAllocated``, ``DeviceCapacityExceeded``, ``DeviceCountersExceeded``: DRA devices
  already handed out twice, or their capacity or a counter set over its limit, judged by the
  same rules as an allocation write (each allocated claim against all the others).
"""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .checks import kubelet_admission
from .config import Config, StormBreakerConfig
from .dra.judge import (
    ALREADY_ALLOCATED,
    CAPACITY_EXCEEDED,
    COUNTERS_EXCEEDED,
    judge_allocation,
)
from .kube.quantity import format_amount
from .kube.rejection import Owner
from .kube.resources import is_extended_resource
from .kube.timestamps import format_rfc3339, object_time
from .policies import Review, device_scheduler, pinned_node_name
from .state.inventory import Inventory, PinnedTemplate, RejectedPod, Workload
from .state.model import ClusterState

PINNED = "PinnedNodeName"
STORM = "AdmissionStorm"
MIXED = "MixedDeviceScheduler"
OVERCOMMITTED = "Overcommitted"
DEVICE_TYPES = (ALREADY_ALLOCATED, CAPACITY_EXCEEDED, COUNTERS_EXCEEDED)
TYPES = (STORM, PINNED, MIXED, OVERCOMMITTED, *DEVICE_TYPES)
# The policy each type belongs to: a policy in mode ``off`` is not audited either.
POLICY_OF = {
    PINNED: "pinnedNodeName",
    STORM: "stormBreaker",
    MIXED: "deviceScheduler",
    OVERCOMMITTED: "nodeAdmission",
    **dict.fromkeys(DEVICE_TYPES, "deviceAllocation"),
}
# The PolicyReport CRD's severities (wgpolicyk8s.io/v1alpha2 knows only these three).
SEVERITIES = ("high", "medium", "low")
DEFAULT_STORM_THRESHOLD = StormBreakerConfig().threshold
BYPASS = "spec.nodeName"  # the holder name of pods whose controller pinned the node


@dataclass(frozen=True, slots=True)
class Finding:
    type: str
    severity: str
    namespace: str
    kind: str
    name: str
    message: str
    node: str = ""
    resource: str = ""
    count: int = 0
    api_version: str = ""
    uid: str = ""

    def as_json(self) -> dict[str, Any]:
        """The contract's keys, exactly."""
        return {
            "type": self.type,
            "severity": self.severity,
            "namespace": self.namespace,
            "kind": self.kind,
            "name": self.name,
            "node": self.node,
            "resource": self.resource,
            "count": self.count,
            "message": self.message,
        }


@dataclass(slots=True)
class Report:
    findings: list[Finding]
    scanned: dict[str, int] = field(default_factory=dict)
    storm_threshold: int = DEFAULT_STORM_THRESHOLD
    # Finding types the input could not show (no workloads, no Failed pods): type -> why.
    not_judged: dict[str, str] = field(default_factory=dict)
    judged_at: float | None = None

    @property
    def summary(self) -> dict[str, Any]:
        return {
            "findings": len(self.findings),
            "byType": {t: sum(f.type == t for f in self.findings) for t in TYPES},
            "bySeverity": {s: sum(f.severity == s for f in self.findings) for s in SEVERITIES},
            "scanned": self.scanned,
            "stormThreshold": self.storm_threshold,
            "notJudged": self.not_judged,
            "judgedAt": format_rfc3339(self.judged_at) if self.judged_at is not None else None,
        }

    def as_json(self) -> dict[str, Any]:
        return {"findings": [f.as_json() for f in self.findings], "summary": self.summary}


def storm_settings(config: Config) -> StormBreakerConfig:
    """The storm breaker's settings: the audit calls a storm what would trip the breaker."""
    return config.storm_breaker


def audited(config: Config, finding_type: str) -> bool:
    policy = POLICY_OF[finding_type]
    mode = storm_settings(config).mode if policy == "stormBreaker" else config.mode(policy)
    return mode != "off"


def run_audit(inventory: Inventory, config: Config, now: float) -> Report:
    """Every finding in the inventory, worst first."""
    state = inventory.state
    settings = storm_settings(config)
    findings: list[Finding] = []
    if audited(config, PINNED):
        findings += pinned_findings(inventory, config)
    if audited(config, STORM):
        findings += storm_findings(storm_groups(inventory, now), settings, now, config)
    findings += node_findings(state, config, state.nodes, pinned_pods(inventory))
    findings += device_findings(state, config)
    scanned = {
        "nodes": len(state.nodes),
        "pods": inventory.pods_read,
        "workloads": len(inventory.workloads),
        "rejectedPods": len(inventory.rejected),
    }
    report = Report(worst_first(findings), scanned, settings.threshold, judged_at=now)
    report.not_judged = {t: why for t, why in unjudged(inventory).items() if audited(config, t)}
    return report


WORKLOAD_LIST = "deployments,replicasets,statefulsets,daemonsets,jobs,cronjobs,replicationcontrollers"


def unjudged(inventory: Inventory) -> dict[str, str]:
    """The finding types whose input the inventory lacks, and what to add: "no findings" of a
    type the audit could not see is not a clean bill."""
    missing = {}
    facts = inventory.facts
    if not inventory.workloads:
        missing[PINNED] = f"no workloads were read: add {WORKLOAD_LIST} to the kubectl get"
    if not facts.failed_pods and not inventory.rejected:
        missing[STORM] = (
            "no Failed pods were read: a storm leaves them behind (none in the cluster, or the "
            "snapshot left them out)"
        )
    if not inventory.pods_read:
        why = "no pods were read: take nodes and pods together ('kubectl get nodes,pods -A')"
        missing[MIXED] = missing[OVERCOMMITTED] = why
    devices = inventory.state.devices
    if not inventory.claims_listed and (devices is None or not devices.claim_keys()):
        why = (
            "no ResourceClaims were read: add resourceslices,resourceclaims,deviceclasses to the "
            "kubectl get (none in the cluster, or the snapshot left them out)"
        )
        missing.update(dict.fromkeys(DEVICE_TYPES, why))
    return missing


def worst_first(findings: Iterable[Finding]) -> list[Finding]:
    return sorted(
        findings,
        key=lambda f: (
            SEVERITIES.index(f.severity),
            -f.count,
            TYPES.index(f.type),
            f.namespace,
            f.name,
            f.resource,
        ),
    )


# -- PinnedNodeName -------------------------------------------------------------------------


def pinned_findings(inventory: Inventory, config: Config) -> list[Finding]:
    """Top-level workloads that pin nodeName, one finding per pinned template; a ReplicaSet of a
    known Deployment is reported through its Deployment (same template), not twice."""
    findings = []
    for workload in inventory.workloads:
        if not workload.pinned or workload.namespace in config.excluded_namespaces:
            continue
        if workload.owner is not None and inventory.workload(workload.owner) is not None:
            continue
        findings += [_pinned(workload, template, inventory.state, config) for template in workload.pinned]
    return findings


def _pinned(workload: Workload, template: PinnedTemplate, state: ClusterState, config: Config) -> Finding:
    """The server's message for the template, the nodes it suggests judged as the server's."""
    review = Review(
        template.obj,
        template.shape,
        template.pod,
        "CREATE",
        template=template.where,
        scheduler_default=template.scheduler,
    )
    owners = config.policy(device_scheduler.NAME)
    [policy_finding] = pinned_node_name.findings(review, state, config.node_admission, owners)
    node_name = str(template.shape.spec.get("nodeName"))
    node = state.nodes.get(node_name)
    rejects = node is None or bool(
        kubelet_admission(template.pod, node, state.usage(node.name), config.node_admission.kubelet_for(node))
    )
    count = workload.replicas
    if template.where:  # a custom resource: the replicas beside this template
        count = pinned_node_name.replicas(template.obj, template.shape.path) or 1
    return Finding(
        PINNED,
        "high" if rejects else "medium",
        workload.namespace,
        workload.kind,
        workload.name,
        policy_finding.message,
        node=node_name,
        count=count,
        api_version=workload.api_version,
        uid=workload.uid,
    )


# -- AdmissionStorm -------------------------------------------------------------------------


@dataclass(slots=True)
class StormGroup:
    """The rejected pods of one top-level controller (or of no controller, per namespace)."""

    namespace: str
    owner: Owner | None
    pods: list[RejectedPod] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.pods)


def storm_groups(inventory: Inventory, now: float | None = None) -> list[StormGroup]:
    """Rejected pods grouped by owner resolved to the top-level controller where known. A pod
    created after ``now`` (``--now`` before the snapshot was taken) had not been rejected yet."""
    groups: dict[tuple[str, str], StormGroup] = {}
    resolved: dict[str, Owner] = {}
    for pod in inventory.rejected:
        created = object_time(pod.created)
        if now is not None and created is not None and created > now:
            continue
        owner = pod.owner
        if owner is not None:
            if owner.uid not in resolved:
                resolved[owner.uid] = inventory.top_controller(owner)
            owner = resolved[owner.uid]
        key = (pod.namespace, owner.uid if owner else "")
        group = groups.get(key)
        if group is None:
            group = groups[key] = StormGroup(pod.namespace, owner)
        group.pods.append(pod)
    return list(groups.values())


def storm_findings(
    groups: Iterable[StormGroup], settings: StormBreakerConfig, now: float, config: Config
) -> list[Finding]:
    return [
        _storm(group, settings, now)
        for group in groups
        if group.count >= settings.threshold and group.namespace not in config.excluded_namespaces
    ]


def _storm(group: StormGroup, settings: StormBreakerConfig, now: float) -> Finding:
    owner = group.owner
    one = group.count == 1
    subject = (
        f"{_pods(group.count)} of {owner.kind} {group.namespace}/{owner.name}"
        if owner
        else f"{_pods(group.count)} without a controller in namespace {group.namespace}"
    )
    reasons = Counter(p.reason for p in group.pods)
    nodes = Counter(p.node or "<no node>" for p in group.pods)
    times = sorted(t for t in (object_time(p.created) for p in group.pods) if t is not None)
    when, running = _storm_timing(times, group.count, settings, now)
    message = (
        f"{subject} {'was' if one else 'were'} rejected by the kubelet at admission and "
        f"{'is' if one else 'are'} still present (Failed): reasons {_top(reasons)}; "
        f"nodes {_top(nodes)}; {when} "
        f"{_RUNNING if running else _OVER} "
        f"Clean up: {cleanup_command(group)}"
    )
    return Finding(
        STORM,
        "high" if running else "medium",
        group.namespace,
        owner.kind if owner else "Pod",
        owner.name if owner else "",
        message,
        node=nodes.most_common(1)[0][0] if len(nodes) == 1 else "",
        count=group.count,
        api_version=owner.api_version if owner else "v1",
        uid=owner.uid if owner else "",
    )


_RUNNING = "The storm is likely still running."
_OVER = "The storm is over, but its Failed pods still hold etcd space and slow every pod list."


def _storm_timing(
    times: list[float], count: int, settings: StormBreakerConfig, now: float
) -> tuple[str, bool]:
    if not times:
        return "creation times unknown.", False
    first, last = times[0], times[-1]
    span = last - first
    rate = f"{count / (span / 60):.1f} pods/min" if span > 0 else "all at once"
    text = f"first {format_rfc3339(first)}, last {format_rfc3339(last)} ({rate})."
    return text, now - last <= settings.window_seconds


# Up to this many rejected pods, the cleanup command names them: it deletes exactly the pods
# counted. Above it, a selector keeps the message bounded and says what else it deletes.
CLEANUP_NAMES_LIMIT = 20


def cleanup_command(group: StormGroup) -> str:
    """A command deleting this group's rejected pods, and, when it can delete more, what.

    A selector cannot tell a pod the kubelet rejected from one that failed after running (pod
    field selectors know ``status.phase``, not ``status.reason``), so only a list of names is
    exact; a selector is used when the names would not fit in a message, and says so.
    """
    namespace = shlex.quote(group.namespace)
    if group.count <= CLEANUP_NAMES_LIMIT:
        names = " ".join(shlex.quote(p.name) for p in group.pods)
        return f"kubectl delete pods -n {namespace} {names}"
    common = set(group.pods[0].labels)
    for pod in group.pods[1:]:
        common.intersection_update(pod.labels)
    failed = "--field-selector=status.phase=Failed"
    if not common:
        return (
            f"kubectl delete pods -n {namespace} {failed} (no label is shared by all "
            f"{group.count} rejected pods: it deletes every Failed pod in namespace "
            f"{group.namespace}, whatever made it fail, not only the {group.count} the kubelet "
            f"rejected)"
        )
    selector = ",".join(f"{k}={v}" for k, v in sorted(common))
    return (
        f"kubectl delete pods -n {namespace} {failed} -l {shlex.quote(selector)} (it deletes "
        f"every Failed pod in namespace {group.namespace} with these labels, whatever made it "
        f"fail, not only the {group.count} the kubelet rejected)"
    )


def _top(counts: Counter[str], limit: int = 5) -> str:
    shown = ", ".join(f"{name} {n}" for name, n in counts.most_common(limit))
    more = len(counts) - limit
    return shown + (f" and {more} more" if more > 0 else "")


# -- node findings: MixedDeviceScheduler and Overcommitted ----------------------------------


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


def node_findings(
    state: ClusterState, config: Config, names: Iterable[str], bypass: frozenset[str] = frozenset()
) -> list[Finding]:
    """MixedDeviceScheduler and Overcommitted on the named nodes (a chunk, or all of them).

    ``bypass``: keys of pods whose controller set nodeName (they count as their own holder).
    """
    mixed, overcommitted = audited(config, MIXED), audited(config, OVERCOMMITTED)
    findings: list[Finding] = []
    for name in names:
        node = state.nodes.get(name)
        usage = state.usage(name)
        if node is None or not usage.pods:
            continue
        if mixed:
            findings += _mixed(node, usage, config, bypass)
        if overcommitted:
            findings += _overcommitted(node, usage)
    return findings


def _mixed(node, usage, config: Config, bypass: frozenset[str]) -> list[Finding]:
    devices = config.device_scheduler
    holders: dict[str, Counter[str]] = {}
    for key, record in usage.pods.items():
        for resource in record.devices:
            if devices.is_device(resource):
                holder = BYPASS if key in bypass else record.scheduler
                holders.setdefault(resource, Counter())[holder] += 1
    findings = []
    for resource, counts in sorted(holders.items()):
        # Judged as a bind to this node is (deviceScheduler.node_conflicts): the owner configured
        # for the node's pool, else the schedulers whose pods hold the device here.
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
                MIXED,
                "high" if used >= allocatable else "medium",
                "",
                "Node",
                node.name,
                f"node {node.name}: {resource} is held by {listing}; {fmt(used)} of {fmt(allocatable)} "
                f"allocated. Each keeps its own count of free devices, so two can bind the last one and "
                f"the kubelet fails the second pod with UnexpectedAdmissionError; {advice}.",
                node=node.name,
                resource=resource,
                count=sum(counts.values()),
                api_version="v1",
            )
        )
    return findings


# -- DRA devices handed out twice ------------------------------------------------------------


def device_findings(state: ClusterState, config: Config) -> list[Finding]:
    """Devices (and their capacity and counters) more claims hold than they may, one finding
    per device and reason, naming every claim involved and the pods they are reserved for."""
    if state.devices is None or not audited(config, ALREADY_ALLOCATED):
        return []
    groups = device_groups(state, state.devices.claims())
    return device_report(groups, state)


DeviceGroups = dict[tuple[str, str], dict[str, Any]]


def device_groups(state: ClusterState, keys: Iterable[str], into: DeviceGroups | None = None) -> DeviceGroups:
    """The claims over a limit, by (reason, device), for the allocated claims named by ``keys``
    (a chunk, or all of them)."""
    groups = into if into is not None else {}
    for key in keys:
        allocation = state.devices.claim(key)
        for found in judge_allocation(allocation, state.devices) if allocation is not None else ():
            if found.reason in DEVICE_TYPES:
                claims = groups.setdefault((found.reason, found.device), {})
                for ref in (allocation.claim, *found.holders):
                    claims[str(ref)] = ref
    return groups


def device_report(groups: DeviceGroups, state: ClusterState) -> list[Finding]:
    return [
        _device(reason, device, list(claims.values()), state) for (reason, device), claims in groups.items()
    ]


def _device(reason: str, device: str, claims: list, state: ClusterState) -> Finding:
    def users(ref) -> str:
        held = state.devices.claim(ref.key)
        pods = [r.name for r in held.reserved_for] if held is not None else []
        return f"{ref} (pods {', '.join(pods)})" if pods else f"{ref} (no pod yet)"

    what = {
        ALREADY_ALLOCATED: "is allocated to more claims than it allows",
        CAPACITY_EXCEEDED: "has more of its capacity allocated than it has",
        COUNTERS_EXCEEDED: "consumes more of its pool's shared counters than there are",
    }[reason]
    first = min(claims, key=str)
    return Finding(
        type=reason,
        severity="high",
        namespace=first.namespace,
        kind="ResourceClaim",
        name=first.name,
        message=(
            f"{device} {what}: {'; '.join(users(c) for c in sorted(claims, key=str))}. The DRA driver "
            "fails the later pods' prepare (FailedPrepareDynamicResources) or hands one device to two "
            "pods; delete the pods of all but one claim so the scheduler allocates them again."
        ),
        resource=device,
        count=len(claims),
        api_version="resource.k8s.io/v1",
        uid=first.uid,
    )


def _pods(n: int) -> str:
    return f"{n} pod" if n == 1 else f"{n} pods"


def _overcommitted(node, usage) -> list[Finding]:
    requested: Mapping[str, int] = {**usage.requested, "pods": usage.pod_count}
    findings = []
    for resource, amount in sorted(requested.items()):
        if is_extended_resource(resource) and resource not in node.allocatable:
            continue  # the kubelet ignores extended resources a node does not report
        allocatable = node.allocatable.get(resource, 0)
        if amount <= allocatable:
            continue
        holders = (
            usage.pod_count
            if resource == "pods"
            else sum(1 for r in usage.pods.values() if r.requests.get(resource, 0) > 0)
        )
        fmt = lambda n, r=resource: format_amount(r, n)  # noqa: E731
        device = resource == "pods" or is_extended_resource(resource)
        findings.append(
            Finding(
                OVERCOMMITTED,
                "high" if device else "medium",
                "",
                "Node",
                node.name,
                f"node {node.name}: active pods request {fmt(amount)} {resource}, but only "
                f"{fmt(allocatable)} is allocatable; the kubelet rejects every new pod that asks for "
                f"{resource} (OutOf{resource}) until some leave. Allocatable shrank under running pods "
                f"(a device lost, reservations raised) or pods bypassed the scheduler.",
                node=node.name,
                resource=resource,
                count=holders,
                api_version="v1",
            )
        )
    return findings


# -- PolicyReports --------------------------------------------------------------------------

REPORT_NAME = "admit-guard-audit"
SOURCE = "admit-guard"


def policy_reports(report: Report, now: float) -> list[dict[str, Any]]:
    """``wgpolicyk8s.io/v1alpha2``: a PolicyReport per namespace, a ClusterPolicyReport for nodes.

    The ClusterPolicyReport is always there, empty (summary all zero) on a clean cluster, so that
    applying the output replaces an earlier run's results. An empty PolicyReport cannot be given
    for every namespace that had findings before: the audit does not know them.
    """
    by_namespace: dict[str, list[Finding]] = {"": []}
    for finding in report.findings:
        by_namespace.setdefault(finding.namespace, []).append(finding)
    reports = []
    for namespace in sorted(by_namespace):
        results = [_result(f, now) for f in by_namespace[namespace]]
        metadata: dict[str, Any] = {
            "name": REPORT_NAME,
            "labels": {"app.kubernetes.io/managed-by": SOURCE},
        }
        kind = "ClusterPolicyReport"
        if namespace:
            metadata["namespace"] = namespace
            kind = "PolicyReport"
        reports.append(
            {
                "apiVersion": "wgpolicyk8s.io/v1alpha2",
                "kind": kind,
                "metadata": metadata,
                "summary": {
                    "pass": 0,
                    "fail": sum(r["result"] == "fail" for r in results),
                    "warn": sum(r["result"] == "warn" for r in results),
                    "error": 0,
                    "skip": 0,
                },
                "results": results,
            }
        )
    return reports


def _result(finding: Finding, now: float) -> dict[str, Any]:
    resource: dict[str, Any] = {"apiVersion": finding.api_version, "kind": finding.kind, "name": finding.name}
    if finding.namespace:
        resource["namespace"] = finding.namespace
    if finding.uid:
        resource["uid"] = finding.uid
    properties = {"node": finding.node, "resource": finding.resource, "count": str(finding.count)}
    return {
        "source": SOURCE,
        "policy": POLICY_OF[finding.type],
        "rule": finding.type,
        "category": "admit-guard audit",
        "result": "fail" if finding.severity == "high" else "warn",
        "severity": finding.severity,
        "scored": True,
        "message": finding.message,
        "resources": [resource] if finding.name else [],
        "properties": {k: v for k, v in properties.items() if v},
        "timestamp": {"seconds": int(now), "nanos": 0},
    }
