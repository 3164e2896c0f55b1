"""``stormBreaker``: while an owner's pods keep being rejected by kubelets, refuse its new pods.

A ReplicaSet, ReplicationController or StatefulSet replaces every pod the kubelet rejects at
once, whatever the reason (a dead GPU, a topology error, a label change): thousands of Failed
pods in minutes. Denying the controller's CREATEs makes it back off instead. The breakers live
in the cluster state (``state/storm.py``); this policy only reads them.
"""

from __future__ import annotations

import shlex
from collections import Counter
from typing import TYPE_CHECKING, Any

from ...kube.rejection import controller_owner
from ...state.model import FAILED_PODS
from ...state.storm import Breaker
from .. import NO_CLUSTER_STATE, POD_SHAPE, AuditPass, AuditScope, Context, Finding, Review, Subject
from .settings import MODES, REASON, StormBreakerConfig, read_settings
from .storms import storm_findings, storm_groups

if TYPE_CHECKING:
    from ...config import Config

__all__ = ["MODES", "StormBreakerConfig", "read_settings"]

NAME = "stormBreaker"
REASONS = (REASON,)
READS = POD_SHAPE
STATIC = None  # the breakers live in the guard
Settings = StormBreakerConfig
AUDITS = (REASON,)
AUDIT_READS = FAILED_PODS


def check(review: Review, context: Context) -> list[Finding]:
    state, now = context.state, context.now
    if review.shape.kind != "Pod" or review.operation != "CREATE" or now is None:
        return []
    if state is None or state.storm is None:
        return []
    owner = controller_owner(review.obj)
    if owner is None:
        return []
    verdict = state.storm.verdict(owner.uid, now)
    if not verdict.deny:
        return []
    return [Finding(REASON, _message(review, verdict.breaker, now))]


def _message(review: Review, breaker: Breaker, now: float) -> str:
    owner = breaker.owner
    wait = max(0.0, breaker.cooldown - (now - max(breaker.last_rejection, breaker.probe_at or 0.0)))
    return (
        f"{owner.kind} {owner.namespace}/{owner.name} is in an admission storm: kubelets rejected "
        f"{breaker.total} of its pods (reasons {_top(breaker.reasons)}; nodes {_top(breaker.nodes)}). "
        f"Its new pods are refused so the controller backs off; in about {wait:.0f} s one probe pod "
        f"is admitted, and a pod that runs ends the storm. Fix the cause, then delete its Failed pods "
        f"(whatever failed them): "
        f"{cleanup_command(review, owner.namespace)}"
    )


def cleanup_command(review: Review, namespace: str) -> str:
    """Deletes the owner's Failed pods: they carry the labels of the pod under review. Without
    labels to select them by, only a listing: a bare delete would take other owners' pods too."""
    labels = review.shape.metadata.get("labels") or {}
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if isinstance(v, str))
    failed = f"-n {shlex.quote(namespace)} --field-selector=status.phase=Failed"
    if selector:
        return f"kubectl delete pods {failed} -l {shlex.quote(selector)}"
    return f"kubectl get pods {failed} (then delete this owner's)"


def _top(counts: Counter[str], limit: int = 3) -> str:
    return ", ".join(f"{name} x{n}" for name, n in counts.most_common(limit))


def audit(scope: AuditScope, context: Context) -> list[Finding]:
    """The storms the breaker would have caught, from the Failed pods they left behind."""
    settings = context.config.policy(NAME)
    groups = storm_groups(scope.inventory, context.now)
    return storm_findings(groups, settings, context.now, context.config)


def audit_pass(config: Config) -> AuditPass:
    """The breakers open now, one finding each (the server's periodic audit counts them per
    namespace): the live state keeps no Failed pods to group."""
    return AuditPass(
        keys=lambda state: () if state.storm is not None else None,
        step=lambda state, keys: None,
        findings=lambda state: [_open(b) for b in state.storm.open_breakers()] if state.storm else [],
        chunk=1,
    )


def _open(breaker: Breaker) -> Finding:
    owner = breaker.owner
    return Finding(
        REASON,
        f"the storm breaker of {owner.kind} {owner.namespace}/{owner.name} is {breaker.state}",
        severity="high",
        subject=Subject(owner.namespace, owner.kind, owner.name, owner.api_version, owner.uid),
    )


def audit_terms(config: Config) -> dict[str, Any]:
    """The report states the threshold it called a storm at (the breaker's)."""
    return {"stormThreshold": config.policy(NAME).threshold}


def check_stateless(review: Review, context: Context) -> list[Finding]:
    """Without cluster state there are no breakers: a pod its controller creates is not checked."""
    owner = controller_owner(review.obj)
    if review.shape.kind != "Pod" or review.operation != "CREATE" or owner is None:
        return []
    message = (
        f"Pod {review.namespace}/{review.name} is created by {owner.kind} {owner.name}, but no cluster "
        "state was given, so its owner's admission storms were not checked (give --cluster)."
    )
    return [Finding(NO_CLUSTER_STATE, message, advisory=True)]
