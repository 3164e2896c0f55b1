"""The API-server double: the fake API server's store, watches and Leases, plus the writes a
cluster's components make, each admitted through the webhooks first.

``tests/helpers/fake_apiserver.py`` keeps the truth and serves it over HTTP to the guard's informer
(lists, watches delivered ``watch_lag`` late) and its Leases. The cluster's own components
(controllers, schedulers, kubelets, the DRA driver) write through ``ApiDouble`` in process:
``create``, ``update`` (the main resource or ``status``) and ``bind`` (``pods/binding``). Each
goes through admission as kube-apiserver's handlers do, then lands in the store, whose watch
events every reader sees late.

Upstream, what is kept: ``registry/generic/registry/store.go`` (Create: mutating admission
sees the object before ``BeforeCreate`` fills uid and the generated name, validating admission
after it; Update: a stale resourceVersion is a 409), ``pkg/registry/core/pod/storage/
storage.go`` (``BindingREST``: a pod already assigned is a 409, binding sets nodeName and the
PodScheduled condition), and the status strategies (a status write keeps spec and metadata).
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import orjson

from tests.helpers.fake_apiserver import Cluster

from .webhooks import Attributes, Denied, Dispatcher


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


RESOURCES = {
    "pods": Resource("", "v1", "Pod"),
    "nodes": Resource("", "v1", "Node", namespaced=False),
    "deployments": Resource("apps", "v1", "Deployment"),
    "replicasets": Resource("apps", "v1", "ReplicaSet"),
    "statefulsets": Resource("apps", "v1", "StatefulSet"),
    "daemonsets": Resource("apps", "v1", "DaemonSet"),
    "jobs": Resource("batch", "v1", "Job"),
    "cronjobs": Resource("batch", "v1", "CronJob"),
    "replicationcontrollers": Resource("", "v1", "ReplicationController"),
    "podtemplates": Resource("", "v1", "PodTemplate"),
    "resourceclaims": Resource("resource.k8s.io", "v1", "ResourceClaim"),
    "resourceslices": Resource("resource.k8s.io", "v1", "ResourceSlice", namespaced=False),
    "deviceclasses": Resource("resource.k8s.io", "v1", "DeviceClass", namespaced=False),
    # A CRD of NFD's topology-updater: one per node, listed and watched by the guard's informer.
    "noderesourcetopologies": Resource("topology.node.k8s.io", "v1alpha2", "NodeResourceTopology", False),
}
# What the fake server does not list for the informer, kept in the same store.
EXTRA = ("deployments", "replicasets", "statefulsets", "daemonsets", "jobs", "cronjobs",
         "replicationcontrollers", "podtemplates")  # fmt: skip
STALE = "the object has been modified; please apply your changes to the latest version"
NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace by the API server


def fresh_cluster(watch_lag: float) -> Cluster:
    """A store for the box: DRA and NodeResourceTopologies served, bookmarks often, every watch
    ``watch_lag`` late."""
    cluster = Cluster(bookmark_every=0.2, serves_dra=True, serves_topologies=True, watch_lag=watch_lag)
    for resource in EXTRA:
        keep(cluster, resource)
    return cluster


def keep(cluster: Cluster, resource: str) -> None:
    """Room in the store for a resource the fake server does not serve to the informer."""
    cluster.objects[resource], cluster.log[resource] = {}, []
    cluster.floor[resource], cluster.faults[resource] = 0, []


def plural(name: str) -> str:
    """The resource of a ``RESOURCES`` name: ``jobs.batch.volcano.sh`` is ``jobs``."""
    return name.partition(".")[0]


class ApiDouble:
    """The writes of the cluster's components, admitted by ``dispatcher`` (``None``: no
    webhooks configured, the guard not installed)."""

    def __init__(self, cluster: Cluster, dispatcher: Dispatcher | None = None) -> None:
        self.cluster, self.dispatcher = cluster, dispatcher
        self.resources = dict(RESOURCES)
        self.namespaces: dict[str, dict[str, str]] = {}
        self.writes = Counter()  # mutating requests served, denied ones included, by verb
        self.denied = Counter()  # by "resource/subresource"
        self.warnings: list[str] = []
        self.events: list[dict[str, Any]] = []
        self._names = itertools.count(1)
        self._store = threading.Lock()  # one write lands at a time, as etcd's transactions do

    # -- setup ----------------------------------------------------------------------------

    def install(self, name: str, resource: Resource) -> None:
        """Serve a custom resource (its CRD installed): ``name`` is ``<plural>.<group>``."""
        self.resources[name] = resource
        keep(self.cluster, name)

    def add_namespace(self, name: str, labels: dict[str, str] | None = None) -> None:
        self.namespaces[name] = {**(labels or {}), NAME_LABEL: name}

    def namespace_labels(self, name: str) -> dict[str, str] | None:
        return self.namespaces.get(name)

    def load(self, resource: str, objects: list[dict[str, Any]]) -> None:
        """Objects that existed before anyone watched (no events, no admission)."""
        for obj in objects:
            obj.setdefault("metadata", {}).setdefault("uid", f"{resource}-{obj['metadata']['name']}")
        self.cluster.load(resource, objects)

    # -- reads (the truth, now) -------------------------------------------------------------

    def list(self, resource: str) -> list[dict[str, Any]]:
        return self.cluster.truth(resource)

    def get(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self.cluster.changed:
            for raw in self.cluster.objects[resource].values():
                obj = orjson.loads(raw)
                if obj["metadata"]["name"] == name and obj["metadata"].get("namespace", "") == namespace:
                    return obj
        return None

    # -- writes ---------------------------------------------------------------------------

    def create(self, resource: str, obj: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
        """POST: mutating admission on the object as sent, then name and uid, then validating
        admission, then the store. Returns the stored object; ``Denied`` otherwise."""
        kind = self.resources[resource]
        obj = copy.deepcopy(obj)
        metadata = obj.setdefault("metadata", {})
        namespace = metadata.get("namespace", "") if kind.namespaced else ""
        obj.update(apiVersion=kind.api_version, kind=kind.kind)
        self.writes["create"] += 1
        attrs = self._attributes("CREATE", resource, namespace, metadata.get("name", ""), obj, None, user)
        if self.dispatcher is not None:
            obj = self._admit(self.dispatcher.mutating_only, attrs, resource)
        metadata = obj["metadata"]
        if not metadata.get("name"):
            metadata["name"] = f"{metadata['generateName']}{next(self._names):05d}"
        metadata["uid"] = f"{resource}-{namespace}-{metadata['name']}-{next(self._names)}"
        metadata["creationTimestamp"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        attrs.obj, attrs.name = obj, metadata["name"]
        if self.dispatcher is not None:
            obj = self._admit(self.dispatcher.validating_only, attrs, resource)
        with self._store:
            if self.get(resource, namespace, metadata["name"]) is not None:
                raise Denied(409, "AlreadyExists", f'{resource} "{metadata["name"]}" already exists')
            self.cluster.put(resource, obj)
            return self._stored(resource, obj)

    def update(
        self, resource: str, obj: dict[str, Any], user: dict[str, Any], subresource: str = ""
    ) -> dict[str, Any]:
        """PUT of the object or of its ``status``: a stale resourceVersion is a 409; a status
        write keeps the stored spec and metadata."""
        metadata = obj["metadata"]
        namespace, name = metadata.get("namespace", ""), metadata["name"]
        old = self.get(resource, namespace, name)
        self.writes["update"] += 1
        if old is None:
            raise Denied(404, "NotFound", f'{resource} "{name}" not found')
        new = copy.deepcopy(obj)
        if subresource == "status":
            new = {**old, "status": new.get("status") or {}}
        attrs = self._attributes("UPDATE", resource, namespace, name, new, old, user, subresource)
        if self.dispatcher is not None:
            new = self._admit(self.dispatcher.admit, attrs, f"{resource}/{subresource}".rstrip("/"))
        with self._store:
            current = self.get(resource, namespace, name)
            wanted = metadata.get("resourceVersion")
            if current is None or (wanted and wanted != current["metadata"]["resourceVersion"]):
                raise Denied(
                    409, "Conflict", f'Operation cannot be fulfilled on {resource} "{name}": {STALE}'
                )
            self.cluster.put(resource, new)
            return self._stored(resource, new)

    def bind(
        self, namespace: str, name: str, uid: str, node: str, user: dict[str, Any], legacy: bool = False
    ) -> None:
        """POST pods/binding, as kube-scheduler's DefaultBinder sends it; ``legacy``: POST
        ``namespaces/<ns>/bindings`` instead (``LegacyBindingREST``, the same Binding admitted as
        the ``bindings`` resource with no subresource)."""
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        self.writes["bind"] += 1
        resource, subresource = ("bindings", "") if legacy else ("pods", "binding")
        attrs = Attributes(
            "CREATE",
            "",
            "v1",
            resource,
            "Binding",
            namespace,
            name,
            binding,
            subresource=subresource,
            user=user,
        )
        if self.dispatcher is not None:
            self._admit(self.dispatcher.admit, attrs, f"{resource}/{subresource}".rstrip("/"))
        with self._store:
            pod = self.get("pods", namespace, name)
            if pod is None or pod["metadata"]["uid"] != uid:
                raise Denied(404, "NotFound", f'pods "{name}" not found')
            if pod["spec"].get("nodeName"):
                raise Denied(
                    409, "Conflict", f"pod {name} is already assigned to node {pod['spec']['nodeName']!r}"
                )
            pod["spec"]["nodeName"] = node
            conditions = [
                c for c in pod.setdefault("status", {}).get("conditions", []) if c["type"] != "PodScheduled"
            ]
            pod["status"]["conditions"] = [*conditions, {"type": "PodScheduled", "status": "True"}]
            self.cluster.put("pods", pod)

    def record_event(self, obj: dict[str, Any], reason: str, message: str, user: dict[str, Any]) -> None:
        """An Event about ``obj`` (a write, not admitted by these webhooks)."""
        self.writes["event"] += 1
        metadata = obj["metadata"]
        involved = {"kind": obj.get("kind", ""), "namespace": metadata.get("namespace", ""),
                    "name": metadata["name"], "uid": metadata.get("uid", "")}  # fmt: skip
        with self._store:
            self.events.append({"involvedObject": involved, "reason": reason, "message": message,
                                "source": user.get("username", "")})  # fmt: skip

    # -- inside ---------------------------------------------------------------------------

    def _attributes(self, operation, resource, namespace, name, obj, old, user, subresource="") -> Attributes:
        kind = self.resources[resource]
        return Attributes(
            operation, kind.group, kind.version, plural(resource), kind.kind, namespace, name, obj, old,
            subresource=subresource, user=user,
        )  # fmt: skip

    def _admit(self, step, attrs: Attributes, what: str) -> dict[str, Any]:
        try:
            admitted = step(attrs)
        except Denied:
            self.denied[what] += 1
            raise
        self.warnings.extend(admitted.warnings)
        return admitted.obj

    def _stored(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        return orjson.loads(self.cluster.objects[resource][obj["metadata"]["uid"]])
