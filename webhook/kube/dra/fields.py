"""The DRA objects' vocabulary: device keys, amounts in nano-units, and field readers whose
every malformed value is a ``FieldError`` naming the field."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from ..errors import MAPPING, FieldError
from ..quantity import CACHED_LENGTH, QuantityError, ceil_int, parse_quantity

NANO = 10**9
DeviceKey = tuple[str, str, str]
PoolKey = tuple[str, str]
Amounts = tuple[tuple[str, int], ...]  # (name, nano-units), in the object's order

TAINT_EFFECTS_PREVENTING_ALLOCATION = frozenset({"NoSchedule", "NoExecute"})

_intern = sys.intern


def device_name(key: DeviceKey) -> str:
    """``driver/pool/device``, the way upstream prints a ``DeviceID``."""
    return "/".join(key)


def capacity_key(driver: str, name: str) -> str:
    """The capacity name with the device's own driver domain dropped (open question 5)."""
    prefix = f"{driver}/"
    return _intern(name[len(prefix) :] if name.startswith(prefix) else name)


def amount_of(amounts: Amounts | None, name: str) -> int | None:
    for key, amount in amounts or ():
        if key == name:
            return amount
    return None


_SUFFIXES = (
    *((s, 1024**p) for s, p in (("Ei", 6), ("Pi", 5), ("Ti", 4), ("Gi", 3), ("Mi", 2), ("Ki", 1))),
    *((s, 1000**p) for s, p in (("E", 6), ("P", 5), ("T", 4), ("G", 3), ("M", 2), ("k", 1))),
)


def format_nano(amount: int) -> str:
    """A quantity for messages: ``40Gi``, ``10G``, ``7``, ``1.5``."""
    whole, fraction = divmod(amount, NANO)
    if fraction:
        return f"{whole}.{fraction:09d}".rstrip("0")
    found = [(whole // size, suffix) for suffix, size in _SUFFIXES if whole and whole % size == 0]
    return "{}{}".format(*min(found)) if found else str(whole)


def quantity(raw: object, field: str) -> int:
    """A non-negative quantity in nano-units."""
    try:
        if type(raw) is str and len(raw) <= CACHED_LENGTH:
            return _nano(raw)  # a cluster repeats a handful of quantities
        return _nano_of(raw)
    except QuantityError as err:
        raise FieldError(field, str(err)) from None


def _nano_of(raw: object) -> int:
    value = parse_quantity(raw)
    if value < 0:
        raise QuantityError(f"{raw!r} must not be negative")
    return ceil_int(value * NANO)


_nano = lru_cache(maxsize=4096)(_nano_of)


def _string(
    obj: Mapping[str, Any], key: str, field: str, *, required: bool = True, unique: bool = False
) -> str:
    """A string; names that repeat across objects are interned, ``unique`` ones (uids) not."""
    value = obj.get(key)
    if type(value) is str and value:
        return value if unique else _intern(value)
    if value is None or value == "":
        if required:
            raise FieldError(field, "is required")
        return ""
    if not isinstance(value, str):
        raise FieldError(field, "must be a string")
    return value if unique else _intern(value)


def _integer(obj: Mapping[str, Any], key: str, field: str, default: int | None = None) -> int:
    value = obj.get(key)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(field, "must be an integer")
    return value


def _boolean(obj: Mapping[str, Any], key: str, field: str) -> bool:
    value = obj.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise FieldError(field, "must be true or false")
    return value


def _mappings(obj: Mapping[str, Any], key: str, field: str) -> list[Mapping[str, Any]]:
    value = obj.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise FieldError(field, "must be a list of objects")
    for item in value:  # decoded JSON holds dicts: the abstract Mapping check only for the rest
        if type(item) is not dict and not isinstance(item, MAPPING):
            raise FieldError(field, "must be a list of objects")
    return value


def _amounts(obj: Mapping[str, Any], field: str, driver: str, nested: str | None) -> Amounts:
    """``{name: quantity}`` or, with ``nested``, ``{name: {nested: quantity}}``."""
    if not isinstance(obj, MAPPING):
        raise FieldError(field, "must be a mapping")
    amounts = []
    for name, raw in obj.items():
        where = f"{field}.{name}"
        if nested is not None:
            if not isinstance(raw, MAPPING):
                raise FieldError(where, "must be a mapping")
            raw, where = raw.get(nested), f"{where}.{nested}"
        amounts.append(
            (capacity_key(driver, str(name)) if driver else _intern(str(name)), quantity(raw, where))
        )
    return tuple(amounts)
