"""``DeviceClass`` and ``DeviceTaintRule``: what a class selects, and the taints a rule puts
on devices."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import MAPPING, FieldError, mapping_at
from ..tolerations import Taint
from .fields import DeviceKey, _string
from .slices import _taint


@dataclass(frozen=True, slots=True)
class DeviceClass:
    name: str
    extended_resource_name: str = ""


def device_class_from(obj: Mapping[str, Any]) -> DeviceClass:
    metadata = mapping_at(obj, "metadata", "metadata")
    spec = mapping_at(obj, "spec", "spec")
    return DeviceClass(
        _string(metadata, "name", "metadata.name"),
        _string(spec, "extendedResourceName", "spec.extendedResourceName", required=False),
    )


@dataclass(frozen=True, slots=True)
class DeviceTaintRule:
    """One taint for the devices its selector names (``DeviceTaintSelector``: driver, pool,
    device; unset fields match all). ``selects`` is False for a rule without a selector, and for a
    1.34 rule selecting by device class or CEL, which the guard cannot evaluate."""

    name: str
    taint: Taint
    driver: str = ""
    pool: str = ""
    device: str = ""
    selects: bool = True

    def applies_to(self, key: DeviceKey) -> bool:
        return self.selects and all(
            not want or want == have
            for want, have in zip((self.driver, self.pool, self.device), key, strict=True)
        )


def device_taint_rule_from(obj: Mapping[str, Any]) -> DeviceTaintRule:
    metadata = mapping_at(obj, "metadata", "metadata")
    spec = mapping_at(obj, "spec", "spec")
    selector = spec.get("deviceSelector")
    if selector is not None and not isinstance(selector, MAPPING):
        raise FieldError("spec.deviceSelector", "must be a mapping")
    selector = selector or {}
    return DeviceTaintRule(
        name=_string(metadata, "name", "metadata.name"),
        taint=_taint(mapping_at(spec, "taint", "spec.taint"), "spec.taint"),
        driver=_string(selector, "driver", "spec.deviceSelector.driver", required=False),
        pool=_string(selector, "pool", "spec.deviceSelector.pool", required=False),
        device=_string(selector, "device", "spec.deviceSelector.device", required=False),
        selects=spec.get("deviceSelector") is not None
        and not selector.get("deviceClassName")
        and not selector.get("selectors"),
    )
