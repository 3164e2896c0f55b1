"""Capacity held for allowed binds until the watch shows the pod bound: the bind guard's record
and its counting rules."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..kube.ports import HostPort
from ..kube.resources import is_extended_resource
from ..state.apiserver import ApiServer
from ..state.model import ClusterState, NodeUsage, PodRecord
from ..state.topology import APP, Footprint, Unit
from .lease import LeaseStore
from .names import MAX_OBJECT_NAME, bounded_name
from .table import Codec, LocalTable

ANNOTATION = "admit-guard.io/reservations"
LEASE_PREFIX = "admit-guard-node-"


def lease_name(node: str) -> str:
    """The Lease that holds a node's reservations."""
    return bounded_name(LEASE_PREFIX, node, MAX_OBJECT_NAME)


@dataclass(frozen=True, slots=True)
class Reservation:
    pod: str  # the pod's key in the state (its uid)
    node: str
    requests: dict[str, int]
    host_ports: tuple[HostPort, ...]
    expires: float
    # An unauthenticated caller's reservation ends here unless the state shows the pod on its
    # node by then: a forged review holds capacity for seconds, not a TTL. None: until the TTL.
    confirm_by: float | None = None
    # The pod's scheduler: a bind in flight holds the node's devices for it, as a bound pod does
    # (deviceScheduler). "" in records of earlier versions, which did not say.
    scheduler: str = ""
    # What the pod asks the NUMA-aware hint providers for (``PodRecord.numa``), so that every
    # replica places the bind in flight on the node's zones alike. Written only when not empty,
    # under a key earlier versions ignore; their records, without it, are placed by what this
    # replica's state knows of the pod (``footprint_for``).
    numa: Footprint = ()

    def as_json(self) -> dict[str, Any]:
        data = {
            "pod": self.pod,
            "node": self.node,
            "requests": self.requests,
            "hostPorts": [list(p) for p in self.host_ports],
            "expires": self.expires,
        }
        if self.confirm_by is not None:
            data["confirmBy"] = self.confirm_by
        if self.scheduler:
            data["scheduler"] = self.scheduler
        if self.numa:
            data["numa"] = [[u.kind, u.cpu, dict(u.memory), dict(u.devices)] for u in self.numa]
        return data

    @classmethod
    def from_json(cls, data: Any) -> Reservation | None:
        try:
            confirm_by = data.get("confirmBy")
            return cls(
                str(data["pod"]),
                str(data["node"]),
                {str(k): int(v) for k, v in data["requests"].items()},
                tuple((str(p[0]), str(p[1]), int(p[2])) for p in data.get("hostPorts") or ()),
                float(data["expires"]),
                float(confirm_by) if confirm_by is not None else None,
                str(data.get("scheduler") or ""),
                _numa(data.get("numa")),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None  # a foreign or damaged entry holds nothing

    @classmethod
    def of(
        cls, record: PodRecord, node: str, ttl: float, now: float, confirm_within: float | None = None
    ) -> Reservation:
        requests = {r: a for r, a in record.requests.items() if a}
        confirm_by = now + confirm_within if confirm_within is not None else None
        return cls(
            record.key,
            node,
            requests,
            record.host_ports,
            now + ttl,
            confirm_by,
            record.scheduler,
            record.numa,
        )


def _numa(data: Any) -> Footprint:
    """The ``numa`` of a stored record: ``[[kind, cpu, {memory}, {devices}], ...]``."""
    if not data:
        return ()
    return tuple(
        Unit(
            str(kind),
            "",
            int(cpu),
            {str(r): int(a) for r, a in memory.items()},
            {str(r): int(a) for r, a in devices.items()},
        )
        for kind, cpu, memory, devices in data
    )


def footprint_for(reservation: Reservation, state: ClusterState) -> Footprint:
    """What a reservation aligns: its own record's, else (a record of an earlier version, which
    did not say) its pod's as this state knows it, else its extended resources, which device
    plugins align for any pod (topology-admission-spec §2.3)."""
    if reservation.numa:
        return reservation.numa
    record = state.pods.get(reservation.pod)
    if record is not None:
        return record.numa
    devices = {r: a for r, a in reservation.requests.items() if a > 0 and is_extended_resource(r)}
    return (Unit(APP, "", 0, {}, devices),) if devices else ()


def kept(reservation: Reservation, state: ClusterState, now: float) -> bool:
    """Whether a stored reservation is written back: until its TTL, unless the pod ended, or its
    confirmation time passed without the state showing the pod on its node.

    A pod this state shows bound is kept too: another worker or replica whose watch lags still
    sees it pending, without its record in the node's usage, and must count the reservation.
    """
    if reservation.expires <= now or reservation.pod in state.ended:
        return False
    if reservation.confirm_by is None or now < reservation.confirm_by:
        return True
    record = state.pods.get(reservation.pod)
    return record is not None and record.node == reservation.node


def counts(reservation: Reservation, state: ClusterState, now: float) -> bool:
    """Whether a reservation adds to the node's usage in this state: kept, and the pod not yet
    bound here (once bound its own record counts, never both). A pod this state has not seen
    yet (a created one, or a watch behind another replica's) counts until its TTL."""
    if not kept(reservation, state, now):
        return False
    record = state.pods.get(reservation.pod)
    return record is None or not record.node


def usage_with(
    usage: NodeUsage, reservations: list[Reservation], state: ClusterState | None = None
) -> NodeUsage:
    """The node's usage as if every reserved pod were already bound there: after the pods bound
    since its NRT, in the order they were reserved, none of them counted by its NRT yet.
    ``state``: where a record of an earlier version finds its pod's footprint."""
    if not reservations:
        return usage
    requested = dict(usage.requested)
    ports = usage.host_ports.copy()
    pods = dict(usage.pods)
    unaccounted = dict(usage.unaccounted)
    for reservation in sorted(reservations, key=lambda r: (r.expires, r.pod)):
        for resource, amount in reservation.requests.items():
            requested[resource] = requested.get(resource, 0) + amount
        ports.update(reservation.host_ports)
        key = f"reserved/{reservation.pod}"
        numa = footprint_for(reservation, state) if state is not None else reservation.numa
        pods[key] = PodRecord(
            reservation.pod,
            reservation.node,
            reservation.requests,
            reservation.host_ports,
            "",
            None,
            False,
            numa=numa,
        )
        if numa:
            unaccounted[key] = None
    return NodeUsage(requested, pods, ports, unaccounted)


def merged(*stores: list[Reservation]) -> list[Reservation]:
    """One entry per pod over several stores' entries (the first seen wins), in order."""
    seen: dict[str, Reservation] = {}
    for entries in stores:
        for reservation in entries:
            seen.setdefault(reservation.pod, reservation)
    return list(seen.values())


RESERVATIONS = Codec.listing(Reservation)


def node_table(directory: Path) -> LocalTable:
    """The replica's table of reservations, a file per node under ``directory``."""
    return LocalTable(directory, RESERVATIONS)


def node_leases(api: ApiServer, namespace: str) -> LeaseStore:
    """A Lease per node in ``namespace``, holding that node's reservations."""
    return LeaseStore(api, namespace, prefix=LEASE_PREFIX, annotation=ANNOTATION, codec=RESERVATIONS)
