"""A node's NUMA zones as its kubelet sees them (the static CPU manager under the topology
manager's ``single-numa-node`` policy, container scope), and the exporter that publishes them
as a NodeResourceTopology a little later, as NFD's topology-updater does.

Written from upstream, apart from the guard's ``kube.numa`` and ``checks.topology`` on purpose:

- ``pkg/kubelet/cm/cpumanager/policy_static.go`` ``guaranteedCPUs``: only a Guaranteed pod's
  containers with a whole number of CPUs get exclusive CPUs (and hints); every other container
  runs on the shared pool and gives no hint. ``generateCPUTopologyHints``: a mask is a hint
  when its zones have the CPUs free; it is preferred when it is as narrow as the narrowest
  mask whose zones *hold* that many CPUs at all (capacity, not what is free).
- ``pkg/kubelet/cm/topologymanager/policy_single_numa_node.go`` ``Merge``: only preferred
  one-zone hints are kept (``filterSingleNumaHints``); the pod is admitted only if the merged
  hint is preferred, else ``TopologyAffinityError`` with ``Resources cannot be allocated with
  Topology locality`` (``topology_manager.go``, ``lifecycle.PodAdmitResult``).
- ``pkg/kubelet/cm/topologymanager/scope_container.go`` ``Admit``: container by container,
  init containers first; each admitted container's CPUs are taken (``allocateAlignedResources``)
  before the next is judged. ``bitmask.IsNarrowerThan``: of equally narrow masks the lowest
  wins, so a one-zone container goes to the lowest-numbered zone with room.
- ``cpumanager/policy_static.go`` ``updateCPUsToReuse``: what an init container held is reused
  by the containers after it, so it is handed back once the pod's app containers are placed.

The box's kubelets run the memory manager's default policy ``None``, so the zones list ``cpu``
only: no memory is aligned, and an NRT that listed memory would claim an alignment the kubelet
does not make.
"""

from __future__ import annotations

import time
from typing import Any

from .kube import quantity

TOPOLOGY_AFFINITY = "TopologyAffinityError"
LOCALITY = "Resources cannot be allocated with Topology locality"
NRT = "noderesourcetopologies"
NRT_API = "topology.node.k8s.io/v1alpha2"


def exclusive_cpus(pod: dict[str, Any]) -> list[int]:
    """``guaranteedCPUs`` per container, init containers first: the whole CPUs it gets
    exclusively, 0 for one on the shared pool (the pod not Guaranteed, or a fractional CPU)."""
    spec = pod.get("spec") or {}
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    if not containers or not all(_guaranteed(c) for c in containers):
        return [0] * len(containers)
    cpus = []
    for container in containers:
        amount = quantity(container["resources"]["requests"]["cpu"])
        cpus.append(int(amount) if amount == int(amount) else 0)
    return cpus


def _guaranteed(container: dict[str, Any]) -> bool:
    """``qos.GetPodQOS``: cpu and memory limits set, and requests (defaulted to limits) equal."""
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = {**limits, **(resources.get("requests") or {})}
    return all(r in limits and quantity(requests[r]) == quantity(limits[r]) for r in ("cpu", "memory"))


class CpuManager:
    """The exclusive CPUs of each zone and which pod holds how many where."""

    def __init__(self, zones: list[int]) -> None:
        self.capacity = list(zones)  # CPUs per zone, zone i is ``node-<i>``
        self.held: dict[str, list[int]] = {}  # pod uid → CPUs it holds per zone

    def free(self) -> list[int]:
        return [cap - sum(h[i] for h in self.held.values()) for i, cap in enumerate(self.capacity)]

    def admit(self, pod: dict[str, Any]) -> str | None:
        """Container scope, in order: a container with exclusive CPUs needs one zone with that
        many free (a one-zone hint, preferred since one zone holds them), else the refusal's
        message; it takes them from the lowest such zone, what init containers before it held
        there first. Init containers' CPUs are not held once the app containers are placed."""
        free, held, reuse = self.free(), [0] * len(self.capacity), [0] * len(self.capacity)
        inits = len((pod.get("spec") or {}).get("initContainers") or [])
        for index, cpus in enumerate(exclusive_cpus(pod)):
            if not cpus:
                continue
            fits = [i for i in range(len(free)) if free[i] + reuse[i] >= cpus]
            if not fits:
                return LOCALITY
            zone = fits[0]
            reused = min(reuse[zone], cpus)
            reuse[zone] -= reused
            free[zone] -= cpus - reused
            held[zone] += cpus - reused
            if index < inits:
                reuse[zone] += cpus
        self.held[pod["metadata"]["uid"]] = [h - r for h, r in zip(held, reuse, strict=True)]
        return None


class Exporter:
    """NFD's topology-updater for one node: the NRT it published, rewritten ``lag`` seconds
    after the kubelet's zones changed (the updater's sleep interval, compressed)."""

    def __init__(self, node: str, cpus: CpuManager, lag: float) -> None:
        self.node, self.cpus, self.lag = node, cpus, lag
        self.published = cpus.free()
        self.changed_at: float | None = None

    def nrt(self) -> dict[str, Any]:
        """The object as the updater writes it: one ``type: Node`` zone per NUMA node, the
        policy and scope as attributes."""
        zones = [
            {"name": f"node-{i}", "type": "Node",
             "resources": [{"name": "cpu", "capacity": str(cap), "allocatable": str(cap),
                            "available": str(self.published[i])}]}
            for i, cap in enumerate(self.cpus.capacity)
        ]  # fmt: skip
        attributes = [{"name": "topologyManagerPolicy", "value": "single-numa-node"},
                      {"name": "topologyManagerScope", "value": "container"}]  # fmt: skip
        return {"apiVersion": NRT_API, "kind": "NodeResourceTopology", "metadata": {"name": self.node},
                "attributes": attributes, "zones": zones}  # fmt: skip

    def due(self) -> dict[str, Any] | None:
        """The NRT to write now, if the zones changed at least ``lag`` ago."""
        now, free = time.monotonic(), self.cpus.free()
        if free == self.published:
            self.changed_at = None
            return None
        if self.changed_at is None:
            self.changed_at = now
        if now - self.changed_at < self.lag:
            return None
        self.published, self.changed_at = free, None
        return self.nrt()
