"""Policies: each looks at one object and returns findings; the engine applies modes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..checks import PodUnderReview
from ..kube.errors import FieldError
from ..kube.workloads import PodShape

Patch = tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Review:
    """The object under review, with the pod it stands for (requests computed once)."""

    obj: Mapping[str, Any]
    shape: PodShape
    pod: PodUnderReview | None  # None when its fields are unreadable (see ``unreadable``)
    operation: str
    old_shape: PodShape | None = None
    unreadable: FieldError | None = None

    @property
    def namespace(self) -> str:
        return (self.obj.get("metadata") or {}).get("namespace") or "default"

    @property
    def name(self) -> str:
        metadata = self.obj.get("metadata") or {}
        return metadata.get("name") or metadata.get("generateName") or "<unnamed>"

    @property
    def description(self) -> str:
        return f"{self.shape.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing a policy objects to.

    ``fix`` is the JSONPatch that cures it, or None when the policy cannot (or must not) fix
    it; ``advisory`` findings only ever become warnings (e.g. "no cluster state to check").
    """

    reason: str
    message: str
    node: str | None = None
    fix: Patch | None = None
    advisory: bool = False
