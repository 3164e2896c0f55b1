"""Records coordinated across replicas through the API server: a Lease per key, replaced with
its resourceVersion (etcd is the arbiter; the guard builds no consensus of its own)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from ..state.apiserver import ApiError, ApiServer
from ..state.model import ClusterState
from ..state.source import StateSource
from .budget import Budget, Busy, DeadlineExceeded
from .names import MAX_OBJECT_NAME, bounded_name
from .table import Codec, _decoded


class LeaseFull(Exception):
    """A Lease cannot take the records (the API server's annotation limit): not an outage."""


# apimachinery's ``TotalAnnotationSizeLimitB``: the bytes of an object's annotations, keys
# included, past which the API server refuses the write (422).
ANNOTATIONS_LIMIT = 256 * 1024


@dataclass(slots=True)
class LeaseRead:
    """One Lease as read (a new one when it did not exist), and the records it holds."""

    name: str
    lease: dict[str, Any]
    exists: bool
    records: Any


class LeaseStore:
    """Records coordinated through the API server: one Lease per key (a node's reservations, by
    default) holding them in an annotation, replaced with optimistic concurrency. A Lease left
    with no record is deleted (with its resourceVersion as the precondition), so the Leases of
    nodes and pools that come and go do not pile up."""

    def __init__(
        self,
        api: ApiServer,
        namespace: str,
        *,
        prefix: str,
        annotation: str,
        codec: Codec,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.prefix, self.annotation, self.codec = prefix, annotation, codec
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    def update(self, key: str, change: Callable[[Any], Any], budget: Budget) -> Any:
        """Read the key's records, ``change(records)`` (what to write, or None for nothing), and
        replace the Lease: the records written, or None. A 409 (another writer won) reads
        again and changes again, until ``budget.wait_until``: then ``Busy``. Raises
        ``DeadlineExceeded`` when one call takes longer than ``budget.call_seconds``,
        ``LeaseFull`` when the records do not fit, and ``ApiError`` when the API server fails."""
        while True:
            read = self.read(key, budget)
            changed = change(read.records)
            if changed is None:
                return None
            if self.write(read, changed, budget):
                return changed
            if budget.waiting() <= 0:
                raise Busy(f"Lease {self.namespace}/{read.name} kept changing under other writers")

    def read(self, key: str, budget: Budget) -> LeaseRead:
        """The key's Lease and its records. A Lease whose annotations are not what the guard
        writes (not a map, a record that does not parse) holds nothing it can count."""
        name = bounded_name(self.prefix, key, MAX_OBJECT_NAME)
        status, lease = self._call(budget, "GET", f"{self._path}/{name}", None, name)
        if status == 404:
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name}}
        elif status != 200:
            raise ApiError(status, f"GET Lease {self.namespace}/{name}: {lease.get('message', '')}")
        return LeaseRead(name, lease, status == 200, self._records(lease))

    def write(self, read: LeaseRead, records: Any, budget: Budget) -> bool:
        """Replace the Lease read with ``records`` (delete it when they are empty): False when
        another writer changed it since (read again)."""
        name, lease = read.name, read.lease
        metadata = lease.setdefault("metadata", {})
        if not isinstance(metadata, dict):
            metadata = lease["metadata"] = {"name": name}
        if not self.codec.dump(records):
            return self._delete(read, budget)
        annotations = metadata.get("annotations")
        annotations = dict(annotations) if isinstance(annotations, dict) else {}
        value = orjson.dumps(self.codec.dump(records)).decode()
        annotations[self.annotation] = value
        size = sum(len(str(k).encode()) + len(str(v).encode()) for k, v in annotations.items())
        if size > ANNOTATIONS_LIMIT:
            raise LeaseFull(f"Lease {self.namespace}/{name} would hold {size} bytes of annotations")
        metadata["annotations"] = annotations
        if read.exists:
            status, answer = self._call(budget, "PUT", f"{self._path}/{name}", lease, name)
        else:
            status, answer = self._call(budget, "POST", self._path, lease, name)
        if status in (200, 201):
            return True
        if status == 409 or (status == 404 and read.exists):  # another writer won (or deleted it)
            return False
        if status == 422:
            raise LeaseFull(f"write Lease {self.namespace}/{name}: {answer.get('message', '')}")
        raise ApiError(status, f"write Lease {self.namespace}/{name}: {answer.get('message', '')}")

    def collect(self, ended: Callable[[Any], bool], budget: Budget) -> int:
        """Delete this store's Leases every record of which has ``ended``: how many went. A Lease
        changed since it was listed is left for the next collection."""
        status, listing = self._call(budget, "GET", self._path, None, "*")
        if status != 200:
            raise ApiError(status, f"list Leases {self.namespace}: {listing.get('message', '')}")
        items = listing.get("items")
        deleted = 0
        for lease in items if isinstance(items, list) else ():
            metadata = lease.get("metadata") if isinstance(lease, dict) else None
            name = metadata.get("name") if isinstance(metadata, dict) else None
            if not isinstance(name, str) or not name.startswith(self.prefix):
                continue
            records = self._records(lease)
            if all(ended(r) for r in records) and self._delete(LeaseRead(name, lease, True, records), budget):
                deleted += 1
        return deleted

    def _records(self, lease: dict[str, Any]) -> Any:
        metadata = lease.get("metadata")
        annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
        raw = annotations.get(self.annotation) if isinstance(annotations, dict) else None
        return _decoded(raw if isinstance(raw, str) else None, self.codec)[0]

    def _delete(self, read: LeaseRead, budget: Budget) -> bool:
        if not read.exists:
            return True
        version = (read.lease.get("metadata") or {}).get("resourceVersion")
        options = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"resourceVersion": version}}
        status, answer = self._call(budget, "DELETE", f"{self._path}/{read.name}", options, read.name)
        if status in (200, 202, 404):
            return True
        if status == 409:
            return False
        raise ApiError(status, f"delete Lease {self.namespace}/{read.name}: {answer.get('message', '')}")

    def _call(
        self, budget: Budget, method: str, path: str, body: dict | None, name: str
    ) -> tuple[int, dict[str, Any]]:
        timeout = budget.call_timeout(f"{method} Lease {self.namespace}/{name}")
        started = time.monotonic()
        try:
            return self.api.request_json(method, path, body, timeout=timeout)
        except ApiError:
            if time.monotonic() - started < timeout:
                raise
            if timeout < budget.call_seconds:  # cut short by the decision's budget, not slow
                raise Busy(f"the decision's time budget ran out during {method} Lease {name}") from None
            raise DeadlineExceeded(
                f"{method} Lease {self.namespace}/{name} took over {budget.call_seconds:g} s"
            ) from None


def collect_ended(
    store: LeaseStore,
    kept: Callable[[Any, ClusterState, float], bool],
    source: StateSource,
    now: float,
    budget: Budget | None = None,
) -> int:
    """Delete ``store``'s Leases every record of which is no longer ``kept`` in the state: how
    many went. The state's lock is held for each record's verdict, never across a round trip;
    without a state nothing is judged ended."""

    def ended(record: Any) -> bool:
        with source.reading() as view:
            return view.state is not None and not kept(record, view.state, now)

    return store.collect(ended, budget or Budget.start(0.0, 1.0, 10.0))
