"""Cluster state from ``kubectl get nodes,pods -A -o yaml|json`` files.

A big cluster's snapshot, JSON or YAML, is streamed item by item (``json_items``,
``yaml_items``), so only compact records are kept and peak memory stays near the size of the
file's text; every other input is read the ordinary way, with the same records and errors.

What a snapshot held is kept as ``SnapshotFacts``: a manifest or a ``kubectl get`` table given
as a snapshot, or pods without their nodes, is said, never judged as an empty cluster.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ..formats.json_items import NotStreamable
from ..formats.json_items import list_items as json_list_items
from ..formats.manifests import Document, Location, ManifestError, list_item, manifest_files, read_documents
from ..formats.yaml_items import list_items as yaml_list_items
from ..kube.errors import FieldError
from ..kube.kinds import NODE_RESOURCE_TOPOLOGY
from ..kube.timestamps import object_time
from ..kube.workloads import api_group
from .devices import DeviceIndex
from .gc_pause import collector_paused
from .model import TERMINAL_PHASES, ClusterState, node_from, object_key, pod_record
from .storm import StormBreakers
from .topology import topology_from

if TYPE_CHECKING:
    from ..config import StormBreakerConfig

T = TypeVar("T")


class SnapshotError(ValueError):
    """Snapshot files the guard cannot use; ``problems`` lists each with its location."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


FETCH = "kubectl get nodes,pods -A -o yaml"  # how to take a snapshot the guard can use


@dataclass(slots=True)
class SnapshotFacts:
    """What snapshot files held: what a run can say it judged, and what was missing."""

    nodes: set[str] = field(default_factory=set)
    pods: int = 0
    failed_pods: int = 0
    pods_by_node: Counter[str] = field(default_factory=Counter)  # active pods bound to each node
    other_kinds: Counter[str] = field(default_factory=Counter)
    newest: float | None = None  # the latest timestamp in the objects: when it was taken

    def observe(self, obj: Mapping[str, object]) -> None:
        """Count one object; called for every object a snapshot holds, so kept cheap."""
        kind = obj.get("kind")
        metadata = obj.get("metadata")
        metadata = metadata if isinstance(metadata, dict) else {}
        self._moment(metadata.get("creationTimestamp"))
        status = obj.get("status")
        status = status if isinstance(status, dict) else {}
        if kind == "Node":
            self.nodes.add(str(metadata.get("name") or ""))
            for condition in status.get("conditions") or ():
                if isinstance(condition, dict):  # a live kubelet's heartbeat: the time of the list
                    self._moment(condition.get("lastHeartbeatTime"))
        elif kind == "Pod":
            self.pods += 1
            spec = obj.get("spec")
            node = spec.get("nodeName") if isinstance(spec, dict) else None
            if status.get("phase") == "Failed":
                self.failed_pods += 1
            elif node and status.get("phase") not in TERMINAL_PHASES:
                self.pods_by_node[str(node)] += 1
        elif isinstance(kind, str):
            self.other_kinds[kind] += 1

    def _moment(self, value: object) -> None:
        moment = object_time(value)
        if moment is None:
            return
        if self.newest is None or moment > self.newest:
            self.newest = moment

    def missing(self) -> str | None:
        """Why the files are not a cluster snapshot at all (an input error), or None."""
        if self.nodes:
            return None
        held = ", ".join(f"{n} {kind}" for kind, n in self.other_kinds.most_common(4))
        held += f", {self.pods} Pod" if self.pods else ""
        return (
            f"holds no Node ({'only ' + held.lstrip(', ') if held else 'no objects of any kind'}): "
            f"a snapshot is the nodes and pods of a cluster, '{FETCH}' (or -o json)"
        )

    def warnings(self) -> list[str]:
        """What the snapshot lacks that the checks need: pods, the nodes pods are bound to."""
        if not self.nodes:
            return []
        if not self.pods:
            return [
                f"the cluster snapshot has {len(self.nodes)} nodes but no pods: every node looks "
                f"empty and no device owner can be detected; take it with '{FETCH}'"
            ]
        lacking = {n: c for n, c in self.pods_by_node.items() if n not in self.nodes}
        if not lacking:
            return []
        names = sorted(lacking, key=lambda n: (-lacking[n], n))
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        return [
            f"{sum(lacking.values())} pods in the cluster snapshot are bound to {len(names)} nodes "
            f"it lacks ({shown}): those nodes' usage is unknown and pods pinned to them look "
            f"UnknownNode; take nodes and pods together with '{FETCH}'"
        ]


@dataclass(frozen=True, slots=True)
class Snapshot:
    state: ClusterState
    facts: SnapshotFacts


def load_snapshot(paths: Iterable[str], storm: StormBreakerConfig | None = None) -> ClusterState:
    """Build a ``ClusterState`` from Node and Pod objects; other kinds are ignored.

    With ``storm`` settings, Failed pods are recorded as admission rejections at their
    creation time, in breakers with those settings.
    """
    return read_cluster_snapshot(paths, storm).state


def read_cluster_snapshot(
    paths: Iterable[str],
    storm: StormBreakerConfig | None = None,
    on_object: Callable[[int], None] | None = None,
    as_of: float | None = None,
) -> Snapshot:
    """``load_snapshot``, with what the files held. ``on_object`` hears how many objects were
    read so far (a progress line); ``as_of``: the breakers as they stood then (``--now``)."""
    return read_snapshot(paths, lambda documents: _build(documents, storm, on_object, as_of))


def read_snapshot(paths: Iterable[str], build: Callable[[Iterable[Document | ManifestError]], T]) -> T:
    """``build`` over the documents of ``paths``: streamed when every file is a JSON ``List``,
    else (``build`` is called again, from scratch) read whole.

    The collector is paused meanwhile: millions of new dicts and records with no cycles make
    its full passes cost as much as the parse itself at 150,000 pods.
    """
    paths = list(paths)
    with collector_paused():
        try:
            return build(_streamed_documents(paths))
        except NotStreamable:
            return build(read_documents(paths))


# The DRA objects a snapshot may carry (``kubectl get ...,resourceslices,resourceclaims,
# deviceclasses -A -o yaml``): any of them makes the state's device index.
DRA_KINDS = {
    "ResourceSlice": DeviceIndex.set_slice,
    "ResourceClaim": DeviceIndex.set_claim,
    "DeviceClass": DeviceIndex.set_device_class,
    "DeviceTaintRule": DeviceIndex.set_taint_rule,
}


def _build(
    documents: Iterable[Document | ManifestError],
    storm: StormBreakerConfig | None,
    on_object: Callable[[int], None] | None = None,
    as_of: float | None = None,
) -> Snapshot:
    state = ClusterState(StormBreakers.from_config(storm, quiet=True) if storm is not None else None)
    facts = SnapshotFacts()
    problems: list[str] = []
    for count, doc in enumerate(documents):
        if on_object is not None and count % 1024 == 0:
            on_object(count)
        if isinstance(doc, ManifestError):
            problems.append(str(doc))
            continue
        facts.observe(doc.obj)
        kind = doc.obj["kind"]
        try:
            if kind == "Node":
                state.set_node(node_from(doc.obj))
            elif kind == "Pod":
                if state.storm is not None:
                    state.storm.observe(doc.obj, None, as_of=as_of)
                state.set_pod(object_key(doc.obj), pod_record(doc.obj))
            elif kind in DRA_KINDS and api_group(doc.obj) == "resource.k8s.io":
                if state.devices is None:
                    state.devices = DeviceIndex()
                DRA_KINDS[kind](state.devices, doc.obj)
            elif kind == NODE_RESOURCE_TOPOLOGY.name and api_group(doc.obj) == NODE_RESOURCE_TOPOLOGY.group:
                read_topology(state, doc.obj)
        except FieldError as err:
            problems.append(f"{doc.location}: {kind}: field {err}")
    if problems:
        raise SnapshotError(problems)
    return Snapshot(state, facts)


def read_topology(state: ClusterState, obj: Mapping[str, object]) -> None:
    """A NodeResourceTopology, attached to its node. A snapshot cannot tell how old the object
    is against the pods beside it: its ``available`` is taken to count them all (issue 27 item 4,
    docs/topology.md), so nothing is subtracted from it here."""
    if obj.get("apiVersion") not in NODE_RESOURCE_TOPOLOGY_VERSIONS:
        wanted = NODE_RESOURCE_TOPOLOGY.api_version
        version = obj.get("apiVersion")
        raise FieldError("apiVersion", f"{version!r} is not a version the guard reads ({wanted})")
    topology = topology_from(obj)
    state.set_topology(topology.node, topology)


NODE_RESOURCE_TOPOLOGY_VERSIONS = frozenset(
    f"{NODE_RESOURCE_TOPOLOGY.group}/{version}" for version in NODE_RESOURCE_TOPOLOGY.versions
)


def _streamed_documents(paths: list[str]) -> Iterator[Document | ManifestError]:
    """Documents of JSON ``List`` files, one item at a time; ``NotStreamable`` for any other file."""
    for path in manifest_files(paths):
        if isinstance(path, ManifestError) or path == "-":
            raise NotStreamable("not a file")
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise NotStreamable("unreadable") from None
        items = json_list_items(text) if text.lstrip().startswith("{") else yaml_list_items(text)
        for number, item in enumerate(items, start=1):
            yield list_item(item, Location(path, 1, number))
