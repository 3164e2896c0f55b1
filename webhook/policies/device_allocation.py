"""``deviceAllocation``: no DRA device handed out twice, and no DRA pod that no kubelet can start.

Every scheduler (kube-scheduler, Volcano, KAI) allocates devices to ResourceClaims from its own
view of which are in use, and the API server never compares one claim's devices with
another's: the node's driver is the first to notice (``FailedPrepareDynamicResources``), or
hands one GPU to two pods. The guard sees every ``resourceclaims/status`` write that sets an
allocation and judges it against every other claim and the ResourceSlices
(``dra.judge``, after the upstream allocator; dra-allocation-spec §5).

A pod created with ``spec.nodeName`` skips the scheduler, so nobody allocates its claims: the
kubelet's DRA manager (``pkg/kubelet/cm/dra/manager.go: prepareResources``, Kubernetes v1.35)
fails the prepare for a claim not generated yet (``resourceclaim.Name``), not reserved for the
pod (``IsReservedForPod``) or not allocated, and retries forever with the event reason
``FailedPrepareDynamicResources`` (``pkg/kubelet/events/event.go``). Such pods are denied with
that reason; a claim allocated for other nodes (``allocation.nodeSelector``) the same.

Allocations in flight (allowed, not yet in the watch) are the allocation guard's
(``allocation.py``): the engine judges against the index alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..dra.judge import (
    ALREADY_ALLOCATED,
    CAPACITY_EXCEEDED,
    COUNTERS_EXCEEDED,
    judge_allocation,
)
from ..dra.judge import REASONS as ALLOCATION_REASONS
from ..kube.dra import ResourceClaim, is_allocation_write
from ..kube.errors import FieldError
from ..state.model import CLAIMS
from . import (
    ALLOCATIONS,
    ANY_OBJECT,
    NO_FIX,
    Allocation,
    AuditPass,
    AuditScope,
    Bind,
    Context,
    Finding,
    Mode,
    Review,
    Subject,
    read_mode,
)

if TYPE_CHECKING:
    from ..config import Config
    from ..formats.reader import Reader
    from ..state import ClusterState

NAME = "deviceAllocation"
FAILED_PREPARE = "FailedPrepareDynamicResources"  # the kubelet's own event reason
NO_DEVICE_STATE = "NoDeviceState"
REASONS = (*ALLOCATION_REASONS, FAILED_PREPARE, NO_DEVICE_STATE)
MODES = NO_FIX
READS = ANY_OBJECT
STATIC = None  # other claims' allocations live in the guard's state
# Its mode decides whether the allocation guard records allocations in flight.
COORDINATES = ALLOCATIONS
# The audit: devices already handed out twice, or their capacity or a counter set over its limit,
# judged by the same rules as an allocation write (each allocated claim against all the others).
AUDITS = (ALREADY_ALLOCATED, CAPACITY_EXCEEDED, COUNTERS_EXCEEDED)
AUDIT_READS = CLAIMS


@dataclass(frozen=True, slots=True)
class DeviceAllocationConfig:
    mode: Mode = Mode.ENFORCE


Settings = DeviceAllocationConfig


def read_settings(reader: Reader, data: Any, where: str) -> DeviceAllocationConfig:
    data = reader.mapping(data, where, {"mode"})
    mode = read_mode(reader, data, where, MODES)
    if mode == Mode.FIX:
        reader.fail(f"{where}.mode", "deviceAllocation cannot fix an allocation: enforce, warn, audit or off")
    return DeviceAllocationConfig(mode)


def check(review: Review, context: Context) -> list[Finding]:
    if is_allocation_write(review.obj, review.old_obj, review.operation):
        return _allocation(review, context.state)
    if review.shape is not None and review.shape.kind == "Pod" and review.operation == "CREATE":
        return _pinned_pod(review, context.state)
    return []


def allocation_findings(
    obj: Mapping[str, Any] | ResourceClaim, state: ClusterState, user: str, in_flight=()
) -> list[Finding]:
    """One finding per device (and reason) the new allocation may not have. ``obj``: the claim
    as written, or as read once by the caller."""
    writer = user or "an unknown writer"
    return [
        Finding(
            f.reason,
            f"{f.message}; the allocation was written by {writer}. Denied so the scheduler retries "
            "this claim elsewhere.",
        )
        for f in judge_allocation(obj, state.devices, in_flight=in_flight)
    ]


def check_allocation(allocation: Allocation, context: Context) -> list[Finding]:
    """The allocation against every other claim in the index and every allocation in flight."""
    return allocation_findings(allocation.claim, allocation.state, allocation.writer, allocation.in_flight)


def _allocation(review: Review, state: ClusterState | None) -> list[Finding]:
    if state is None or state.devices is None:
        why = "no cluster state" if state is None else "the cluster serves no resource.k8s.io/v1 devices"
        return [
            Finding(NO_DEVICE_STATE, f"allocation not checked against other claims: {why}", advisory=True)
        ]
    return allocation_findings(review.obj, state, review.user)


def _pinned_pod(review: Review, state: ClusterState | None) -> list[Finding]:
    spec = review.shape.spec
    node = spec.get("nodeName")
    claims = spec.get("resourceClaims")
    if not node or not claims:
        return []
    if not isinstance(claims, list):
        raise FieldError("spec.resourceClaims", "must be a list")
    findings = []
    for i, entry in enumerate(claims):
        if not isinstance(entry, Mapping):
            raise FieldError(f"spec.resourceClaims[{i}]", "must be a mapping")
        finding = _pinned_claim(review, entry, node, state)
        if finding is not None:
            findings.append(finding)
    return findings


def _pinned_claim(review: Review, entry: Mapping[str, Any], node: str, state: ClusterState | None):
    pod = f"pod {review.namespace}/{review.name}"
    instead = (
        "Drop spec.nodeName and select the node with required node affinity on "
        f"metadata.name={node}, so the scheduler allocates the claim there."
    )
    if entry.get("resourceClaimTemplateName"):
        return Finding(
            FAILED_PREPARE,
            f"{pod} is created with spec.nodeName {node} and its claim {entry.get('name')!r} comes from "
            f"ResourceClaimTemplate {entry['resourceClaimTemplateName']}: no scheduler allocates a claim "
            f"for a pod that skips the scheduler, so the kubelet would retry the prepare forever. {instead}",
            node,
        )
    name = entry.get("resourceClaimName")
    if not isinstance(name, str) or not name:
        return None
    if state is None or state.devices is None:
        return None
    known = state.devices.named(review.namespace, name)
    if known is None:
        return Finding(
            FAILED_PREPARE,
            f"{pod} names ResourceClaim {review.namespace}/{name}, which does not exist (yet): the kubelet "
            "on its node cannot prepare it until it exists and is allocated.",
            node,
            advisory=True,
        )
    _, allocation = known
    if allocation is None:
        return Finding(
            FAILED_PREPARE,
            f"{pod} is created with spec.nodeName {node} and ResourceClaim {review.namespace}/{name} is not "
            f"allocated: no scheduler allocates it for a pod that skips the scheduler, so the kubelet "
            f"would retry the prepare forever. {instead}",
            node,
        )
    return claim_elsewhere(pod, allocation, node, state, _stay_with(allocation, state))


CLAIM_NODES_NAMED = 3  # nodes a message names where an allocated claim's devices are usable


def _stay_with(allocation, state: ClusterState) -> str:
    """Advice for a pod whose claim is allocated for other nodes: the scheduler never moves an
    allocated claim, so node affinity on the pinned node would leave it Pending forever; it
    must go where the claim is, or get a claim of its own."""
    selector = allocation.node_selector
    if selector is None:
        return ""  # usable on every node: never "elsewhere"
    # A message must not scan the cluster: the first few matching nodes are enough to name.
    matching = (name for name, n in state.nodes.items() if selector.matches(n.labels, name))
    nodes = list(itertools.islice(matching, CLAIM_NODES_NAMED + 1))
    named = ", ".join(nodes[:CLAIM_NODES_NAMED]) + (" and more" if len(nodes) > CLAIM_NODES_NAMED else "")
    where = f"allocated on {named}" if nodes else "allocated for nodes not in the cluster state"
    return (
        f"The scheduler never moves an allocated claim ({where}): run the pod there (spec.nodeName, "
        "or required node affinity on metadata.name), or give it a new claim (a "
        "resourceClaimTemplateName, or a claim of its own) and drop spec.nodeName so the scheduler "
        "allocates it where the pod goes."
    )


def check_bind(bind: Bind, context: Context) -> list[Finding]:
    """A pending pod's DRA claim allocated for devices the bound node cannot use (the claims
    reserved for it, and those its spec names): ``FailedPrepareDynamicResources`` there. Pods
    created with ``spec.nodeName`` are judged at CREATE (``check``)."""
    state, record = bind.state, bind.pod.record
    if bind.created or state.devices is None or record.pending is None:
        return []
    allocations = {a.key: a for a in state.devices.reserved_for(record.key)}
    entries = record.pending.spec.get("resourceClaims")
    for entry in entries if isinstance(entries, list) else ():
        name = entry.get("resourceClaimName") if isinstance(entry, Mapping) else None
        known = state.devices.named(record.pending.namespace, name) if isinstance(name, str) else None
        if known is not None and known[1] is not None:
            allocations[known[0]] = known[1]
    then = "The scheduler will retry it elsewhere."
    for allocation in allocations.values():
        finding = claim_elsewhere(bind.pod_name, allocation, bind.node.name, state, then)
        if finding is not None:
            return [finding]
    return []


def claim_elsewhere(pod: str, allocation, node: str, state: ClusterState, then: str) -> Finding | None:
    """A claim allocated for nodes ``node`` is not among (``allocation.nodeSelector``)."""
    target = state.nodes.get(node)
    if allocation.node_selector is None or target is None:
        return None
    if allocation.node_selector.matches(target.labels, node):
        return None
    return Finding(
        FAILED_PREPARE,
        f"{pod} uses ResourceClaim {allocation.claim}, allocated for devices node {node} cannot use "
        f"(its allocation.nodeSelector excludes {node}): the driver there cannot prepare them. {then}",
        node,
    )


# -- the audit ------------------------------------------------------------------------------


def audit(scope: AuditScope, context: Context) -> list[Finding]:
    """Devices (and their capacity and counters) more claims hold than they may, one finding
    per device and reason, naming every claim involved and the pods they are reserved for."""
    state = scope.inventory.state
    if state.devices is None:
        return []
    return device_report(device_groups(state, state.devices.claims()), state)


def audit_pass(config: Config) -> AuditPass:
    """The claims a chunk at a time; a device's claims gather across chunks, then one finding
    per device and reason."""
    groups: DeviceGroups = {}
    return AuditPass(
        keys=lambda state: list(state.devices.claims()) if state.devices is not None else None,
        step=lambda state, keys: device_groups(state, keys, groups),
        findings=lambda state: device_report(groups, state) if state.devices is not None else [],
        chunk=CLAIMS_PER_CHUNK,
    )


DeviceGroups = dict[tuple[str, str], dict[str, Any]]
CLAIMS_PER_CHUNK = 1000


def device_groups(state: ClusterState, keys: Iterable[str], into: DeviceGroups | None = None) -> DeviceGroups:
    """The claims over a limit, by (reason, device), for the allocated claims named by ``keys``
    (a chunk, or all of them: the server's periodic audit reads the claims a chunk at a time)."""
    groups = into if into is not None else {}
    for key in keys:
        allocation = state.devices.claim(key)
        for found in judge_allocation(allocation, state.devices) if allocation is not None else ():
            if found.reason in AUDITS:
                claims = groups.setdefault((found.reason, found.device), {})
                for ref in (allocation.claim, *found.holders):
                    claims[str(ref)] = ref
    return groups


def device_report(groups: DeviceGroups, state: ClusterState) -> list[Finding]:
    return [
        _device(reason, device, list(claims.values()), state) for (reason, device), claims in groups.items()
    ]


_WHAT = {
    ALREADY_ALLOCATED: "is allocated to more claims than it allows",
    CAPACITY_EXCEEDED: "has more of its capacity allocated than it has",
    COUNTERS_EXCEEDED: "consumes more of its pool's shared counters than there are",
}


def _device(reason: str, device: str, claims: list, state: ClusterState) -> Finding:
    def users(ref) -> str:
        held = state.devices.claim(ref.key)
        pods = [r.name for r in held.reserved_for] if held is not None else []
        return f"{ref} (pods {', '.join(pods)})" if pods else f"{ref} (no pod yet)"

    first = min(claims, key=str)
    return Finding(
        reason,
        f"{device} {_WHAT[reason]}: {'; '.join(users(c) for c in sorted(claims, key=str))}. The DRA driver "
        "fails the later pods' prepare (FailedPrepareDynamicResources) or hands one device to two "
        "pods; delete the pods of all but one claim so the scheduler allocates them again.",
        severity="high",
        subject=Subject(first.namespace, "ResourceClaim", first.name, "resource.k8s.io/v1", first.uid),
        resource=device,
        count=len(claims),
    )
