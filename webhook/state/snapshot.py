"""Cluster state from ``kubectl get nodes,pods -A -o yaml|json`` files."""

from __future__ import annotations

from collections.abc import Iterable

from ..kube.errors import FieldError
from ..manifests import ManifestError, read_documents
from .model import ClusterState, node_from, object_key, pod_record


class SnapshotError(ValueError):
    """Snapshot files the guard cannot use; ``problems`` lists each with its location."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def load_snapshot(paths: Iterable[str]) -> ClusterState:
    """Build a ``ClusterState`` from Node and Pod objects; other kinds are ignored."""
    state = ClusterState()
    problems: list[str] = []
    for doc in read_documents(paths):
        if isinstance(doc, ManifestError):
            problems.append(str(doc))
            continue
        kind = doc.obj["kind"]
        try:
            if kind == "Node":
                state.set_node(node_from(doc.obj))
            elif kind == "Pod":
                state.set_pod(object_key(doc.obj), pod_record(doc.obj))
        except FieldError as err:
            problems.append(f"{doc.location}: {kind}: field {err}")
    if problems:
        raise SnapshotError(problems)
    return state
