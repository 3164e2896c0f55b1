"""``stormBreaker``: while an owner's pods keep being rejected by kubelets, refuse its new pods.

A ReplicaSet, ReplicationController or StatefulSet replaces every pod the kubelet rejects at
once, whatever the reason (a dead GPU, a topology error, a label change): thousands of Failed
pods in minutes. Denying the controller's CREATEs makes it back off instead. The breakers live
in the cluster state (``state/storm.py``); this policy only reads them.
"""

from __future__ import annotations

import shlex
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..kube.rejection import controller_owner
from ..state.storm import Breaker
from . import NO_FIX, POD_SHAPE, Context, Finding, Mode, Review, read_mode

if TYPE_CHECKING:
    from ..formats.reader import Reader

NAME = "stormBreaker"
REASON = "AdmissionStorm"
REASONS = (REASON,)
MODES = NO_FIX
READS = POD_SHAPE
STATIC = None  # the breakers live in the guard


@dataclass(frozen=True, slots=True)
class StormBreakerConfig:
    mode: Mode = Mode.ENFORCE
    threshold: int = 20
    window_seconds: float = 300.0
    cooldown_seconds: float = 120.0


Settings = StormBreakerConfig


def read_settings(reader: Reader, data: Any, where: str) -> StormBreakerConfig:
    data = reader.mapping(data, where, {"mode", "threshold", "windowSeconds", "cooldownSeconds"})
    defaults = StormBreakerConfig()
    return StormBreakerConfig(
        mode=read_mode(reader, data, where, MODES),
        threshold=int(reader.number(data.get("threshold", defaults.threshold), f"{where}.threshold", 1)),
        window_seconds=reader.number(
            data.get("windowSeconds", defaults.window_seconds), f"{where}.windowSeconds", 1
        ),
        cooldown_seconds=reader.number(
            data.get("cooldownSeconds", defaults.cooldown_seconds), f"{where}.cooldownSeconds", 0.001
        ),
    )


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
