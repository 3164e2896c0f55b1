"""Capacity held for allowed binds until the watch shows the pod bound: the bind guard's record
and its counting rules."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..kube.ports import HostPort
from ..state.apiserver import ApiServer
from ..state.model import ClusterState, NodeUsage, PodRecord
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
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None  # a foreign or damaged entry holds nothing

    @classmethod
    def of(
        cls, record: PodRecord, node: str, ttl: float, now: float, confirm_within: float | None = None
    ) -> Reservation:
        requests = {r: a for r, a in record.requests.items() if a}
        confirm_by = now + confirm_within if confirm_within is not None else None
        return cls(record.key, node, requests, record.host_ports, now + ttl, confirm_by, record.scheduler)


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


def usage_with(usage: NodeUsage, reservations: list[Reservation]) -> NodeUsage:
    """The node's usage as if every reserved pod were already bound there."""
    if not reservations:
        return usage
    requested = dict(usage.requested)
    ports = usage.host_ports.copy()
    pods = dict(usage.pods)
    for reservation in reservations:
        for resource, amount in reservation.requests.items():
            requested[resource] = requested.get(resource, 0) + amount
        ports.update(reservation.host_ports)
        pods[f"reserved/{reservation.pod}"] = PodRecord(
            reservation.pod, reservation.node, reservation.requests, reservation.host_ports, "", None, False
        )
    return NodeUsage(requested, pods, ports)


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
