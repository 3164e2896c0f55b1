"""The little Kubernetes arithmetic every component of the box needs, written apart from the
guard's ``webhook.kube`` on purpose: quantities, a pod's requests, label selectors, phases.

Sources: ``k8s.io/apimachinery/pkg/api/resource`` (suffixes), ``k8s.io/component-helpers/
resource`` ``PodRequests`` (containers summed, the largest init container, one pod slot),
``pkg/apis/core/v1/defaults.go`` (limits copied to unset requests), and
``k8s.io/apimachinery/pkg/labels`` (selector operators).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SUFFIXES = {
    "m": 0.001, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip
POD_SLOT = "pods"


def quantity(value: str | int | float) -> float:
    """A resource quantity in base units ("500m" is 0.5, "1Gi" is 1073741824)."""
    text = str(value).strip()
    for suffix in sorted(SUFFIXES, key=len, reverse=True):
        if text.endswith(suffix) and text[: -len(suffix)]:
            return float(text[: -len(suffix)]) * SUFFIXES[suffix]
    return float(text)


def container_requests(container: Mapping[str, Any]) -> dict[str, float]:
    resources = container.get("resources") or {}
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {name: quantity(value) for name, value in merged.items()}


def pod_requests(pod: Mapping[str, Any]) -> dict[str, float]:
    """What a pod takes from its node, with its pod slot: what the scheduler's NodeResourcesFit
    and the kubelet's predicate count alike."""
    spec = pod.get("spec") or {}
    total: dict[str, float] = {POD_SLOT: 1.0}
    for container in spec.get("containers") or []:
        for name, amount in container_requests(container).items():
            total[name] = total.get(name, 0.0) + amount
    for container in spec.get("initContainers") or []:
        for name, amount in container_requests(container).items():
            total[name] = max(total.get(name, 0.0), amount)
    return total


def allocatable(node: Mapping[str, Any]) -> dict[str, float]:
    return {k: quantity(v) for k, v in ((node.get("status") or {}).get("allocatable") or {}).items()}


def is_active(pod: Mapping[str, Any]) -> bool:
    """``controller.IsPodActive``: not Succeeded, not Failed, not being deleted."""
    phase = (pod.get("status") or {}).get("phase")
    return phase not in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp")


def labels_match(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A metav1.LabelSelector over ``labels``; an empty or missing selector matches everything."""
    if not selector:
        return True
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression["key"], expression["operator"], expression.get("values") or []
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


def key(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = obj["metadata"]
    return metadata.get("namespace", ""), metadata["name"]


def allocation(request: str, driver: str, pool: str, device: str, node: str) -> dict[str, Any]:
    """``status.allocation`` of a claim given one device of a node-local pool, as the
    scheduler's allocator writes it (``structured/allocator.go``: results and a node selector
    on ``metadata.name``)."""
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    result = {"request": request, "driver": driver, "pool": pool, "device": device}
    return {"devices": {"results": [result]}, "nodeSelector": {"nodeSelectorTerms": [term]}}
