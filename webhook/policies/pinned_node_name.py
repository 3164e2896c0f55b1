"""``pinnedNodeName``: workload templates must not set ``spec.nodeName``.

Pods that carry a nodeName skip the scheduler; when the kubelet rejects them the controller
makes new ones at once. The fix pins the node through required node affinity instead, which
the scheduler honours, so pods wait as Pending rather than fail in a loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..checks import kubelet_admission
from ..kube.errors import FieldError
from ..kube.selectors import is_empty_term
from ..kube.workloads import display_path
from ..scheduler.placement import verdict
from ..state.model import WORKLOADS
from . import (
    ALL_MODES,
    POD_SHAPE,
    AuditScope,
    Context,
    Finding,
    Mode,
    Patch,
    Review,
    StaticPolicy,
    Subject,
    device_scheduler,
    read_mode,
)
from .node_admission import fits_elsewhere

if TYPE_CHECKING:
    from ..config import Config
    from ..formats.reader import Reader
    from ..state import ClusterState
    from ..state.inventory import PinnedTemplate, Workload
    from .device_scheduler import DeviceSchedulerConfig
    from .node_admission import NodeAdmissionConfig

NAME = "pinnedNodeName"
REASON = "PinnedNodeName"
REASONS = (REASON,)
MODES = ALL_MODES
# It judges the template's nodeName alone, so an unreadable request elsewhere in the pod
# cannot make it fail open.
READS = POD_SHAPE
AUDITS = (REASON,)
AUDIT_READS = WORKLOADS


@dataclass(frozen=True, slots=True)
class PinnedNodeNameConfig:
    mode: Mode = Mode.ENFORCE


Settings = PinnedNodeNameConfig


def read_settings(reader: Reader, data: Any, where: str) -> PinnedNodeNameConfig:
    data = reader.mapping(data, where, {"mode"})
    return PinnedNodeNameConfig(mode=read_mode(reader, data, where, MODES))


def check(review: Review, context: Context) -> list[Finding]:
    """Node capacity in the message is judged with ``nodeAdmission``'s sysctl allowlists; the
    nodes it suggests are never ones another scheduler owns (``deviceScheduler``)."""
    owners = context.config.policy(device_scheduler.NAME)
    return findings(review, context.state, context.config.node_admission, owners)


def findings(
    review: Review,
    state: ClusterState | None,
    node_config: NodeAdmissionConfig | None = None,
    owners: DeviceSchedulerConfig | None = None,
) -> list[Finding]:
    """The finding for a pinned template; ``audit`` asks it with its config too."""
    shape = review.shape
    node = shape.spec.get("nodeName")
    if not shape.is_template or not node:
        return []
    if review.old_shape is not None and review.old_shape.spec.get("nodeName") == node:
        # Existing objects must stay updatable (finalizers, labels, scale); a scale-up onto a
        # node that would reject the new pods is said, not refused.
        return scaled_up(review, state, node, node_config)
    verdict_now = _kubelet_verdict(review, state, node, node_config, owners)
    message = (
        f"{review.description} sets {_field(shape)} to {node!r}: its pods skip the scheduler, "
        f"and every pod the kubelet rejects is replaced at once. {verdict_now} "
        f"Pin the node with required node affinity on metadata.name or a nodeSelector on "
        f"kubernetes.io/hostname instead (mode fix rewrites it)."
    )
    try:
        fix = node_affinity_patch(shape.path, shape.spec, node)
    except FieldError as err:
        return [Finding(REASON, f"{message} (Not fixed automatically: {err}.)", node=node)]
    return [Finding(REASON, message, node=node, fix=fix)]


def audit(scope: AuditScope, context: Context) -> list[Finding]:
    """Top-level workloads that pin nodeName, one finding per pinned template; a ReplicaSet of a
    known Deployment is reported through its Deployment (same template), not twice."""
    inventory, config = scope.inventory, context.config
    found = []
    for workload in inventory.workloads:
        if not workload.pinned or workload.namespace in config.excluded_namespaces:
            continue
        if workload.owner is not None and inventory.workload(workload.owner) is not None:
            continue
        found += [_audited(workload, template, inventory.state, config) for template in workload.pinned]
    return found


def _audited(workload: Workload, template: PinnedTemplate, state: ClusterState, config: Config) -> Finding:
    """The server's message for the template; high when the kubelet would reject one more pod."""
    review = Review(
        template.obj,
        template.shape,
        template.pod,
        "CREATE",
        template=template.where,
        scheduler_default=template.scheduler,
    )
    owners = config.policy(device_scheduler.NAME)
    [finding] = findings(review, state, config.node_admission, owners)
    node_name = str(template.shape.spec.get("nodeName"))
    node = state.nodes.get(node_name)
    rejects = node is None or bool(
        kubelet_admission(template.pod, node, state.usage(node.name), config.node_admission.kubelet_for(node))
    )
    count = workload.replicas
    if template.where:  # a custom resource: the replicas beside this template
        count = replicas(template.obj, template.shape.path) or 1
    subject = Subject(workload.namespace, workload.kind, workload.name, workload.api_version, workload.uid)
    severity = "high" if rejects else "medium"
    return dataclasses.replace(
        finding, fix=None, node=node_name, severity=severity, subject=subject, count=count
    )


# New pods tried one by one on the node's usage; beyond this many, the rest are not simulated.
SCALE_SIMULATED = 1024


def scaled_up(
    review: Review, state: ClusterState | None, node_name: str, node_config: NodeAdmissionConfig | None
) -> list[Finding]:
    """An UPDATE that adds pods to a template already pinned to ``node_name``: a warning when
    the node's kubelet would reject some of the new pods (each is replaced at once)."""
    before = replicas(review.old_obj, review.old_shape.path) if review.old_obj is not None else None
    after = replicas(review.obj, review.shape.path)
    if before is None or after is None or after <= before or state is None or review.pod is None:
        return []
    added = after - before
    scaling = (
        f"{review.description} scales from {before} to {after} pods pinned to {node_name} "
        f"({_field(review.shape)})"
    )
    node = state.nodes.get(node_name)
    if node is None:
        message = f"{scaling}, a node not in the cluster state: no kubelet will run the {added} new pods."
        return [Finding(REASON, message, node=node_name, advisory=True)]
    kubelet = node_config.kubelet_for(node) if node_config is not None else None
    usage, admitted, failures = state.usage(node_name), 0, []
    for i in range(min(added, SCALE_SIMULATED)):
        failures = kubelet_admission(review.pod, node, usage, kubelet)
        if failures:
            break
        usage = usage.with_pod(dataclasses.replace(review.pod.record, key=f"{review.pod.record.key}#new-{i}"))
        admitted += 1
    if not failures:
        return []
    message = (
        f"{scaling}: the kubelet on {node_name} would admit {admitted} of the {added} new pods and reject "
        f"the others ({failures[0].summary()}); its controller replaces every rejected pod at once. Scale "
        "it back, make room on the node, or pin with required node affinity so the scheduler waits."
    )
    return [Finding(REASON, message, node=node_name, advisory=True)]


def replicas(obj: Mapping[str, Any], template_path: str) -> int | None:
    """How many pods the template at ``template_path`` asks for at once: the ``replicas`` (or a
    Job's ``parallelism``) beside it (a Deployment's ``spec``, a Volcano task, a Kubeflow replica
    spec, a Ray worker group); None when there is none to read."""
    parent: Any = obj
    for step in template_path.strip("/").split("/")[:-1]:
        step = step.replace("~1", "/").replace("~0", "~")
        if isinstance(parent, Mapping):
            parent = parent.get(step)
        elif isinstance(parent, list) and step.isdigit() and int(step) < len(parent):
            parent = parent[int(step)]
        else:
            return None
    if not isinstance(parent, Mapping):
        return None
    value = parent.get("replicas", parent.get("parallelism", 1))
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _field(shape) -> str:
    return display_path(shape.path) + ".spec.nodeName"


def _kubelet_verdict(
    review: Review,
    state: ClusterState | None,
    node_name: str,
    node_config: NodeAdmissionConfig | None,
    owners: DeviceSchedulerConfig | None = None,
) -> str:
    if state is None:
        return "(No cluster state given, so node capacity was not checked.)"
    if review.pod is None:
        return f"(Node capacity was not checked: {review.unreadable}.)"
    node = state.nodes.get(node_name)
    if node is None:
        elsewhere = fits_elsewhere(review, state, node_name, node_config, owners)
        return f"Node {node_name} is not in the cluster state: no kubelet would run its pods. {elsewhere}"
    failures = verdict(review.pod, node, state, node_config)
    if failures:
        summaries = "; ".join(f.summary() for f in failures)
        elsewhere = fits_elsewhere(review, state, node_name, node_config, owners)
        return f"Node {node_name} would reject it: {summaries}. {elsewhere}"
    return f"Node {node_name} would admit one pod now; the next pod that does not fit fails."


_TERMS = ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")


def node_affinity_patch(path: str, spec: Mapping[str, Any], node: str) -> Patch:
    """Remove nodeName; AND ``metadata.name In [node]`` into every required node selector term.

    Missing levels of ``affinity.nodeAffinity.required...`` are added with one new term. Empty
    terms are left alone: the matcher ignores them, and filling one in would widen it.
    """
    requirement = {"key": "metadata.name", "operator": "In", "values": [node]}
    pointer = f"{path}/spec"
    ops: list[dict[str, Any]] = [{"op": "remove", "path": f"{pointer}/nodeName"}]
    current: Any = spec
    for depth, key in enumerate(_TERMS):
        child = current.get(key)
        if child and not isinstance(child, list if key == "nodeSelectorTerms" else Mapping):
            raise FieldError(pointer.lstrip("/").replace("/", ".") + f".{key}", "malformed, cannot be fixed")
        if not child:
            value: Any = [{"matchFields": [requirement]}]
            for outer in reversed(_TERMS[depth + 1 :]):
                value = {outer: value}
            return (*ops, {"op": "add", "path": f"{pointer}/{key}", "value": value})
        current, pointer = child, f"{pointer}/{key}"
    for i, term in enumerate(current):
        if not isinstance(term, Mapping):
            raise FieldError(f"{pointer.lstrip('/').replace('/', '.')}[{i}]", "malformed, cannot be fixed")
        if is_empty_term(term):
            continue
        if isinstance(term.get("matchFields"), list):
            ops.append({"op": "add", "path": f"{pointer}/{i}/matchFields/-", "value": requirement})
        else:
            ops.append({"op": "add", "path": f"{pointer}/{i}/matchFields", "value": [requirement]})
    return tuple(ops)


def _spec_of(root: str) -> str:
    """CEL for the pod template spec of any workload kind the engine recognises."""
    return (
        f"{root}.kind == 'CronJob' ? {root}.spec.jobTemplate.spec.template.spec : "
        f"{root}.kind == 'PodTemplate' ? {root}.template.spec : {root}.spec.template.spec"
    )


# An UPDATE that keeps the pin it already had stays allowed, as in ``check``: existing
# objects must remain updatable (finalizers, labels, scale).
PINNED_EXPRESSION = (
    "!has(variables.spec.nodeName) || variables.spec.nodeName == '' || "
    "(request.operation == 'UPDATE' && has(variables.oldSpec.nodeName) && "
    "variables.oldSpec.nodeName == variables.spec.nodeName)"
)
PINNED_MESSAGE = (
    "object.kind + ' ' + object.metadata.namespace + '/' + object.metadata.name + "
    "' sets spec.nodeName to ' + variables.spec.nodeName + ' in its pod template: its pods skip the "
    "scheduler, and every pod the kubelet rejects is replaced at once. Pin the node with required node "
    "affinity on metadata.name or a nodeSelector on kubernetes.io/hostname instead.'"
)
WORKLOAD_RULES = [
    {"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
     "resources": ["deployments", "replicasets", "statefulsets", "daemonsets"]},
    {"apiGroups": ["batch"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
     "resources": ["jobs", "cronjobs"]},
    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
     "resources": ["replicationcontrollers", "podtemplates"]},
]  # fmt: skip
STATIC = StaticPolicy(
    resource_rules=WORKLOAD_RULES,
    variables=[
        {"name": "spec", "expression": _spec_of("object")},
        # Compared through the operation, not with null: UPDATE always has an oldObject.
        {
            "name": "oldSpec",
            "expression": f"request.operation == 'UPDATE' ? ({_spec_of('oldObject')}) : null",
        },
    ],
    validations=[
        {"expression": PINNED_EXPRESSION, "messageExpression": PINNED_MESSAGE, "reason": "Forbidden"}
    ],
)
