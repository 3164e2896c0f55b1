"""Taints and tolerations (``k8s.io/api/core/v1/toleration.go`` ``ToleratesTaint``).
kubelet-admission-spec §8."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        value = f"={self.value}" if self.value else ""
        return f"{self.key}{value}:{self.effect}"


def taint_from(raw: Any) -> Taint | None:
    if not isinstance(raw, Mapping) or not isinstance(raw.get("key"), str):
        return None
    return Taint(raw["key"], str(raw.get("value") or ""), str(raw.get("effect") or ""))


def tolerates(toleration: Any, taint: Taint) -> bool:
    """Whether one toleration tolerates one taint."""
    if not isinstance(toleration, Mapping):
        return False
    effect = toleration.get("effect") or ""
    if effect and effect != taint.effect:
        return False
    key = toleration.get("key") or ""
    if key and key != taint.key:
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    # Lt/Gt need the TaintTolerationComparisonOperators gate (alpha, off in v1.35).
    return operator == "Equal" and (toleration.get("value") or "") == taint.value


def untolerated_taint(taints: Iterable[Taint], tolerations: Any, effects: frozenset[str]) -> Taint | None:
    """The first taint with one of ``effects`` that no toleration tolerates."""
    tolerations = tolerations if isinstance(tolerations, list) else []
    for taint in taints:
        if taint.effect in effects and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None
