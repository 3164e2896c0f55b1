"""A node's NUMA zones and topology manager, from its NodeResourceTopology object.

The exporters (NFD ``nfd-topology-updater``, RTE) publish one ``topology.node.k8s.io/v1alpha2``
``NodeResourceTopology`` per node, named after it. The guard keeps of it only what the topology
manager's admission reads (topology-admission-spec §5.3, §6): the NUMA zones (``type: Node``,
``node-<id>``), per resource each zone's capacity, allocatable and available, and the policy and
scope. Snapshots (``snapshot.py``) and the live informer (``ClusterState.set_topology``) build the
same record with ``topology_from``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..kube.errors import MAPPING, FieldError
from ..kube.quantity import format_amount
from ..kube.resources import (
    ResourceVector,
    container_requests,
    containers,
    is_extended_resource,
    is_sidecar,
    qos_class,
    resource_list,
)

POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
SCOPES = ("container", "pod")
CONTAINER_SCOPE = "container"
MAX_NUMA_ID = 63  # SP ``createNUMANodeList`` drops ids past 64 bits of a mask
# The deprecated ``topologyPolicies[0]`` (SP ``nodeconfig/topologymanager.go :: updateFromPolicies``).
_LEGACY_POLICIES = {
    "SingleNUMANodeContainerLevel": ("single-numa-node", "container"),
    "SingleNUMANodePodLevel": ("single-numa-node", "pod"),
    "RestrictedContainerLevel": ("restricted", "container"),
    "RestrictedPodLevel": ("restricted", "pod"),
    "BestEffortContainerLevel": ("best-effort", "container"),
    "BestEffortPodLevel": ("best-effort", "pod"),
}
FINGERPRINT = "nodeTopologyPodsFingerprint"
FINGERPRINT_METHOD = "nodeTopologyPodsFingerprintMethod"
CPU = "cpu"
INIT, SIDECAR, APP, POD = "init container", "sidecar", "container", "pod"


def is_memory(resource: str) -> bool:
    return resource == "memory" or resource.startswith("hugepages-")


@dataclass(frozen=True, slots=True)
class Unit:
    """What one ``Admit`` step aligns: a container (container scope) or the pod (pod scope).
    ``cpu`` in millicores (whole CPUs only), ``memory`` per memory type, ``devices`` per
    device-plugin resource; only what a hint provider gives hints for (§5.1)."""

    kind: str
    name: str
    cpu: int = 0
    memory: Mapping[str, int] = field(default_factory=dict)
    devices: Mapping[str, int] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not self.cpu and not self.memory and not self.devices

    def describe(self) -> str:
        amounts = {CPU: self.cpu, **self.memory, **self.devices}
        asked = ", ".join(f"{r} {format_amount(r, a)}" for r, a in amounts.items() if a)
        who = "the pod" if self.kind == POD else f"{self.kind} {self.name!r}"
        return f"{who} ({asked})"

    def on(self, aligned: Mapping[str, Any], memory_manager: bool) -> Unit:
        """This unit on a node whose zones list ``aligned``: what no provider there aligns is
        dropped (no static CPU manager, no memory manager, no device with NUMA affinity)."""
        cpu = self.cpu if CPU in aligned else 0
        memory = self.memory if memory_manager else {}
        devices = {r: a for r, a in self.devices.items() if r in aligned}
        if cpu == self.cpu and memory is self.memory and len(devices) == len(self.devices):
            return self
        return Unit(self.kind, self.name, cpu, memory, devices)


Footprint = tuple[Unit, ...]  # a pod's units in admission order; () when it aligns nothing


def footprint(spec: Mapping[str, Any], requests: Mapping[str, int] | None = None) -> Footprint:
    """What a pod asks every NUMA-aware hint provider for, container by container, on any node
    (``on`` narrows it to one node's zones): whole CPUs and memory types of a Guaranteed pod
    without pod-level resources (``guaranteedCPUs``, ``getRequestedResources``), extended
    resources for any QoS (device plugins: §2.3). Empty when nothing is asked: most pods.

    With the pod's ``requests``, a pod that asks for no extended resource and whose containers
    do not all set cpu and memory limits (so it cannot be Guaranteed) is answered without
    reading a container again: most pods, at every pod event and decision."""
    if requests is not None and not _may_ask_a_hint(spec, requests):
        return ()
    units = container_units(spec)
    return units if any(not u.empty for u in units) else ()


def _may_ask_a_hint(spec: Mapping[str, Any], requests: Mapping[str, int]) -> bool:
    # Plain loops: this runs for every pod event, and generators cost more than the test.
    for name, amount in requests.items():
        if amount > 0 and is_extended_resource(name):
            return True
    for key in ("containers", "initContainers"):
        for container in containers(spec, key):
            if not _limits_cpu_and_memory(container):
                return False
    return True


def _limits_cpu_and_memory(container: Mapping[str, Any]) -> bool:
    resources = container.get("resources")
    limits = resources.get("limits") if isinstance(resources, Mapping) else None
    return isinstance(limits, Mapping) and CPU in limits and "memory" in limits


def container_units(spec: Mapping[str, Any]) -> Footprint:
    """Every container's unit, in admission order, empty ones included."""
    guaranteed = qos_class(spec) == "Guaranteed" and not pod_level_resources(spec)
    return tuple(_container_unit(kind, c, where, guaranteed) for kind, c, where in pod_containers(spec))


def pod_containers(spec: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any], str]]:
    """Every container in admission order, init (regular or sidecar) then app, with its field."""
    found = [
        (SIDECAR if is_sidecar(c) else INIT, c, f"spec.initContainers[{i}]")
        for i, c in enumerate(containers(spec, "initContainers"))
    ]
    return found + [(APP, c, f"spec.containers[{i}]") for i, c in enumerate(containers(spec, "containers"))]


def pod_level_resources(spec: Mapping[str, Any]) -> bool:
    """``IsPodLevelResourcesSet``: such pods get no CPU or memory hints (§2.1, §2.2)."""
    resources = spec.get("resources")
    if not isinstance(resources, Mapping):
        return False
    return any(
        r == CPU or is_memory(r)
        for key in ("requests", "limits")
        if isinstance(resources.get(key), Mapping)
        for r in resources[key]
    )


def _container_unit(kind: str, container: Mapping[str, Any], where: str, guaranteed: bool) -> Unit:
    requests: ResourceVector = container_requests(container, where)
    cpu = requests.get(CPU, 0)
    whole_cpu = cpu if guaranteed and cpu % 1000 == 0 else 0
    memory = {r: a for r, a in requests.items() if is_memory(r) and a > 0} if guaranteed else {}
    devices = {r: a for r, a in requests.items() if a > 0 and is_extended_resource(r)}
    return Unit(kind, str(container.get("name") or ""), whole_cpu, memory, devices)


@dataclass(frozen=True, slots=True)
class ZoneAmounts:
    """One resource across a node's NUMA zones, in the order of ``NodeTopology.zones``; amounts
    in the guard's base units (millicores for cpu). ``listed``: the zones that name the resource
    (a bit per zone index): the CPU manager's masks span only the NUMA nodes that have CPUs."""

    listed: int
    capacity: tuple[int, ...]
    allocatable: tuple[int, ...]
    available: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """What the kubelet's topology manager on one node decides with (topology-admission-spec §6).

    ``policy`` and ``scope`` are None where the object does not say: the check then does not run
    for the node (§6.2: never a guess), unless the guard's config names them for its pool.
    ``zones``: the NUMA ids, ascending; bit ``i`` of a mask is ``zones[i]``.
    """

    node: str
    zones: tuple[int, ...]
    resources: Mapping[str, ZoneAmounts]
    policy: str | None = None
    scope: str | None = None
    max_numa_nodes: int | None = None
    fingerprint: str = ""  # ``nodeTopologyPodsFingerprint``: whom ``available`` counts (issue 27 item 4)
    fingerprint_method: str = ""  # ``nodeTopologyPodsFingerprintMethod``: ``all`` where absent

    @property
    def effective_scope(self) -> str:
        """The kubelet's default scope, ``container``, where none was published (§6.2)."""
        return self.scope or CONTAINER_SCOPE

    def zone_name(self, index: int) -> str:
        return f"node-{self.zones[index]}"


def topology_from(obj: Mapping[str, Any]) -> NodeTopology:
    """A ``NodeTopology`` from a NodeResourceTopology object; errors name the field."""
    metadata = obj.get("metadata")
    name = metadata.get("name") if isinstance(metadata, MAPPING) else None
    if not isinstance(name, str) or not name:
        raise FieldError("metadata.name", "must be the node's name")
    attributes = _attributes(obj.get("attributes"), "attributes")
    policy, scope = _legacy_policy(obj.get("topologyPolicies"))
    if attributes.get("topologyManagerPolicy") in POLICIES:  # invalid values are ignored (IsValidPolicy)
        policy = attributes["topologyManagerPolicy"]
    if attributes.get("topologyManagerScope") in SCOPES:
        scope = attributes["topologyManagerScope"]
    zones, resources = _zones(obj.get("zones"))
    return NodeTopology(
        node=sys.intern(name),
        zones=zones,
        resources=resources,
        policy=policy,
        scope=scope,
        max_numa_nodes=_max_numa_nodes(attributes.get("topologyManagerMaxNUMANodes")),
        fingerprint=attributes.get(FINGERPRINT, ""),
        fingerprint_method=attributes.get(FINGERPRINT_METHOD, ""),
    )


def _attributes(value: object, field: str) -> dict[str, str]:
    """``[{name, value}]`` as a dict; the first of a repeated name wins, as SP's loop reads them."""
    if value is None:
        return {}
    if not isinstance(value, list):
        raise FieldError(field, "must be a list of {name, value}")
    found: dict[str, str] = {}
    for i, item in enumerate(value):
        if not isinstance(item, MAPPING) or not isinstance(item.get("name"), str):
            raise FieldError(f"{field}[{i}]", "must be {name, value} with a string name")
        raw = item.get("value")
        if not isinstance(raw, str):
            raise FieldError(f"{field}[{i}].value", "must be a string")
        found.setdefault(item["name"], raw)
    return found


def _legacy_policy(value: object) -> tuple[str | None, str | None]:
    """``topologyPolicies[0]``, deprecated: the six policy+scope names map, others say nothing."""
    if value is None:
        return None, None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise FieldError("topologyPolicies", "must be a list of strings")
    return _LEGACY_POLICIES.get(value[0], (None, None)) if value else (None, None)


def _max_numa_nodes(value: str | None) -> int | None:
    """``topologyManagerMaxNUMANodes``; SP ignores values that are not integers above 1."""
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        return None
    return number if number > 1 else None


def numa_id(name: object) -> int | None:
    """``node-<id>`` → id (NRT-API ``helper/numanode.NameToID``); None for other names or ids a
    64-bit mask cannot hold (SP ``createNUMANodeList`` drops those zones)."""
    if not isinstance(name, str) or not name.startswith("node-"):
        return None
    digits = name[len("node-") :]
    if not digits.isdigit() or int(digits) > MAX_NUMA_ID:
        return None
    return int(digits)


def _zones(value: object) -> tuple[tuple[int, ...], dict[str, ZoneAmounts]]:
    """The ``type: Node`` zones, by NUMA id, and each resource's amounts across them."""
    if value is None:
        return (), {}
    if not isinstance(value, list):
        raise FieldError("zones", "must be a list of zones")
    numa: dict[int, dict[str, tuple[int, int, int]]] = {}
    for i, zone in enumerate(value):
        if not isinstance(zone, MAPPING):
            raise FieldError(f"zones[{i}]", "must be a mapping")
        if zone.get("type") != "Node":
            continue  # sockets, caches and others: not NUMA nodes
        ident = numa_id(zone.get("name"))
        if ident is None:
            continue
        if ident in numa:
            raise FieldError(f"zones[{i}].name", f"{zone.get('name')!r} appears twice")
        numa[ident] = _zone_resources(zone.get("resources"), f"zones[{i}].resources")
    zones = tuple(sorted(numa))
    names = sorted({r for amounts in numa.values() for r in amounts})
    resources = {}
    for resource in names:
        rows = [numa[z].get(resource) for z in zones]
        resources[sys.intern(resource)] = ZoneAmounts(
            listed=sum(1 << i for i, row in enumerate(rows) if row is not None),
            capacity=tuple(row[0] if row else 0 for row in rows),
            allocatable=tuple(row[1] if row else 0 for row in rows),
            available=tuple(row[2] if row else 0 for row in rows),
        )
    return zones, resources


def _zone_resources(value: object, field: str) -> dict[str, tuple[int, int, int]]:
    """``[{name, capacity, allocatable, available}]`` (NRT-API ``ResourceInfo``: all three required)."""
    if value is None:
        return {}
    if not isinstance(value, list):
        raise FieldError(field, "must be a list of resources")
    found: dict[str, tuple[int, int, int]] = {}
    for i, item in enumerate(value):
        where = f"{field}[{i}]"
        if not isinstance(item, MAPPING) or not isinstance(item.get("name"), str) or not item["name"]:
            raise FieldError(where, "must be {name, capacity, allocatable, available} with a name")
        name = item["name"]
        amounts = []
        for key in ("capacity", "allocatable", "available"):
            if key not in item:
                raise FieldError(f"{where}.{key}", "is required (a quantity)")
            try:
                amounts.append(resource_list({name: item[key]}, where)[name])
            except FieldError as err:
                raise FieldError(f"{where}.{key}", err.message) from None
        found[name] = (amounts[0], amounts[1], amounts[2])
    return found
