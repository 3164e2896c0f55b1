"""The one error type for objects the guard cannot understand."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# ``isinstance(x, (dict, Mapping))`` answers for a dict in C, without the ABC's Python-level
# ``__instancecheck__``: it matters on the per-pod paths of the informer and snapshot loader.
MAPPING = (dict, Mapping)


class FieldError(ValueError):
    """An object field holds a value Kubernetes would reject (e.g. a malformed quantity).

    ``field`` is a dotted path such as ``spec.containers[0].resources.requests.cpu`` so the
    user can find the value in their manifest.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def mapping_at(obj: Mapping[str, Any], key: str, field: str) -> Mapping[str, Any]:
    """``obj[key]`` as a mapping: ``{}`` when absent, an error when it is something else."""
    value = obj.get(key)
    if value is None:
        return {}
    if not isinstance(value, MAPPING):
        raise FieldError(field, "must be a mapping")
    return value
