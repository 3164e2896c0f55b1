"""Resource quantities (``500m``, ``1Gi``, ``2e3``) parsed exactly, as the API server does.

The grammar is apimachinery's ``resource.ParseQuantity``. ``kubernetes.utils.parse_quantity``
gives the same values for that grammar (a property test proves it) but also accepts strings
the API server rejects (``1K``, ``1_000``, ``NaN``) and costs a quarter second to import, so the
engine uses this parser. Values are exact fractions; ``base_units`` rounds up the way the
kubelet's ``MilliValue``/``Value`` do.
"""

from __future__ import annotations

import re
from fractions import Fraction
from functools import lru_cache

_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+\.?[0-9]*|\.[0-9]+)"
    r"(?:(?P<exp>[eE][+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?"
)
_SUFFIX = {
    "Ki": Fraction(1024),
    "Mi": Fraction(1024**2),
    "Gi": Fraction(1024**3),
    "Ti": Fraction(1024**4),
    "Pi": Fraction(1024**5),
    "Ei": Fraction(1024**6),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
# Exponents beyond this are not real resources and would make Fraction arithmetic explode.
_MAX_EXPONENT = 30


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse_quantity(value: object) -> Fraction:
    """Return the exact value of a quantity given as a string or a YAML/JSON number."""
    if isinstance(value, bool):
        raise QuantityError(f"{value!r} is not a quantity")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        # JSON 0.1 means the decimal 0.1, not the nearest binary float.
        return _parse(repr(value))
    if isinstance(value, str):
        return _parse(value)
    raise QuantityError(f"{value!r} is not a quantity")


@lru_cache(maxsize=8192)
def _parse(text: str) -> Fraction:
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise QuantityError(f"{text!r} is not a quantity (expected e.g. 500m, 2, 1.5Gi, 1e3)")
    number = Fraction(match["number"])
    if match["exp"]:
        exponent = int(match["exp"][1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(f"{text!r} is out of range")
        number *= Fraction(10) ** exponent
    elif match["suffix"]:
        number *= _SUFFIX[match["suffix"]]
    return -number if match["sign"] == "-" else number


def ceil_int(value: Fraction) -> int:
    """Round up to an integer, as ``Quantity.Value`` does."""
    return -(-value.numerator // value.denominator)


def base_units(resource: str, value: Fraction) -> int:
    """Integer amount in the kubelet's units: millicores for cpu, base units otherwise."""
    return ceil_int(value * 1000) if resource == "cpu" else ceil_int(value)


def format_amount(resource: str, amount: int) -> str:
    """A human-readable amount for messages (``1500m``, ``2Gi``, ``3``)."""
    if resource == "cpu":
        return f"{amount // 1000}" if amount % 1000 == 0 else f"{amount}m"
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        for suffix, size in (("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
            if amount and amount % size == 0:
                return f"{amount // size}{suffix}"
    return str(amount)
