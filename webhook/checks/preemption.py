"""Critical pods and kubelet-side preemption (``preemption.go`` ``HandleAdmissionFailure``).
kubelet-admission-spec §9."""

from __future__ import annotations

from collections.abc import Iterable

from ..kube.reasons import UNEXPECTED_ADMISSION_ERROR
from ..state.model import PodRecord
from .failure import Failure


def preemptable(preemptor: PodRecord, victim: PodRecord) -> bool:
    """``kubetypes.Preemptable``: critical beats non-critical; otherwise strictly higher priority."""
    if preemptor.critical and not victim.critical:
        return True
    if preemptor.priority is not None and victim.priority is not None:
        return preemptor.priority > victim.priority
    return False


def _reclaimable(victim: PodRecord, resource: str) -> int:
    return 1 if resource == "pods" else victim.requests.get(resource, 0)


def critical_pod_failures(
    pod: PodRecord, failures: list[Failure], others: Iterable[PodRecord]
) -> list[Failure]:
    """What remains of ``failures`` once the kubelet tries to make room for a critical pod.

    Non-resource failures stand alone (no eviction helps). Resource shortfalls are cured when
    the pods this one may preempt hold enough to cover every one of them; otherwise the
    kubelet answers ``UnexpectedAdmissionError``.
    """
    if not pod.critical or not failures:
        return failures
    standing = [f for f in failures if not f.insufficient]
    if standing:
        return standing
    victims = [other for other in others if other.key != pod.key and preemptable(pod, other)]
    uncovered = []
    for failure in failures:
        remaining = failure.shortfall - sum(_reclaimable(v, failure.resource) for v in victims)
        if remaining > 0:
            uncovered.append((failure.resource, remaining))
    if not uncovered:
        return []
    listing = "".join(f"(res: {name}, q: {amount}), " for name, amount in uncovered)
    return [
        Failure(
            UNEXPECTED_ADMISSION_ERROR,
            "Unexpected error while attempting to recover from admission failure: preemption: "
            "error finding a set of pods to preempt: no set of running pods found to reclaim "
            f"resources: [{listing}]",
            "the pod is critical, but evicting every lower-priority pod on the node would "
            "still not free enough",
        )
    ]
