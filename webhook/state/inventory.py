"""What the audit reads of a cluster: the state, the workloads, and the pods the kubelet rejected.

``ClusterState`` keeps nodes and active pods only: terminal pods hold nothing on a node, and
the webhook never needs a Deployment. The audit needs both: the workloads (whose templates pin
``nodeName``, and which own the ReplicaSets and Jobs that own pods) and the Failed pods a storm
left behind. An ``Inventory`` holds them as compact records, built from snapshot files or from
one paginated list of each kind; every object goes through the same ``InventoryBuilder.add``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from ..formats.manifests import Document, ManifestError
from ..kube.errors import FieldError
from ..kube.kinds import NODE_RESOURCE_TOPOLOGY
from ..kube.rejection import Owner, admission_rejection, controller_owner
from ..kube.workloads import BUILT_IN, PodShape, TemplateShape, WorkloadTable, api_group, pod_shape
from .devices import DeviceIndex
from .model import (
    CLAIMS,
    FAILED_PODS,
    PODS,
    WORKLOADS,
    ClusterState,
    PodUnderReview,
    node_from,
    object_key,
    pod_record,
)
from .snapshot import DRA_KINDS, SnapshotError, SnapshotFacts, read_snapshot, read_topology

# The workload kinds the audit reads, as (list resource, kind, apiVersion): a live list's items
# carry neither kind nor apiVersion, so the reader stamps them from here.
WORKLOAD_RESOURCES = (
    ("deployments", "Deployment", "apps/v1"),
    ("replicasets", "ReplicaSet", "apps/v1"),
    ("statefulsets", "StatefulSet", "apps/v1"),
    ("daemonsets", "DaemonSet", "apps/v1"),
    ("jobs", "Job", "batch/v1"),
    ("cronjobs", "CronJob", "batch/v1"),
    ("replicationcontrollers", "ReplicationController", "v1"),
)
LIVE_RESOURCES = (("nodes", "Node", "v1"), ("pods", "Pod", "v1"), *WORKLOAD_RESOURCES)
# DRA, listed where the cluster serves resource.k8s.io/v1: the audit's device findings.
DRA_RESOURCES = (
    ("resourceslices", "ResourceSlice", "resource.k8s.io/v1"),
    ("resourceclaims", "ResourceClaim", "resource.k8s.io/v1"),
    ("deviceclasses", "DeviceClass", "resource.k8s.io/v1"),
)
# The topology manager's inputs, where an exporter publishes them: the audit's NRT findings.
TOPOLOGY_RESOURCES = (
    ("noderesourcetopologies", NODE_RESOURCE_TOPOLOGY.name, NODE_RESOURCE_TOPOLOGY.api_version),
)
WORKLOAD_KINDS = frozenset(kind for _, kind, _ in WORKLOAD_RESOURCES)
WORKLOAD_LIST = ",".join(resource for resource, _, _ in WORKLOAD_RESOURCES)


@dataclass(frozen=True, slots=True)
class PinnedTemplate:
    """A template that sets nodeName: the object, the template and its pod (validated)."""

    obj: Mapping[str, Any]
    shape: PodShape
    pod: PodUnderReview
    where: str = ""  # a custom resource's template (``spec.tasks[0].template``)
    scheduler: str | None = None  # the scheduler its pods get when their spec names none


@dataclass(frozen=True, slots=True)
class Workload:
    """One controller: a built-in one, or a custom resource of the workload table. ``pinned``:
    its templates that set nodeName (``node_name`` is the first one's node)."""

    kind: str
    api_version: str
    namespace: str
    name: str
    uid: str
    owner: Owner | None
    node_name: str = ""
    replicas: int = 1
    pinned: tuple[PinnedTemplate, ...] = ()


@dataclass(frozen=True, slots=True)
class RejectedPod:
    """A Failed pod the kubelet rejected at admission: what the storm report needs of it."""

    namespace: str
    name: str
    owner: Owner | None
    reason: str
    node: str
    created: str  # metadata.creationTimestamp, RFC 3339 ("" when absent)
    labels: tuple[tuple[str, str], ...]


@dataclass(slots=True)
class Inventory:
    state: ClusterState = field(default_factory=ClusterState)
    workloads: list[Workload] = field(default_factory=list)
    rejected: list[RejectedPod] = field(default_factory=list)
    # The controllers of the active pods that hold an extended resource (few): the audit tells
    # pods a scheduler placed from pods whose controller pinned nodeName.
    device_pod_owners: dict[str, Owner] = field(default_factory=dict)
    pods_read: int = 0  # every pod, terminal ones included
    claims_listed: bool = False  # a live list of ResourceClaims ran (none found is then clean)
    facts: SnapshotFacts = field(default_factory=SnapshotFacts)  # what was read, for the report
    _by_uid: dict[str, Workload] = field(default_factory=dict)
    _by_name: dict[tuple[str, str, str], Workload] = field(default_factory=dict)

    def workload(self, owner: Owner) -> Workload | None:
        """The workload an ownerReference points at (by uid, else kind/namespace/name)."""
        found = self._by_uid.get(owner.uid)
        if found is not None:
            return found
        return self._by_name.get((owner.kind, owner.namespace, owner.name))

    def missing(self) -> dict[str, str]:
        """The inputs this inventory lacks (``WORKLOADS`` ...), in the order they are read, and
        what to add to read them."""
        missing = {}
        if not self.workloads:
            missing[WORKLOADS] = f"no workloads were read: add {WORKLOAD_LIST} to the kubectl get"
        if not self.facts.failed_pods and not self.rejected:
            missing[FAILED_PODS] = (
                "no Failed pods were read: kubelet rejections leave them behind (none in the cluster, or the "
                "snapshot left them out)"
            )
        if not self.pods_read:
            missing[PODS] = "no pods were read: take nodes and pods together ('kubectl get nodes,pods -A')"
        devices = self.state.devices
        if not self.claims_listed and (devices is None or not devices.claim_keys()):
            missing[CLAIMS] = (
                "no ResourceClaims were read: add resourceslices,resourceclaims,deviceclasses to the "
                "kubectl get (none in the cluster, or the snapshot left them out)"
            )
        return missing

    def top_controller(self, owner: Owner) -> Owner:
        """Follow controller references up while the owner is known: Pod → ReplicaSet → Deployment,
        Pod → Job → CronJob; the direct owner when the chain is not in the inventory."""
        seen = {owner.uid}
        while (known := self.workload(owner)) is not None and known.owner is not None:
            if known.owner.uid in seen:
                break  # a reference loop: stop where it closes
            owner = known.owner
            seen.add(owner.uid)
        return owner


class InventoryBuilder:
    """Adds Kubernetes objects to an ``Inventory``; raises ``FieldError`` on unusable fields.
    ``workloads``: the table of custom resources whose templates are read too."""

    def __init__(self, workloads: WorkloadTable = BUILT_IN) -> None:
        self.inventory = Inventory()
        self.workloads = workloads

    def add(self, obj: Mapping[str, Any]) -> None:
        self.inventory.facts.observe(obj)
        kind = obj.get("kind")
        if kind == "Node":
            self.inventory.state.set_node(node_from(obj))
        elif kind == "Pod":
            self._add_pod(obj)
        elif (kind in WORKLOAD_KINDS and pod_shape(obj) is not None) or self.workloads.kind_of(obj):
            self._add_workload(obj, self.workloads.shapes(obj) or [])
        elif kind in DRA_KINDS and api_group(obj) == "resource.k8s.io":
            self._add_dra(obj)
        elif kind == NODE_RESOURCE_TOPOLOGY.name and api_group(obj) == NODE_RESOURCE_TOPOLOGY.group:
            read_topology(self.inventory.state, obj)  # as the snapshot loader reads it

    def _add_dra(self, obj: Mapping[str, Any]) -> None:
        """A ResourceSlice, ResourceClaim, DeviceClass or DeviceTaintRule, into the device index
        the audit's device findings read, as the snapshot loader and the informer fill it."""
        state = self.inventory.state
        if state.devices is None:
            state.devices = DeviceIndex()
        DRA_KINDS[obj["kind"]](state.devices, obj)

    def _add_pod(self, pod: Mapping[str, Any]) -> None:
        inventory = self.inventory
        inventory.pods_read += 1
        rejection = admission_rejection(pod)
        if rejection is not None:
            metadata = pod.get("metadata") or {}
            spec = pod.get("spec") or {}
            labels = metadata.get("labels") or {}
            inventory.rejected.append(
                RejectedPod(
                    namespace=str(metadata.get("namespace") or "default"),
                    name=str(metadata.get("name") or ""),
                    owner=controller_owner(pod),
                    reason=sys.intern(rejection.reason),
                    node=sys.intern(str(spec.get("nodeName") or "")),
                    created=str(metadata.get("creationTimestamp") or ""),
                    labels=tuple(sorted((str(k), str(v)) for k, v in labels.items()))
                    if isinstance(labels, Mapping)
                    else (),
                )
            )
            return
        key = object_key(pod)
        record = pod_record(pod)
        inventory.state.set_pod(key, record)
        if record is not None and any(True for _ in record.devices):
            owner = controller_owner(pod)
            if owner is not None:
                inventory.device_pod_owners[key] = owner

    def _add_workload(self, obj: Mapping[str, Any], templates: list[TemplateShape]) -> None:
        metadata = obj.get("metadata") or {}
        namespace = str(metadata.get("namespace") or "default")
        name = str(metadata.get("name") or "")
        uid = str(metadata.get("uid") or "")
        # Only pinned templates are judged, so only theirs are kept (and validated now).
        pinned = tuple(
            PinnedTemplate(obj, t.shape, PodUnderReview.from_shape(t.shape), t.where, t.scheduler)
            for t in templates
            if t.shape.spec.get("nodeName")
        )
        node_name = pinned[0].shape.spec["nodeName"] if pinned else ""
        workload = Workload(
            kind=str(obj["kind"]),
            api_version=str(obj.get("apiVersion") or ""),
            namespace=namespace,
            name=name,
            uid=uid,
            owner=controller_owner(obj),
            node_name=str(node_name),
            replicas=_replicas(obj),
            pinned=pinned,
        )
        inventory = self.inventory
        inventory.workloads.append(workload)
        if uid:
            inventory._by_uid[uid] = workload
        inventory._by_name[(workload.kind, namespace, name)] = workload


def _replicas(obj: Mapping[str, Any]) -> int:
    """How many pods the workload asks for at once (what a pinned template multiplies)."""
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Job":
        value = spec.get("parallelism", 1)
    elif obj.get("kind") in ("DaemonSet", "CronJob"):
        value = 1
    else:
        value = spec.get("replicas", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 1


def read_inventory(
    paths: Iterable[str], workloads: WorkloadTable = BUILT_IN, progress: Progress | None = None
) -> Inventory:
    """An ``Inventory`` from snapshot files; raises ``SnapshotError`` listing every problem.
    ``progress`` hears how many objects were read (a line on a terminal)."""
    try:
        return read_snapshot(paths, lambda documents: _read_inventory(documents, workloads, progress))
    finally:
        if progress is not None:
            progress.done()


def _read_inventory(
    documents: Iterable[Document | ManifestError], workloads: WorkloadTable, progress: Progress | None
) -> Inventory:
    builder = InventoryBuilder(workloads)
    problems: list[str] = []
    for count, doc in enumerate(documents):
        if progress is not None and count % 1024 == 0:
            progress.update("the snapshot", count)
        if isinstance(doc, ManifestError):
            problems.append(str(doc))
            continue
        try:
            builder.add(doc.obj)
        except FieldError as err:
            problems.append(f"{doc.location}: {doc.obj['kind']}: field {err}")
    if problems:
        raise SnapshotError(problems)
    return builder.inventory


class Progress:
    """A progress line on stderr for live reads that take more than a second (TTY only)."""

    def __init__(self, stream: IO[str] | None = None, delay: float = 1.0, clock=time.monotonic) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty()
        self.delay = delay
        self.clock = clock
        self.started = clock()
        self.shown = False

    def update(self, resource: str, count: int) -> None:
        if self.enabled and self.clock() - self.started >= self.delay:
            self.stream.write(f"\rreading {resource}: {count:,} objects\x1b[K")
            self.stream.flush()
            self.shown = True

    def done(self) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()


def live_inventory(
    api, page_size: int = 500, progress: Progress | None = None, workloads: WorkloadTable = BUILT_IN
) -> Inventory:
    """One paginated list of nodes, pods and each workload kind (``api``: ``ApiServer``): the
    built-in ones, and the custom resources of ``workloads`` the API server serves (discovered;
    a kind it does not serve is skipped).

    Objects whose fields cannot be read are errors, as in snapshots: ``SnapshotError``.
    """
    builder = InventoryBuilder(workloads)
    problems: list[str] = []
    dra = _served(api, DRA_RESOURCES)
    builder.inventory.claims_listed = bool(dra)
    custom = served_custom_resources(api, workloads)
    for resource, kind, api_version in (*LIVE_RESOURCES, *dra, *_served(api, TOPOLOGY_RESOURCES), *custom):
        for count, obj in enumerate(_pages(api, resource, page_size), 1):
            obj.setdefault("kind", kind)
            obj.setdefault("apiVersion", api_version)
            try:
                builder.add(obj)
            except FieldError as err:
                name = (obj.get("metadata") or {}).get("name")
                problems.append(f"{resource} {name}: field {err}")
            if progress is not None and count % page_size == 0:
                progress.update(resource, count)
    if progress is not None:
        progress.done()
    if problems:
        raise SnapshotError(problems)
    return builder.inventory


def _served(api, resources: tuple[tuple[str, str, str], ...]) -> tuple[tuple[str, str, str], ...]:
    """``resources`` (of one group version) where the cluster serves them, else none; a discovery
    that fails counts as not served (the audit then says its device findings were not judged,
    and reads no NRT)."""
    from .apiserver import ApiError  # the HTTP client: live reads only

    try:
        return resources if api.serves(resources[0][2]) else ()
    except ApiError:
        return ()


def served_custom_resources(api, workloads: WorkloadTable) -> list[tuple[str, str, str]]:
    """(list path, kind, apiVersion) of each custom resource of the table the cluster serves."""
    served = api.served_kinds({w.group for w in workloads.kinds})
    return [
        (path, w.kind, api_version)
        for w in workloads.kinds
        if (found := served.get((w.group, w.kind))) is not None
        for path, api_version in (found,)
    ]


def _pages(api, resource: str, page_size: int) -> Iterable[dict[str, Any]]:
    token = ""
    while True:
        page = api.list_page(resource, page_size, token)
        yield from page.items
        token = page.continue_token
        if not token:
            return
