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

This module is the policy (its name, settings and hooks); ``settings.py`` reads its config,
``owners.py`` says who owns a device on a node, ``objects.py`` judges pods and templates and
``mixed.py`` the nodes where schedulers already mix (the audit).
"""

from __future__ import annotations

from collections.abc import Callable
from fnmatch import fnmatchcase

from ...checks import PodUnderReview
from ...state.model import PODS, Node
from .. import (
    NO_CLUSTER_STATE,
    POD_FIELDS,
    Allocation,
    AuditScope,
    Bind,
    Context,
    Finding,
    Review,
    template_subject,
)
from . import objects
from .mixed import mixed, pinned_pods
from .owners import REASON, bind_message, node_conflicts, owned_by_others
from .settings import DEFAULT_DEVICE_PATTERNS, MODES, DeviceSchedulerConfig, OwnerRule, read_settings

__all__ = [
    "DEFAULT_DEVICE_PATTERNS",
    "MODES",
    "DeviceSchedulerConfig",
    "OwnerRule",
    "owned_by_others",
    "read_settings",
]

NAME = "deviceScheduler"
REASONS = (REASON,)
READS = POD_FIELDS
STATIC = None  # owners can be detected from the pods on nodes: no static form
Settings = DeviceSchedulerConfig
AUDITS = (REASON,)
AUDIT_READS = PODS


def check(review: Review, context: Context) -> list[Finding]:
    return objects.check(review, context.config.policy(NAME), context.state)


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


def audit(scope: AuditScope, context: Context) -> list[Finding]:
    """Nodes where pods of more than one scheduler (or pods whose controller set nodeName) hold
    one device resource, or where they are not its configured owner's."""
    state = scope.inventory.state
    settings = context.config.policy(NAME)
    bypass = pinned_pods(scope.inventory)
    findings: list[Finding] = []
    for name in scope.node_names():
        node = state.nodes.get(name)
        usage = state.usage(name)
        if node is not None and usage.pods:
            findings += mixed(node, usage, state.held_devices(name), settings, bypass)
    return findings


def check_stateless(review: Review, context: Context) -> list[Finding]:
    """Without cluster state, devices with no configured owner cannot be checked: owners are
    detected from the pods on the nodes. Only configured owners count without autodetect, and
    a pod that names its device by annotation names its owner too."""
    settings = context.config.policy(NAME)
    annotations = review.shape.metadata.get("annotations") or {}
    if not settings.autodetect or any(key in annotations for key, _ in settings.annotations):
        return []
    unowned = sorted(
        resource
        for resource, amount in review.pod.record.requests.items()
        if amount > 0 and settings.is_device(resource) and settings.configured_owner(resource) is None
    )
    if not unowned:
        return []
    message = (
        f"{template_subject(review)} asks for {', '.join(unowned)} with schedulerName "
        f"{review.scheduler!r}, but no owner is configured for it and no cluster state was given to "
        "detect one, so device ownership was not checked (give --cluster, or set "
        "policies.deviceScheduler.owners)."
    )
    return [Finding(NO_CLUSTER_STATE, message, advisory=True)]


EXPLAIN_WORDS = {REASON: "devices owned by another scheduler"}  # explain's summary


def explain(pod: PodUnderReview, scheduler: str, context: Context) -> Callable[[Node], tuple[str, ...]]:
    """``explain``'s word on a node the scheduler could pick: a bind of the pod there would race
    another scheduler for its devices, and the guard refuses it."""
    owners = owned_by_others(pod.record.requests, scheduler, context.state, context.config.policy(NAME))

    def refusals(node: Node) -> tuple[str, ...]:
        conflicts = owners(node) if owners is not None else []
        return tuple(
            f"{REASON}: {c.device} on {node.name} is handed out by {', '.join(c.others(scheduler))}"
            for c in conflicts
        )

    return refusals
