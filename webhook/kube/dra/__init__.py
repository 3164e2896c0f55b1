"""Compact typed readers for ``resource.k8s.io/v1`` objects (DRA spec §2, §4), one module per
object (``slices``, ``claims``, ``classes``), with the vocabulary they share (``fields``) and where
devices may be used (``node_selection``).

Upstream: ``staging/src/k8s.io/api/resource/v1/types.go``. Only what decides whether a device
is handed out twice is kept: attributes, configs and binding conditions are dropped, so a
device of one node equals the same device of every other node and the records can be shared.

A device is ``(driver, pool, device)`` (``allocatedstate.go: DeviceID``). Quantities are exact
integers in nano-units: apimachinery rounds every quantity up to nano scale, so these sums and
comparisons are exactly the API server's, never floats. Capacity names are normalised: a
``<driver>/<name>`` of the device's own driver is ``<name>`` (spec open question 5; the API
documents the two spellings as one capacity).
"""

from __future__ import annotations

from .claims import (
    AllocatedDevice,
    ClaimAllocation,
    ClaimRef,
    DeviceRequest,
    DeviceToleration,
    ReservedFor,
    ResourceClaim,
    allocation_from,
    allocation_written,
    claim_allocation_from,
    claim_key,
    claim_ref,
    is_allocation_write,
    resource_claim_from,
)
from .classes import (
    DeviceClass,
    DeviceTaintRule,
    device_class_from,
    device_taint_rule_from,
)
from .fields import (
    NANO,
    TAINT_EFFECTS_PREVENTING_ALLOCATION,
    Amounts,
    DeviceKey,
    PoolKey,
    amount_of,
    capacity_key,
    device_name,
    format_nano,
    quantity,
)
from .node_selection import (
    NodeSelection,
    NodeSelector,
    NodeSelectorTerm,
    Requirement,
    node_selector,
)
from .slices import (
    Capacity,
    CounterConsumption,
    CounterSet,
    Device,
    RequestPolicy,
    ResourceSlice,
    ValidRange,
    resource_slice_from,
)

__all__ = [
    "NANO",
    "TAINT_EFFECTS_PREVENTING_ALLOCATION",
    "AllocatedDevice",
    "Amounts",
    "Capacity",
    "ClaimAllocation",
    "ClaimRef",
    "CounterConsumption",
    "CounterSet",
    "Device",
    "DeviceClass",
    "DeviceKey",
    "DeviceRequest",
    "DeviceTaintRule",
    "DeviceToleration",
    "NodeSelection",
    "NodeSelector",
    "NodeSelectorTerm",
    "PoolKey",
    "RequestPolicy",
    "Requirement",
    "ReservedFor",
    "ResourceClaim",
    "ResourceSlice",
    "ValidRange",
    "allocation_from",
    "allocation_written",
    "amount_of",
    "capacity_key",
    "claim_allocation_from",
    "claim_key",
    "claim_ref",
    "device_class_from",
    "device_name",
    "device_taint_rule_from",
    "format_nano",
    "is_allocation_write",
    "node_selector",
    "quantity",
    "resource_claim_from",
    "resource_slice_from",
]
