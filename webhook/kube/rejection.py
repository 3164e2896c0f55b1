"""Which Failed pods the kubelet rejected at admission, and which controller owns them.

The kubelet's ``rejectPod`` (``pkg/kubelet/kubelet.go``) writes ``phase: Failed``, the admit
handler's reason, and ``message: "Pod was rejected: <message>"``. Those pods never ran: a
controller that replaces them at once is a storm. Container failures, evictions of running
pods (``Evicted`` without the rejection prefix) and ``DeadlineExceeded`` are not rejections.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import reasons as r

REJECTED_PREFIX = "Pod was rejected"
# Reasons only the kubelet's admit handlers write (kubelet-admission-spec §1 handler table);
# OutOf* is a family.
ADMISSION_REASONS = frozenset(
    {
        r.UNEXPECTED_ADMISSION_ERROR,
        r.TOPOLOGY_AFFINITY_ERROR,
        r.SMT_ALIGNMENT_ERROR,
        r.NODE_AFFINITY,
        r.NODE_NAME,
        r.NODE_PORTS,
        r.TAINT_TOLERATION,
        r.SYSCTL_FORBIDDEN,
        r.POD_OS_NOT_SUPPORTED,
        r.POD_OS_SELECTOR_NODE_LABEL_DOES_NOT_MATCH,
        r.SUPPLEMENTAL_GROUPS_POLICY_NOT_SUPPORTED,
        r.INVALID_NODE_INFO,
        r.UNKNOWN_REASON,
        r.UNEXPECTED_PREDICATE_FAILURE_TYPE,
        r.APP_ARMOR,
        r.POD_LEVEL_RESOURCES_NOT_SUPPORTED,
        r.POD_FEATURE_UNSUPPORTED,
        r.NODE_SHUTDOWN,
    }
)
# Reasons that also describe what happens to running pods: only the message tells them apart.
_AMBIGUOUS_REASONS = frozenset({r.EVICTED})
_NEVER = frozenset({"DeadlineExceeded"})


@dataclass(frozen=True, slots=True)
class Rejection:
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Owner:
    """A pod's controller ``ownerReference``, with the pod's namespace (owners are namespaced)."""

    uid: str
    kind: str
    name: str
    namespace: str
    api_version: str = ""


def admission_rejection(pod: Mapping[str, Any]) -> Rejection | None:
    """The kubelet's admission rejection of ``pod``, or None when it was not rejected."""
    status = pod.get("status")
    if not isinstance(status, Mapping) or status.get("phase") != "Failed":
        return None
    reason = status.get("reason")
    message = status.get("message")
    reason = reason if isinstance(reason, str) else ""
    message = message if isinstance(message, str) else ""
    if reason in _NEVER:
        return None
    if message.startswith(REJECTED_PREFIX):
        return Rejection(reason or r.UNKNOWN_REASON, message)
    if reason in _AMBIGUOUS_REASONS:
        return None
    if reason in ADMISSION_REASONS or r.is_out_of(reason):
        return Rejection(reason, message)
    return None


def controller_owner(pod: Mapping[str, Any]) -> Owner | None:
    """The ``ownerReference`` with ``controller: true`` (at most one, as the API server ensures)."""
    metadata = pod.get("metadata")
    if not isinstance(metadata, Mapping):
        return None
    refs = metadata.get("ownerReferences")
    if not isinstance(refs, list):
        return None
    namespace = metadata.get("namespace")
    namespace = namespace if isinstance(namespace, str) and namespace else "default"
    for ref in refs:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            uid, kind, name = ref.get("uid"), ref.get("kind"), ref.get("name")
            if all(isinstance(v, str) and v for v in (uid, kind, name)):
                api_version = ref.get("apiVersion")
                return Owner(uid, kind, name, namespace, api_version if isinstance(api_version, str) else "")
    return None
