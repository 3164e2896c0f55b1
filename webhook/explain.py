"""``admit-guard explain``: for a pod or workload template, the kubelet's verdict on every node.

The pod's own ``spec.nodeName`` is set aside: the question is where it could go. The summary
uses the scheduler's shape ("0/5 nodes would admit it: 3 OutOfcpu, 2 untolerated taint"),
counting each rejecting node once, by the reason its kubelet would report first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .checks import PodUnderReview
from .checks.placement import unpinned, verdict
from .dryrun import judge_documents
from .kube.workloads import pod_shape
from .manifests import ManifestError
from .state import ClusterState

# The scheduler's words for the kubelet's predicate reasons; resource shortages keep theirs.
_WORDS = {
    "TaintToleration": "untolerated taint",
    "NodeAffinity": "node affinity/selector mismatch",
    "NodePorts": "host port conflict",
    "NodeName": "node name mismatch",
}


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    node: str
    admit: bool
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Explanation:
    kind: str
    namespace: str
    name: str
    nodes: tuple[NodeVerdict, ...]

    @property
    def admitting(self) -> int:
        return sum(v.admit for v in self.nodes)

    @property
    def summary(self) -> str:
        first = Counter(_WORDS.get(v.reasons[0], v.reasons[0]) for v in self.nodes if not v.admit)
        counts = ", ".join(f"{n} {reason}" for reason, n in first.most_common())
        head = f"{self.admitting}/{len(self.nodes)} nodes would admit it"
        return f"{head}: {counts}" if counts else head

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "nodes": [{"node": v.node, "admit": v.admit, "reasons": list(v.reasons)} for v in self.nodes],
            "summary": self.summary,
        }


def explain(obj: Mapping[str, Any], state: ClusterState) -> Explanation | None:
    """Every node's verdict for the pod ``obj`` stands for; None when it creates no pods.

    Raises ``FieldError`` for objects whose pod cannot be read.
    """
    shape = pod_shape(obj)
    if shape is None:
        return None
    pod = unpinned(PodUnderReview.from_shape(shape))
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    nodes = tuple(
        NodeVerdict(name, not failures, tuple(f.reason for f in failures))
        for name, node in sorted(state.nodes.items())
        for failures in (verdict(pod, node, state),)
    )
    return Explanation(
        shape.kind if not shape.is_template else str(obj.get("kind")),
        str(metadata.get("namespace") or "default"),
        str(metadata.get("name") or metadata.get("generateName") or ""),
        nodes,
    )


def explain_documents(
    files: Iterable[str], state: ClusterState
) -> tuple[list[Explanation], list[ManifestError]]:
    """Every document of ``files`` explained, objects that create no pods left out; documents
    or pods that cannot be read are input errors, as in the dry run."""
    return judge_documents(files, lambda doc: explain(doc.obj, state))
