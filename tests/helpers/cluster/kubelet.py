"""A kubelet per node: admits the pods bound to it in the kubelet's order, with the device
manager's per-device accounting, and fails the rejected ones as the kubelet does.

Upstream (``pkg/kubelet/``):

- ``kubelet.go`` ``NewMainKubelet``: admit handlers in this order: eviction, sysctls, the
  container manager's resource allocator (topology manager → device manager ``Allocate``),
  then the predicate handler (``lifecycle/predicate.go``). Eviction and sysctls never reject
  in the box (no pressure, no sysctls); the other two are here;
- ``cm/topologymanager``: on a node with NUMA zones, the ``single-numa-node`` policy refuses a
  Guaranteed pod whose exclusive CPUs fit no one zone (``TopologyAffinityError``, ``numa.py``);
- ``cm/devicemanager/manager.go`` ``devicesToAllocate``: the free devices are the healthy ones
  minus those allocated to active pods; too few is ``requested number of devices unavailable
  for <resource>. Requested: N, Available: M``, which ``cm/admission/errors.go`` turns into the
  reason ``UnexpectedAdmissionError`` and ``Allocate failed due to ..., which is unexpected``;
- ``lifecycle/predicate.go``: ``UpdatePluginResources`` first raises the node's allocatable
  device count to what is allocated (``sanitizeNodeAllocatable``), then the general predicates
  (``OutOf<resource>``: ``Node didn't have enough resource: <r>, requested: R, used: U,
  capacity: C``, cpu in millicores);
- ``kubelet_pods.go`` ``rejectPod``: phase ``Failed``, the reason, ``Pod was rejected: `` and
  the message, written to ``pods/status``;
- ``cm/dra/manager.go`` ``PrepareResources``, after admission in ``SyncPod``: a claim must be
  allocated and reserved for the pod, then the driver prepares it; a failure leaves the pod
  Pending with a ``FailedPrepareDynamicResources`` event and is retried.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from .apiserver import ApiDouble
from .cache import Cache
from .dra import DraDriver, PrepareError
from .kube import POD_SLOT, allocatable, is_active, pod_requests
from .numa import TOPOLOGY_AFFINITY, CpuManager
from .webhooks import Denied

UNEXPECTED = "UnexpectedAdmissionError"
SYNC_BACKOFF = 10.0  # pod_workers.go backOffPeriod: a pod whose sync failed is retried this much later


class Kubelet:
    def __init__(
        self, node: dict[str, Any], api: ApiDouble, lag: float, devices: dict[str, list[str]],
        driver: DraDriver | None = None, zones: list[int] | None = None,
    ) -> None:  # fmt: skip
        self.node, self.api, self.driver = node, api, driver
        self.cpus = CpuManager(zones) if zones else None  # None: no NUMA zones, topology manager off
        self.name = node["metadata"]["name"]
        self.user = {"username": f"system:node:{self.name}", "groups": ["system:nodes"]}
        self.cache = Cache(api.cluster, ("pods",), lag)
        self.devices = devices  # resource → device IDs the device plugin reports healthy
        self.allocated: dict[str, dict[str, str]] = {r: {} for r in devices}  # resource → device → pod
        self.admitted: dict[str, dict[str, float]] = {}  # pod uid → requests
        self.handled: set[str] = set()
        self.unprepared: set[str] = set()  # admitted pods whose claims are not prepared yet
        self.rejections = Counter()  # reason → pods
        self.retry_at: dict[str, float] = {}  # pod uid → next SyncPod after a failed prepare
        self.running_at: dict[str, float] = {}  # pod uid → when it was set Running (monotonic)

    def adopt(self, pods: list[dict[str, Any]]) -> None:
        """The pods already running here when the box starts: admitted, their devices held."""
        for pod in pods:
            if pod["spec"].get("nodeName") == self.name and is_active(pod):
                if self.cpus is not None and self.cpus.admit(pod):
                    raise ValueError(f"{pod['metadata']['name']}: its CPUs fit no NUMA zone of {self.name}")
                self._admit(pod)
                self.handled.add(pod["metadata"]["uid"])

    def step(self) -> None:
        self.cache.sync()
        arrived = sorted(
            (p for p in self.cache.list("pods")
             if p["spec"].get("nodeName") == self.name and p["metadata"]["uid"] not in self.handled
             and is_active(p)),
            key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]),
        )  # fmt: skip
        for pod in arrived:
            self.handled.add(pod["metadata"]["uid"])
            rejected = self._topology(pod) or self._allocate(pod) or self._predicates(pod)
            if rejected:
                self._reject(pod, *rejected)
                continue
            self._admit(pod)
            self.unprepared.add(pod["metadata"]["uid"])
        now = time.monotonic()
        for uid in sorted(self.unprepared):
            pod = self.cache.objects["pods"].get(uid)
            if pod is None or self.retry_at.get(uid, 0.0) > now:
                continue
            if not self._prepare(pod):
                self.retry_at[uid] = now + SYNC_BACKOFF
            else:
                self.unprepared.discard(uid)
                self._set_status(
                    pod, {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
                )
                self.running_at[uid] = time.monotonic()

    # -- admission, in the kubelet's order ------------------------------------------------------

    def _topology(self, pod: dict[str, Any]) -> tuple[str, str] | None:
        refused = self.cpus.admit(pod) if self.cpus is not None else None
        return (TOPOLOGY_AFFINITY, refused) if refused else None

    def _allocate(self, pod: dict[str, Any]) -> tuple[str, str] | None:
        requests = pod_requests(pod)
        for resource, devices in self.devices.items():
            needed = int(requests.get(resource, 0))
            available = [d for d in devices if d not in self.allocated[resource]]
            if needed > len(available):
                error = (f"requested number of devices unavailable for {resource}. "
                         f"Requested: {needed}, Available: {len(available)}")  # fmt: skip
                return UNEXPECTED, f"Allocate failed due to {error}, which is unexpected"
        return None

    def _predicates(self, pod: dict[str, Any]) -> tuple[str, str] | None:
        capacity = allocatable(self.node)
        for resource in self.devices:  # sanitizeNodeAllocatable
            capacity[resource] = max(capacity.get(resource, 0.0), float(len(self.allocated[resource])))
        used: dict[str, float] = {}
        for requests in self.admitted.values():
            for resource, amount in requests.items():
                used[resource] = used.get(resource, 0.0) + amount
        for resource, amount in pod_requests(pod).items():
            if not amount or used.get(resource, 0.0) + amount <= capacity.get(resource, 0.0):
                continue
            if resource == POD_SLOT:
                slots = f"used: {int(used.get(POD_SLOT, 0))}, capacity: {int(capacity.get(POD_SLOT, 0))}"
                return "OutOfpods", f"Node didn't have enough resource: pods, requested: 1, {slots}"
            scale = 1000 if resource == "cpu" else 1
            figures = [
                round(x * scale) for x in (amount, used.get(resource, 0.0), capacity.get(resource, 0.0))
            ]
            return f"OutOf{resource}", (
                f"Node didn't have enough resource: {resource}, requested: {figures[0]}, "
                f"used: {figures[1]}, capacity: {figures[2]}"
            )
        return None

    def _admit(self, pod: dict[str, Any]) -> None:
        uid, requests = pod["metadata"]["uid"], pod_requests(pod)
        self.admitted[uid] = requests
        for resource, devices in self.devices.items():
            needed = int(requests.get(resource, 0))
            for device in [d for d in devices if d not in self.allocated[resource]][:needed]:
                self.allocated[resource][device] = uid

    def _reject(self, pod: dict[str, Any], reason: str, message: str) -> None:
        self.rejections[reason] += 1
        if self.cpus is not None:  # a later handler refused it: its CPUs go back to the pool
            self.cpus.held.pop(pod["metadata"]["uid"], None)
        self._set_status(
            pod, {"phase": "Failed", "reason": reason, "message": f"Pod was rejected: {message}"}
        )

    def _prepare(self, pod: dict[str, Any]) -> bool:
        refs = pod["spec"].get("resourceClaims") or []
        if not refs:
            return True
        namespace = pod["metadata"]["namespace"]
        for ref in refs:
            claim = self.api.get("resourceclaims", namespace, ref.get("resourceClaimName", ""))
            reserved = [r.get("uid") for r in ((claim or {}).get("status") or {}).get("reservedFor") or []]
            try:
                if claim is None or pod["metadata"]["uid"] not in reserved:
                    name = ref.get("resourceClaimName")
                    raise PrepareError(f"pod {pod['metadata']['name']} is not allowed to use claim {name}")
                if self.driver is None:
                    raise PrepareError("no DRA driver on this node")
                self.driver.prepare(claim)
            except PrepareError as err:
                self.api.record_event(pod, "FailedPrepareDynamicResources",
                                      f"Failed to prepare dynamic resources: {err}", self.user)  # fmt: skip
                return False
        return True

    def _set_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        current = self.api.get("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
        if current is None:
            return
        current["status"] = {**(current.get("status") or {}), **status}
        try:
            self.api.update("pods", current, self.user, subresource="status")
        except Denied:  # a conflict: the status manager writes again from the latest pod
            current = self.api.get("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
            if current is not None:
                current["status"] = {**(current.get("status") or {}), **status}
                self.api.update("pods", current, self.user, subresource="status")
