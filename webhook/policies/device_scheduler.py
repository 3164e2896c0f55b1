"""``deviceScheduler``: one scheduler per device resource.

Two schedulers that each keep their own count of a node's free GPUs will both hand out the
last one; the kubelet's device manager then fails the second pod with
``UnexpectedAdmissionError``. Each device resource therefore has one owner scheduler.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

from ..globs import globs_overlap, matches_any
from ..state.model import DEFAULT_SCHEDULER
from . import ALL_MODES, POD_FIELDS, Context, Finding, Review, read_mode

if TYPE_CHECKING:
    from ..reader import Reader
    from ..state import ClusterState

NAME = "deviceScheduler"
REASON = "MixedDeviceScheduler"
REASONS = (REASON,)
MODES = ALL_MODES
READS = POD_FIELDS
STATIC = None  # owners can be detected from the pods on nodes: no static form
DEFAULT_DEVICE_PATTERNS = ("nvidia.com/*", "amd.com/*", "intel.com/*", "gpu.intel.com/*")


@dataclass(frozen=True, slots=True)
class DeviceSchedulerConfig:
    mode: str = "enforce"
    resources: tuple[str, ...] = DEFAULT_DEVICE_PATTERNS
    owners: tuple[tuple[str, str], ...] = ()  # (resource name or pattern, scheduler)
    annotations: tuple[tuple[str, str], ...] = ()  # (annotation key, scheduler)
    autodetect: bool = True
    binders: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (resource pattern, identity globs)

    def allowed_binders(self, resource: str) -> tuple[str, ...] | None:
        return next((who for p, who in self.binders if fnmatchcase(resource, p)), None)

    def is_device(self, resource: str) -> bool:
        return matches_any(resource, self.resources) or matches_any(
            resource, tuple(p for p, _ in self.owners)
        )

    def configured_owner(self, resource: str) -> str | None:
        return next((owner for p, owner in self.owners if fnmatchcase(resource, p)), None)


Settings = DeviceSchedulerConfig


def read_settings(reader: Reader, data: Any, where: str) -> DeviceSchedulerConfig:
    data = reader.mapping(
        data, where, {"mode", "resources", "owners", "annotations", "autodetect", "binders"}
    )
    binders = tuple(
        (str(resource), reader.strings(who, f"{where}.binders.{resource}"))
        for resource, who in reader.mapping(data.get("binders") or {}, f"{where}.binders").items()
    )
    resources = reader.strings(data.get("resources", list(DEFAULT_DEVICE_PATTERNS)), f"{where}.resources")
    owners = tuple(reader.mapping(data.get("owners") or {}, f"{where}.owners").items())
    annotations = tuple(reader.mapping(data.get("annotations") or {}, f"{where}.annotations").items())
    for key, owner in (*owners, *annotations):
        if not isinstance(owner, str) or not owner:
            reader.fail(f"{where}.owners.{key}", "the owner must be a scheduler name")
    for pattern in (*resources, *(p for p, _ in owners)):
        if "[" in pattern:
            reader.fail(f"{where}", f"pattern {pattern!r}: only * and ? wildcards are supported")
    for i, (first, first_owner) in enumerate(owners):
        for second, second_owner in owners[i + 1 :]:
            if first_owner != second_owner and globs_overlap(first, second):
                reader.fail(
                    f"{where}.owners",
                    f"{first!r} (owner {first_owner}) and {second!r} (owner {second_owner}) "
                    "match the same resource; a resource can have only one owner",
                )
    return DeviceSchedulerConfig(
        mode=read_mode(reader, data, where, MODES),
        resources=resources,
        owners=owners,
        annotations=annotations,
        autodetect=reader.boolean(data.get("autodetect", True), f"{where}.autodetect", True),
        binders=binders,
    )


@dataclass(frozen=True, slots=True)
class Owner:
    """Who hands out a device, and how we know: configuration or the pods already running."""

    scheduler: str
    evidence: str


def device_owners(
    review: Review, state: ClusterState | None, config: DeviceSchedulerConfig
) -> dict[str, Owner | None]:
    """Each device the pod asks for (resource or configured annotation) and its owner."""
    owners: dict[str, Owner | None] = {}
    for resource, amount in review.pod.record.requests.items():
        if amount > 0 and config.is_device(resource):
            owners[resource] = _owner(resource, state, config)
    annotations = review.shape.metadata.get("annotations") or {}
    for key, scheduler in config.annotations:
        if key in annotations:
            owners[f"annotation {key}"] = Owner(scheduler, "configured")
    return owners


def _owner(resource: str, state: ClusterState | None, config: DeviceSchedulerConfig) -> Owner | None:
    configured = config.configured_owner(resource)
    if configured is not None:
        return Owner(configured, "configured")
    if not config.autodetect or state is None:
        return None
    counts = state.device_schedulers(resource)
    if not counts:
        return None
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    evidence = ", ".join(f"{name} {n}" for name, n in ranked)
    return Owner(ranked[0][0], f"detected from active pods per scheduler: {evidence}")


def _scheduler(spec: Mapping) -> str:
    return spec.get("schedulerName") or DEFAULT_SCHEDULER


def check(review: Review, context: Context) -> list[Finding]:
    settings = context.config.policy(NAME)
    owners = {d: o for d, o in device_owners(review, context.state, settings).items() if o is not None}
    if not owners:
        return []
    spec = review.shape.spec
    if review.old_shape is not None and _unchanged(review):
        return []
    scheduler = _scheduler(spec)
    distinct = {o.scheduler for o in owners.values()}
    listing = "; ".join(f"{d} is owned by {o.scheduler} ({o.evidence})" for d, o in owners.items())
    if len(distinct) > 1:
        return [
            Finding(
                REASON,
                f"{review.description} asks for devices with different owners: "
                f"{listing}. One pod has one scheduler; split it into separate pods.",
            )
        ]
    owner = distinct.pop()
    if spec.get("nodeName"):
        return [
            Finding(
                REASON,
                f"{review.description} sets spec.nodeName={spec['nodeName']!r} and "
                f"asks for devices, bypassing every scheduler: {listing}. The owner does not "
                f"know these devices are taken and will hand them out again. Drop "
                f"spec.nodeName and set spec.schedulerName: {owner}.",
                node=spec["nodeName"],
            )
        ]
    if scheduler == owner:
        return []
    message = (
        f"{review.description} uses schedulerName {scheduler!r}, but {listing}. Two schedulers "
        f"handing out the same devices make the kubelet fail pods with UnexpectedAdmissionError. "
        f"Set spec.schedulerName: {owner}."
    )
    # The API server fills in default-scheduler before any webhook runs, so it means "unset";
    # any other scheduler was chosen on purpose and is never silently rewritten.
    fix = None
    if scheduler == DEFAULT_SCHEDULER:
        op = "replace" if "schedulerName" in spec else "add"
        fix = ({"op": op, "path": f"{review.shape.path}/spec/schedulerName", "value": owner},)
    return [Finding(REASON, message, fix=fix)]


def _unchanged(review: Review) -> bool:
    """An UPDATE that keeps scheduler, nodeName and devices as they were is never refused."""
    old, new = review.old_shape.spec, review.shape.spec
    return (
        _scheduler(old) == _scheduler(new)
        and old.get("nodeName") == new.get("nodeName")
        and old.get("containers") == new.get("containers")
        and old.get("initContainers") == new.get("initContainers")
        and (review.old_shape.metadata.get("annotations") or {})
        == (review.shape.metadata.get("annotations") or {})
    )
