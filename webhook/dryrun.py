"""The dry run (``admit-guard check``): manifests judged as the webhook would judge them.

Every document goes through ``engine.evaluate`` with the cluster state and the config, one
``Result`` each. A document that cannot be parsed, or whose pod cannot be read, is an input
error in its place, never a verdict: CI must not pass what was never checked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from .config import Config
from .engine import Decision, evaluate
from .kube.errors import FieldError
from .kube.workloads import BUILT_IN, WorkloadTable
from .manifests import Document, Location, ManifestError, read_documents
from .state import ClusterState

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Result:
    """One checked object: where it was, what it is, and the verdict. The object itself is not
    kept: tens of thousands of them would stay alive until the report."""

    location: Location
    kind: str
    namespace: str | None  # None for objects that carry none and are not workloads
    name: str
    decision: Decision
    skipped: bool  # the kind creates no pods: nothing to check

    @classmethod
    def of(cls, doc: Document, decision: Decision, workloads: WorkloadTable = BUILT_IN) -> Result:
        skipped = not workloads.creates_pods(doc.obj)
        metadata = _metadata(doc.obj)
        # Cluster-scoped kinds have no namespace, and ``default/`` would be a lie.
        namespace = (
            str(metadata["namespace"]) if metadata.get("namespace") else (None if skipped else "default")
        )
        name = str(metadata.get("name") or metadata.get("generateName") or "")
        return cls(doc.location, doc.obj["kind"], namespace, name, decision, skipped)

    @property
    def verdict(self) -> str:
        if self.skipped:
            return "skip"
        if not self.decision.allowed:
            return "deny"
        if self.decision.patch:
            return "patch"
        return "warn" if self.decision.notices else "allow"

    def as_json(self) -> dict[str, Any]:
        location = self.location
        return {
            "file": location.file,
            "document": location.document,
            "item": location.item,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "allowed": self.decision.allowed,
            "skipped": self.skipped,
            "violations": [
                {"policy": v.policy, "reason": v.reason, "message": v.message, "node": v.node}
                for v in self.decision.violations
            ],
            "warnings": self.decision.notices,
            "patch": self.decision.patch,
        }


def _metadata(obj: dict[str, Any]) -> dict[str, Any]:
    metadata = obj.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


@dataclass(frozen=True, slots=True)
class Summary:
    """How many objects got each verdict; the counts partition the objects and errors."""

    allowed: int
    denied: int
    warned: int
    skipped: int
    errors: int

    @classmethod
    def of(cls, results: list[Result], errors: list[ManifestError]) -> Summary:
        verdicts = [r.verdict for r in results]
        return cls(
            allowed=verdicts.count("allow"),
            denied=verdicts.count("deny"),
            warned=verdicts.count("warn") + verdicts.count("patch"),
            skipped=verdicts.count("skip"),
            errors=len(errors),
        )

    def __str__(self) -> str:
        total = self.allowed + self.denied + self.warned + self.skipped
        return (
            f"{total} objects: {self.allowed} allowed, {self.denied} denied, {self.warned} warned, "
            f"{self.skipped} skipped, {self.errors} input errors"
        )


def check_documents(
    files: Iterable[str],
    state: ClusterState | None,
    config: Config,
    *,
    operation: str = "CREATE",
    user: str = "",
    groups: tuple[str, ...] = (),
    on_document: Callable[[int], None] | None = None,
) -> tuple[list[Result], list[ManifestError]]:
    """Every document of ``files`` through the engine: (results, input errors).
    ``on_document`` hears how many were judged before each one (for a progress line)."""

    def judge(doc: Document) -> Result:
        decision = evaluate(doc.obj, operation, state, config, user=user, groups=groups, now=time.time())
        if decision.unreadable:
            raise decision.unreadable
        return Result.of(doc, decision, config.workloads)

    return judge_documents(files, judge, on_document)


def judge_documents(
    files: Iterable[str],
    judge: Callable[[Document], T | None],
    on_document: Callable[[int], None] | None = None,
) -> tuple[list[T], list[ManifestError]]:
    """``judge`` over every document of ``files``: what it returned (None: nothing to report)
    and the input errors, unreadable documents and unreadable fields each at its location."""
    results: list[T] = []
    errors: list[ManifestError] = []
    for doc in read_documents(files):
        if on_document is not None:
            on_document(len(results) + len(errors))
        if isinstance(doc, ManifestError):
            errors.append(doc)
            continue
        try:
            result = judge(doc)
        except FieldError as err:
            errors.append(ManifestError(doc.location, f"{doc.obj['kind']}: field {err}"))
            continue
        if result is not None:
            results.append(result)
    return results, errors
