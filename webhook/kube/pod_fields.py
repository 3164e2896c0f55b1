"""Type checks for the pod fields the engine reads, so bad input is an error, not a crash."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import MAPPING, FieldError

_MAPPINGS = ("nodeSelector", "affinity", "securityContext", "os", "resources", "overhead")
_STRINGS = ("nodeName", "schedulerName")


def check_pod_fields(metadata: Mapping[str, Any], spec: Mapping[str, Any]) -> None:
    """Raise ``FieldError`` (pod-relative path) when a field has the wrong JSON type."""
    for key in ("labels", "annotations"):
        if metadata.get(key) is not None and not isinstance(metadata[key], MAPPING):
            raise FieldError(f"metadata.{key}", "must be a mapping")
    for key in _MAPPINGS:
        if spec.get(key) is not None and not isinstance(spec[key], MAPPING):
            raise FieldError(f"spec.{key}", "must be a mapping")
    for key in _STRINGS:
        if spec.get(key) is not None and not isinstance(spec[key], str):
            raise FieldError(f"spec.{key}", "must be a string")
    tolerations = spec.get("tolerations")
    if tolerations is not None and (
        not isinstance(tolerations, list) or not all(isinstance(t, MAPPING) for t in tolerations)
    ):
        raise FieldError("spec.tolerations", "must be a list of tolerations")
