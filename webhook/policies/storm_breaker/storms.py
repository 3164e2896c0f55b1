"""``stormBreaker`` in the audit: the Failed pods the kubelet rejected at admission, grouped by
their controller resolved to the top (Pod → ReplicaSet → Deployment, Pod → Job → CronJob); a
group the breaker would not have called a storm (below its threshold) is not reported."""

from __future__ import annotations

import shlex
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...kube.rejection import Owner
from ...kube.timestamps import format_rfc3339, object_time
from .. import Finding, Subject
from .settings import REASON, StormBreakerConfig

if TYPE_CHECKING:
    from ...config import Config
    from ...state.inventory import Inventory, RejectedPod


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
    """The groups the breaker would have called a storm, outside the excluded namespaces."""
    return [_storm(group, settings, now) for group in groups if is_storm(group, settings, config)]


def is_storm(group: StormGroup, settings: StormBreakerConfig, config: Config) -> bool:
    """Whether the storm audit reports ``group``: as many pods as the breaker's threshold,
    outside the excluded namespaces (other audits say when they count the same pods)."""
    return group.count >= settings.threshold and group.namespace not in config.excluded_namespaces


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
    subject = Subject(
        group.namespace,
        owner.kind if owner else "Pod",
        owner.name if owner else "",
        owner.api_version if owner else "v1",
        owner.uid if owner else "",
    )
    return Finding(
        REASON,
        message,
        node=nodes.most_common(1)[0][0] if len(nodes) == 1 else None,
        severity="high" if running else "medium",
        subject=subject,
        count=group.count,
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


def _pods(n: int) -> str:
    return f"{n} pod" if n == 1 else f"{n} pods"
