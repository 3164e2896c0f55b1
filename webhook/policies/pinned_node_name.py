"""``pinnedNodeName``: workload templates must not set ``spec.nodeName``.

Pods that carry a nodeName skip the scheduler; when the kubelet rejects them the controller
makes new ones at once. The fix pins the node through required node affinity instead, which
the scheduler honours, so pods wait as Pending rather than fail in a loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..checks.placement import candidates, verdict
from ..config import NodeAdmissionConfig
from ..kube.errors import FieldError
from ..kube.selectors import is_empty_term
from ..state import ClusterState
from . import Finding, Patch, Review

NAME = "pinnedNodeName"
REASON = "PinnedNodeName"


def check(
    review: Review, state: ClusterState | None, node_config: NodeAdmissionConfig | None = None
) -> list[Finding]:
    shape = review.shape
    node = shape.spec.get("nodeName")
    if not shape.is_template or not node:
        return []
    if review.old_shape is not None and review.old_shape.spec.get("nodeName") == node:
        return []  # existing objects must stay updatable (finalizers, labels, scale)
    verdict_now = _kubelet_verdict(review, state, node, node_config)
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


def _field(shape) -> str:
    return shape.path.lstrip("/").replace("/", ".") + ".spec.nodeName"


def _kubelet_verdict(
    review: Review, state: ClusterState | None, node_name: str, node_config: NodeAdmissionConfig | None
) -> str:
    if state is None:
        return "(No cluster state given, so node capacity was not checked.)"
    if review.pod is None:
        return f"(Node capacity was not checked: {review.unreadable}.)"
    node = state.nodes.get(node_name)
    if node is None:
        elsewhere = candidates(review.pod, state, skip=(node_name,), config=node_config).sentence()
        return f"Node {node_name} is not in the cluster state: no kubelet would run its pods. {elsewhere}"
    failures = verdict(review.pod, node, state, node_config)
    if failures:
        summaries = "; ".join(f.summary() for f in failures)
        elsewhere = candidates(review.pod, state, skip=(node_name,), config=node_config).sentence()
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
