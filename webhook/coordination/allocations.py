"""DRA allocations in flight: the allocation guard's record and when it counts.

A record ends only on evidence that its write landed or was undone, never because the state
is older than the record: real writers update a claim just before the write the guard judges
(kube-scheduler's ``bindClaim`` adds the delete-protection finalizer with an Update, then writes
the allocation), so a review's ``oldObject`` is often newer than the watch. The state's
resourceVersion of the claim is compared with the one the write replaced (comparable since
v1.35, ``kube/resource_version.py``): older or the same, the record counts; newer and
allocated, the write landed and the index counts it (the record stays, not counted, for
replicas whose watch lags); newer and not allocated, or the claim deleted, it was overtaken or
undone and the record ends. Otherwise it ends with its TTL or, for an unauthenticated caller,
its confirmation time.

A record holds what counts and nothing else (the results' devices, shares and consumed
capacity: never the claim's opaque parameters), within ``MAX_RESULTS`` results and
``MAX_RECORD_BYTES``. Its JSON keeps the shape of a claim (``metadata`` and
``status.allocation.devices.results``), as the previous version wrote it, so replicas of both
read each other's records during a rolling update.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..kube.dra import ClaimAllocation, claim_allocation_from
from ..kube.errors import FieldError
from ..kube.resource_version import compare_resource_versions
from ..state.apiserver import ApiServer
from ..state.devices import DeviceIndex
from ..state.model import ClusterState
from .lease import LeaseStore
from .table import Codec, LocalTable

POOL_LEASE_PREFIX = "admit-guard-pool-"
ANNOTATION = "admit-guard.io/allocations"
# resource.k8s.io/v1 ``AllocationResultsMaxSize``: the API server refuses a longer allocation, so
# only a forged review names more (and would make the guard coordinate that many pools).
MAX_RESULTS = 32
# A record of 32 results with their consumed capacity stays far below this; a pool's Lease
# (256 KiB of annotations) then holds dozens of the largest.
MAX_RECORD_BYTES = 16 * 1024
# The fields of a result that say what it holds (``holds``); the rest is not recorded.
RESULT_FIELDS = ("request", "driver", "pool", "device", "adminAccess", "shareID", "consumedCapacity")


@dataclass(frozen=True, slots=True)
class InFlight:
    """An allocation allowed and not yet seen: the claim's record as the index would hold it."""

    claim: str  # the claim's key (uid)
    version: str  # the claim's resourceVersion the write replaces
    record: Mapping[str, Any]  # metadata and status.allocation.devices.results, what counts of them
    expires: float
    confirm_by: float | None = None

    @property
    def allocation(self) -> ClaimAllocation | None:
        return claim_allocation_from(self.record)[1]

    @property
    def pools(self) -> set[str]:
        allocation = self.allocation
        return {"/".join(r.key[:2]) for r in allocation.results} if allocation is not None else set()

    def as_json(self) -> dict[str, Any]:
        data = {"claim": self.claim, "version": self.version, "record": self.record, "expires": self.expires}
        if self.confirm_by is not None:
            data["confirmBy"] = self.confirm_by
        return data

    @classmethod
    def from_json(cls, data: Any) -> InFlight | None:
        try:
            confirm = data.get("confirmBy")
            entry = cls(
                str(data["claim"]),
                str(data["version"]),
                dict(data["record"]),
                float(data["expires"]),
                float(confirm) if confirm is not None else None,
            )
            return entry if entry.allocation is not None else None
        except (KeyError, TypeError, ValueError, AttributeError, FieldError):
            return None  # a foreign or damaged entry holds nothing


IN_FLIGHT = Codec.listing(InFlight)

# Where a record's write stands in a state: not seen yet (it counts), landed (the index counts
# it), or ended (overtaken, undone, or its claim deleted).
PENDING, LANDED, ENDED = "pending", "landed", "ended"


def landing(entry: InFlight, devices: DeviceIndex) -> str:
    """Where ``entry``'s write stands in this index, on evidence only (see the module doc)."""
    version = devices.version(entry.claim)
    if version is None:
        return ENDED if devices.deleted(entry.claim) else PENDING
    order = compare_resource_versions(version, entry.version)
    if version == entry.version or (order is not None and order < 0):
        return PENDING  # the state has not caught up with the write (or the claim's update before it)
    if devices.claim(entry.claim) is not None:
        return LANDED
    return ENDED if order is not None else PENDING  # unordered versions: only the TTL tells


def kept(entry: InFlight, state: ClusterState, now: float) -> bool:
    """Whether a record is written back: until its TTL, unless it ended; an unauthenticated
    caller's record also ends at its confirmation time unless the state shows it landed. A
    state without devices is no evidence: kept until the TTL."""
    if entry.expires <= now:
        return False
    if state.devices is None:
        return True
    stands = landing(entry, state.devices)
    if stands == ENDED:
        return False
    return stands == LANDED or entry.confirm_by is None or now < entry.confirm_by


def counts(entry: InFlight, state: ClusterState, now: float) -> bool:
    """Whether a record adds to what the index holds: kept, and its write not yet seen."""
    return state.devices is not None and kept(entry, state, now) and landing(entry, state.devices) == PENDING


def record_of(obj: Mapping[str, Any]) -> bytes:
    """What an allocation holds, as JSON: the claim's identity and its results' devices, shares
    and consumed capacity. Nothing the writer put beside them (opaque driver parameters,
    unknown fields) is copied: the record must serialize and stay small whatever the claim."""
    metadata = obj.get("metadata") or {}
    results = obj["status"]["allocation"]["devices"].get("results") or []
    kept = [
        {k: _plain(r[k]) for k in RESULT_FIELDS if k in r and r[k] is not None}
        for r in results
        if isinstance(r, Mapping)
    ]
    return orjson.dumps(
        {
            "metadata": {k: str(metadata[k]) for k in ("namespace", "name", "uid") if k in metadata},
            "status": {"allocation": {"devices": {"results": kept}}},
        }
    )


def _plain(value: Any) -> Any:
    """A result field as the parser read it: a string, a flag, or a map of quantities."""
    if isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    return value if isinstance(value, bool) else str(value)


def in_flight(
    key: str, obj: Mapping[str, Any], version: str, expires: float, confirm_by: float | None
) -> InFlight:
    """The record of claim ``key``'s allocation write (``obj``, read and valid) replacing
    ``version`` (``ValueError`` when it would not fit ``MAX_RECORD_BYTES``)."""
    data = record_of(obj)
    if len(data) > MAX_RECORD_BYTES:
        raise ValueError(f"its record would take {len(data)} bytes, over {MAX_RECORD_BYTES}")
    return InFlight(key, version, orjson.loads(data), expires, confirm_by)


def pool_table(directory: Path) -> LocalTable:
    """The replica's table of allocations in flight, a file per pool under ``directory``."""
    return LocalTable(directory, IN_FLIGHT)


def pool_leases(api: ApiServer, namespace: str) -> LeaseStore:
    """A Lease per pool (``admit-guard-pool-<driver>-<pool>``) in ``namespace``."""
    return LeaseStore(api, namespace, prefix=POOL_LEASE_PREFIX, annotation=ANNOTATION, codec=IN_FLIGHT)
