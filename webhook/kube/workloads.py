"""Where a workload keeps the pod it creates.

Only the built-in kinds are recognised, by API group as well as kind, so a custom
``batch.volcano.sh/v1alpha1 Job`` is not mistaken for a ``batch/v1 Job``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import FieldError

# kind -> (API groups it is served from, path from the object to the pod template)
_TEMPLATES: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "Deployment": (frozenset({"apps", "extensions"}), ("spec", "template")),
    "ReplicaSet": (frozenset({"apps", "extensions"}), ("spec", "template")),
    "StatefulSet": (frozenset({"apps"}), ("spec", "template")),
    "DaemonSet": (frozenset({"apps", "extensions"}), ("spec", "template")),
    "Job": (frozenset({"batch"}), ("spec", "template")),
    "CronJob": (frozenset({"batch"}), ("spec", "jobTemplate", "spec", "template")),
    "ReplicationController": (frozenset({""}), ("spec", "template")),
    "PodTemplate": (frozenset({""}), ("template",)),
}


@dataclass(frozen=True, slots=True)
class PodShape:
    """The pod an object stands for: its metadata and spec, and where they live.

    ``path`` is the JSON-pointer prefix of the pod (``""`` for a Pod, ``/spec/template`` for a
    Deployment), so policies can write patches that land in the right place.
    """

    kind: str
    metadata: Mapping[str, Any]
    spec: Mapping[str, Any]
    path: str

    @property
    def is_template(self) -> bool:
        return self.kind != "Pod"


def api_group(obj: Mapping[str, Any]) -> str:
    api_version = obj.get("apiVersion")
    if not isinstance(api_version, str):
        return ""
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


def pod_shape(obj: Mapping[str, Any]) -> PodShape | None:
    """The pod inside ``obj``, or None when ``obj`` is not a pod-creating kind."""
    kind = obj.get("kind")
    group = api_group(obj)
    if kind == "Pod" and group == "":
        return PodShape("Pod", _mapping(obj, ("metadata",)), _mapping(obj, ("spec",)), "")
    entry = _TEMPLATES.get(kind) if isinstance(kind, str) else None
    if entry is None or group not in entry[0]:
        return None
    path = entry[1]
    template = _mapping(obj, path)
    return PodShape(
        kind,
        _mapping(template, ("metadata",), ".".join(path)),
        _mapping(template, ("spec",), ".".join(path)),
        "/" + "/".join(path),
    )


def _mapping(obj: Mapping[str, Any], path: tuple[str, ...], prefix: str = "") -> Mapping[str, Any]:
    """Follow ``path``; a missing step is an empty mapping, a non-mapping step an error."""
    current: Any = obj
    walked = prefix
    for key in path:
        walked = f"{walked}.{key}" if walked else key
        current = current.get(key) if isinstance(current, Mapping) else None
        if current is None:
            return {}
        if not isinstance(current, Mapping):
            raise FieldError(walked, "must be a mapping")
    return current
