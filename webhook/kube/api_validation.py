"""What the API server refuses in a pod's resources before any webhook or kubelet sees it.

A manifest the API server rejects never reaches the cluster, so a dry run must say so rather
than judge a pod that cannot exist (the kubelet's checks would round ``nvidia.com/gpu: 0.5``
up to one device). Upstream: ``pkg/apis/core/validation/validation.go``:

- ``ValidateResourceQuantityValue``: an extended resource (``nvidia.com/gpu``) is a count of
  devices, an integer: ``value.MilliValue() % 1000 != 0`` is "must be an integer";
- ``validateResourceRequirements`` (``ValidateContainerResourceRequirements``): resources that
  cannot be overcommitted (extended resources and hugepages, ``helper.IsOvercommitAllowed``)
  need a limit, and a request equal to it ("must be equal to ... limit of ...", "Limit must be
  set for non overcommitable resources"). A missing request is defaulted to the limit first.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from .errors import MAPPING, FieldError
from .quantity import QuantityError, ceil_int, parse_quantity
from .resources import is_extended_resource
from .workloads import PodShape, display_path


def check_resource_requirements(shape: PodShape) -> None:
    """Raise ``FieldError`` for the first container resource the API server would refuse."""
    prefix = display_path(shape.path)
    spec_path = f"{prefix}.spec" if prefix else "spec"
    for key in ("initContainers", "containers"):
        containers = shape.spec.get(key)
        if not isinstance(containers, list):
            continue
        for i, container in enumerate(containers):
            resources = container.get("resources") if isinstance(container, MAPPING) else None
            if isinstance(resources, MAPPING):
                _check(resources, f"{spec_path}.{key}[{i}].resources")


def _check(resources: Mapping[str, Any], path: str) -> None:
    limits = _quantities(resources.get("limits"), f"{path}.limits")
    requests = _quantities(resources.get("requests"), f"{path}.requests")
    for kind, values in (("limits", limits), ("requests", requests)):
        for name, (raw, value) in values.items():
            if is_extended_resource(name) and ceil_int(value * 1000) % 1000:
                raise FieldError(
                    f"{path}.{kind}[{name}]",
                    f"Invalid value: {raw!r}: must be an integer (an extended resource counts whole "
                    "devices; the API server refuses this)",
                )
    for name, (raw, value) in requests.items():
        if not _overcommit_allowed(name):
            if name not in limits:
                raise FieldError(
                    f"{path}.limits",
                    f"Required value: Limit must be set for non overcommitable resources ({name} is "
                    "requested without a limit; the API server refuses this)",
                )
            limit_raw, limit = limits[name]
            if value != limit:
                raise FieldError(
                    f"{path}.requests",
                    f"Invalid value: {raw!r}: must be equal to {name} limit of {limit_raw} (the API "
                    "server refuses a request that differs from the limit for a resource it cannot "
                    "overcommit)",
                )


def _overcommit_allowed(name: str) -> bool:
    """``helper.IsOvercommitAllowed``: native resources other than hugepages."""
    return not is_extended_resource(name) and not name.startswith("hugepages-")


def _quantities(values: Any, path: str) -> dict[str, tuple[str, Fraction]]:
    """Each resource's text and value; unreadable ones are left to the engine's reader, whose
    errors already name the field."""
    if not isinstance(values, MAPPING):
        return {}
    parsed: dict[str, tuple[str, Fraction]] = {}
    for name, raw in values.items():
        try:
            parsed[str(name)] = (str(raw), parse_quantity(raw))
        except QuantityError:
            continue
    return parsed
