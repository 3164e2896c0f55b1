"""Capacity held for allowed binds until the watch shows the pod bound.

Between an allowed bind and the watch event that shows the pod on its node, another bind must
not be handed the same capacity: not by another thread, another gunicorn worker, or another
replica of the guard. Two stores, both "read, re-check, write":

- ``LocalTable``: one file per node in a directory the workers of one replica share (the pod's
  ``/tmp``), under ``flock``. Enough for pods whose resources only this replica's binds race
  for in practice (cpu, memory), and no API writes.
- ``LeaseStore``: one ``coordination.k8s.io/v1`` Lease per node in the guard's namespace,
  holding that node's reservations in an annotation, replaced with its ``resourceVersion``:
  a 409 means another writer won, so read again and re-check. The API server (etcd) is the
  only arbiter; the guard builds no consensus of its own.

A reservation ends when the state shows the pod bound (its own record then counts, never
both), deleted or terminal, or after its TTL.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..kube.ports import HostPort
from .apiserver import ApiError, ApiServer
from .model import ClusterState, NodeUsage, PodRecord

ANNOTATION = "admit-guard.io/reservations"
LEASE_PREFIX = "admit-guard-node-"


@dataclass(frozen=True, slots=True)
class Reservation:
    pod: str  # the pod's key in the state (its uid)
    node: str
    requests: dict[str, int]
    host_ports: tuple[HostPort, ...]
    expires: float
    seen: bool = True  # the pod was in the state when reserved (a bind), not only being created

    def as_json(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "node": self.node,
            "requests": self.requests,
            "hostPorts": [list(p) for p in self.host_ports],
            "expires": self.expires,
            "seen": self.seen,
        }

    @classmethod
    def from_json(cls, data: Any) -> Reservation | None:
        try:
            return cls(
                str(data["pod"]),
                str(data["node"]),
                {str(k): int(v) for k, v in data["requests"].items()},
                tuple((str(p[0]), str(p[1]), int(p[2])) for p in data.get("hostPorts") or ()),
                float(data["expires"]),
                bool(data.get("seen", True)),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None  # a foreign or damaged entry holds nothing

    @classmethod
    def of(cls, record: PodRecord, node: str, ttl: float, now: float, *, seen: bool = True) -> Reservation:
        requests = {r: a for r, a in record.requests.items() if a}
        return cls(record.key, node, requests, record.host_ports, now + ttl, seen)


def still_held(reservation: Reservation, state: ClusterState, now: float) -> bool:
    """Until the TTL, while the pod is pending (bound: its own record counts, never both).

    A bound pod that left the state was deleted or ended; a created pod not yet in the state
    is held until the watch shows it.
    """
    if reservation.expires <= now:
        return False
    record = state.pods.get(reservation.pod)
    if record is None:
        return not reservation.seen
    return not record.node


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


# ``decide(held) -> bool``: given the reservations still held on the node (the pod's own
# excluded), whether the new one fits. ``reserve`` returns that verdict; a True one is stored.
Decide = Callable[[list[Reservation]], bool]


class LocalTable:
    """Reservations shared by the workers of one replica: a flock'ed file per node."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def reserve(
        self, new: Reservation, state: ClusterState, decide: Decide, now: float, *, write: bool = True
    ) -> bool:
        path = self.directory / f"{new.node}.json"
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = [r for r in _entries(_read_all(fd)) if still_held(r, state, now) and r.pod != new.pod]
            fits = decide(held)
            if fits and write:
                data = orjson.dumps([r.as_json() for r in (*held, new)])
                os.lseek(fd, 0, os.SEEK_SET)
                os.ftruncate(fd, 0)
                os.write(fd, data)
            return fits
        finally:
            os.close(fd)  # releases the lock


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _entries(data: bytes | str | None) -> list[Reservation]:
    try:
        raw = orjson.loads(data) if data else []
    except orjson.JSONDecodeError:
        return []
    return [r for r in map(Reservation.from_json, raw if isinstance(raw, list) else []) if r is not None]


class DeadlineExceeded(Exception):
    """The coordination did not finish within the decision's deadline."""


class LeaseStore:
    """Reservations coordinated through the API server: one Lease per node, optimistic writes."""

    def __init__(self, api: ApiServer, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.writes = 0  # API writes, for the benchmark's writes per bind

    def reserve(
        self,
        new: Reservation,
        state: ClusterState,
        decide: Decide,
        now: float,
        *,
        write: bool = True,
        deadline: float,
    ) -> bool:
        """Raises ``ApiError`` (the API server failed) or ``DeadlineExceeded``."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/{self.namespace}/leases"
        name = LEASE_PREFIX + new.node
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DeadlineExceeded(f"coordinating on Lease {self.namespace}/{name}")
            status, lease = self.api.request_json("GET", f"{path}/{name}", timeout=remaining)
            if status == 404:
                lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name}}
            elif status != 200:
                raise ApiError(status, f"GET Lease {self.namespace}/{name}: {lease.get('message', '')}")
            metadata = lease.setdefault("metadata", {})
            annotations = metadata.get("annotations") or {}
            entries = _entries(annotations.get(ANNOTATION))
            held = [r for r in entries if still_held(r, state, now) and r.pod != new.pod]
            fits = decide(held)
            if not fits or not write:
                return fits
            metadata["annotations"] = {
                **annotations,
                ANNOTATION: orjson.dumps([r.as_json() for r in (*held, new)]).decode(),
            }
            remaining = max(0.001, deadline - time.monotonic())
            if status == 404:
                status, answer = self.api.request_json("POST", path, lease, timeout=remaining)
            else:
                status, answer = self.api.request_json("PUT", f"{path}/{name}", lease, timeout=remaining)
            self.writes += 1
            if status in (200, 201):
                return True
            if status != 409:  # 409: another writer won; read again and re-check
                raise ApiError(status, f"write Lease {self.namespace}/{name}: {answer.get('message', '')}")
