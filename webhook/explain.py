"""``admit-guard explain``: for each pod or workload template, where it could go, node by node.

The pod's own ``spec.nodeName`` is set aside: the question is where it could go. Each node gets
two verdicts: the scheduler's filters (would kube-scheduler place it there?) and the kubelet's
admission (would the node's kubelet admit it, were it bound there?). A pod fits a node when
both say yes; they differ on purpose (a CPU-only node's kubelet ignores the GPUs a pod asks
for, the scheduler does not), and where they differ, both are shown. The summary has the
scheduler's shape ("0/5 nodes fit: 3 Insufficient nvidia.com/gpu, 2 untolerated taint"),
counting each node once by its first reason: the scheduler's, else the kubelet's. It counts
nodes as ``check``'s messages do (``scheduler.placement``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .checks import PodUnderReview
from .config import Config
from .dryrun import check_api_rules, judge_documents
from .formats.manifests import ManifestError
from .kube.reasons import TOPOLOGY_AFFINITY_ERROR
from .policies import Context
from .policies.registry import EXPLAIN_POLICIES
from .scheduler.filters import AFFINITY, PORTS, UNSCHEDULABLE, tolerations_of
from .scheduler.placement import placement, unpinned
from .state import ClusterState

# Short words for the summary; resource shortages keep theirs (``Insufficient cpu``, ``OutOfcpu``).
_WORDS = {
    "TaintToleration": "untolerated taint",
    "NodeAffinity": "node affinity/selector mismatch",
    "NodePorts": "host port conflict",
    "NodeName": "node name mismatch",
    UNSCHEDULABLE: "unschedulable",
    AFFINITY: "node affinity/selector mismatch",
    PORTS: "host port conflict",
}
# A policy's refusals read "REASON: why"; its EXPLAIN_WORDS give the reason's short word.
_POLICY_WORDS = {reason: word for policy in EXPLAIN_POLICIES for reason, word in policy.EXPLAIN_WORDS.items()}


def _word(reason: str) -> str:
    if reason.startswith("node(s) had untolerated taint"):
        return "untolerated taint"
    head = reason.split(":", 1)[0]
    if head in _POLICY_WORDS:
        return _POLICY_WORDS[head]
    return _WORDS.get(reason, reason)


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    """``admit``/``reasons``: the kubelet's verdict; ``scheduler``: why the scheduler's filters
    would not pick the node (empty: they would)."""

    node: str
    admit: bool
    reasons: tuple[str, ...]
    scheduler: tuple[str, ...] = ()
    # The guard's words where the kubelet's reason alone does not say what is short: the topology
    # manager's policy, the container or pod it could not align, and each zone's free amounts.
    zones: str = ""

    @property
    def fits(self) -> bool:
        return self.admit and not self.scheduler

    @property
    def first_reason(self) -> str:
        return _word(self.scheduler[0] if self.scheduler else self.reasons[0])

    def detail(self) -> str:
        """Both views, each said only where it has something to say."""
        if self.fits:
            return ""
        kubelet = ", ".join(self.reasons) + (f" ({self.zones})" if self.zones else "")
        scheduler = "; ".join(self.scheduler)
        if not self.scheduler:
            return f"kubelet: {kubelet} (the scheduler would place it here)"
        if self.admit:
            return f"scheduler: {scheduler} (the kubelet alone would admit it)"
        return f"scheduler: {scheduler}; kubelet: {kubelet}"


@dataclass(frozen=True, slots=True)
class Explanation:
    kind: str
    namespace: str
    name: str
    nodes: tuple[NodeVerdict, ...]
    template: str = ""  # a custom resource's template (``spec.tasks[0].template``)

    @property
    def fitting(self) -> int:
        return sum(v.fits for v in self.nodes)

    @property
    def admitting(self) -> int:
        """Nodes whose kubelet would admit it (some of which the scheduler would never pick)."""
        return sum(v.admit for v in self.nodes)

    @property
    def subject(self) -> str:
        where = f" (template {self.template})" if self.template else ""
        return f"{self.kind} {self.namespace}/{self.name}{where}"

    @property
    def summary(self) -> str:
        first = Counter(v.first_reason for v in self.nodes if not v.fits)
        counts = ", ".join(f"{n} {reason}" for reason, n in first.most_common())
        head = f"{self.fitting}/{len(self.nodes)} nodes fit"
        return f"{head}: {counts}" if counts else head

    def as_json(self, *, nodes: bool = True) -> dict[str, Any]:
        """``nodes`` False: the summary and counts only (large clusters)."""
        data: dict[str, Any] = {
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
            "template": self.template,
            "fit": self.fitting,
            "total": len(self.nodes),
            "summary": self.summary,
        }
        if nodes:
            data["nodes"] = [
                {
                    "node": v.node,
                    "fits": v.fits,
                    "admit": v.admit,
                    "reasons": list(v.reasons),
                    "scheduler": list(v.scheduler),
                    **({"zones": v.zones} if v.zones else {}),
                }
                for v in self.nodes
            ]
        return data


def explain(
    obj: Mapping[str, Any], state: ClusterState, config: Config | None = None
) -> list[Explanation] | None:
    """Every node's verdicts for each pod ``obj`` stands for (one per template of a custom
    resource); None when it creates no pods. Raises ``FieldError`` for pods that cannot be read."""
    config = config or Config()
    templates = config.workloads.shapes(obj)
    if templates is None:
        return None
    metadata = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    namespace = str(metadata.get("namespace") or "default")
    name = str(metadata.get("name") or metadata.get("generateName") or "")
    explained = []
    for template in templates:
        shape = template.shape
        pod = unpinned(PodUnderReview.from_shape(shape))
        tolerations = tolerations_of(shape, pod.spec)
        context = Context(state, config)
        refusals = [policy.explain(pod, template.scheduler, context) for policy in EXPLAIN_POLICIES]
        nodes = tuple(
            NodeVerdict(
                node_name,
                not p.kubelet,
                tuple(f.reason for f in p.kubelet),
                (*p.scheduler, *(why for refused in refusals for why in refused(node))),
                _zones(p.kubelet),
            )
            for node_name, node in sorted(state.nodes.items())
            for p in (placement(pod, node, state, config, tolerations, namespace),)
        )
        kind = shape.kind if not shape.is_template else str(obj.get("kind"))
        explained.append(Explanation(kind, namespace, name, nodes, template.where))
    return explained


def _zones(failures) -> str:
    """The topology manager's detail, when it is the kubelet's (only) refusal."""
    return next((f.hint for f in failures if f.reason == TOPOLOGY_AFFINITY_ERROR), "")


def explain_documents(
    files: Iterable[str], state: ClusterState, config: Config | None = None
) -> tuple[list[Explanation], list[ManifestError]]:
    """Every document of ``files`` explained, objects that create no pods left out; documents
    or pods that cannot be read, and what the API server would refuse, are input errors, as in
    the dry run."""
    config = config or Config()

    def judge(doc):
        check_api_rules(doc.obj, config.workloads)  # what the API server refuses, as ``check``
        return explain(doc.obj, state, config)

    explained, errors = judge_documents(files, judge)
    return [e for group in explained for e in group], errors
