"""One reason the kubelet would reject a pod: its reason code, its exact message, and a hint."""

from __future__ import annotations

from dataclasses import dataclass

from ..kube.quantity import format_amount

# Why a refusal is only a warning: the node's NRT was computed over other pods than the state
# knows there (``nodeTopologyPodsFingerprint``). A closed set, for the metric.
FINGERPRINT_MISMATCH = "fingerprint-mismatch"


@dataclass(frozen=True, slots=True)
class Failure:
    """``reason``/``message`` are the kubelet's own strings; ``hint`` is the guard's advice."""

    reason: str
    message: str
    hint: str = ""
    resource: str | None = None
    requested: int = 0
    used: int = 0
    capacity: int = 0
    # Set when the prediction is doubted (``FINGERPRINT_MISMATCH``): said as a warning, never a
    # denial, and the kubelet's later checks still run.
    doubt: str = ""

    @property
    def insufficient(self) -> bool:
        """An ``InsufficientResourceError``: the only kind critical-pod preemption can cure."""
        return self.resource is not None

    @property
    def shortfall(self) -> int:
        return self.requested - (self.capacity - self.used)

    def summary(self) -> str:
        """Short form for other messages: ``OutOfpods (110 of 110 pods)``."""
        if self.resource == "pods":
            return f"{self.reason} ({self.used} of {self.capacity} pods)"
        if self.resource is not None:
            fmt = lambda n: format_amount(self.resource, n)  # noqa: E731
            return (
                f"{self.reason} (requested {fmt(self.requested)}, "
                f"{fmt(self.used)} of {fmt(self.capacity)} in use)"
            )
        return self.reason


def predicate_failure(name: str, description: str, hint: str) -> Failure:
    """A ``PredicateFailureError`` as the kubelet words it."""
    return Failure(name, f"Predicate {name} failed: {description}", hint)
