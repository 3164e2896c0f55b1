"""Resource quantities (``500m``, ``1Gi``, ``2e3``) parsed exactly, as the API server does.

The grammar is apimachinery's ``resource.ParseQuantity``. ``kubernetes.utils.parse_quantity``
gives the same values for that grammar (a property test proves it) but also accepts strings
the API server rejects (``1K``, ``1_000``, ``NaN``) and costs a quarter second to import, so the
engine uses this parser. Values are exact fractions; ``base_units`` rounds up the way the
kubelet's ``MilliValue``/``Value`` do.
"""

from __future__ import annotations

import re
from decimal import MAX_EMAX, MIN_EMIN, ROUND_CEILING, Context, Decimal
from fractions import Fraction
from functools import lru_cache

# Each part has one way to match, so a failed match costs linear time (no backtracking).
_QUANTITY = re.compile(
    r"(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?:[eE](?P<exp>[+-]?[0-9]+)|(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E))?"
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
# The API server accepts exponents of any size (``1e31``, ``1e-40``). Past 10**±LIMIT a value
# saturates: far beyond any node's allocatable it still compares as huge (the kubelet would say
# OutOf...), far below a nano-unit it still rounds up to one unit, and the arithmetic stays small.
_LIMIT = 40
_HUGE = Fraction(10**_LIMIT)
_TINY = Fraction(1, 10**_LIMIT)
# Enough significant digits that rounding up cannot change a value in base units (nano-cpu).
# The API server takes mantissas of any length, so the exponent range is the widest there is.
_DIGITS = Context(prec=2 * _LIMIT + 20, rounding=ROUND_CEILING, Emax=MAX_EMAX, Emin=MIN_EMIN)
# Cache only short strings: a cluster repeats a few hundred of them, and a cached megabyte-long
# quantity would stay in memory for as long as the cache holds it.
CACHED_LENGTH = 64


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


def _parse(text: str) -> Fraction:
    return _parse_cached(text) if len(text) <= CACHED_LENGTH else _parse_text(text)


def _parse_text(text: str) -> Fraction:
    """Parse in time linear in the length: the API server sets no bound on it."""
    match = _QUANTITY.fullmatch(text)
    if match is None:
        shown = text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"
        raise QuantityError(f"{shown!r} is not a quantity (expected e.g. 500m, 2, 1.5Gi, 1e3)")
    # Decimal reads any number of digits (int() refuses more than 4,300).
    number = _DIGITS.plus(Decimal(match["number"]))
    value = _scaled(number, _exponent(match["exp"]) if match["exp"] else 0)
    if match["suffix"]:
        value = min(value * _SUFFIX[match["suffix"]], _HUGE)
    return -value if match["sign"] == "-" else value


_parse_cached = lru_cache(maxsize=8192)(_parse_text)


def _exponent(digits: str) -> int:
    """The exponent; one of more than 18 digits (it may have thousands) is clamped to 10**18,
    which outweighs the number of digits of any mantissa that fits in memory."""
    sign = -1 if digits.startswith("-") else 1
    digits = digits.lstrip("+-").lstrip("0") or "0"
    return sign * (int(digits) if len(digits) <= 18 else 10**18)


def _scaled(number: Decimal, exponent: int) -> Fraction:
    if not number:
        return Fraction(0)
    magnitude = number.adjusted() + exponent
    if magnitude > _LIMIT:
        return _HUGE
    if magnitude < -_LIMIT:
        return _TINY
    # Shift the rounded number: its Fraction stays small whatever the lengths of the parts.
    return Fraction(_DIGITS.scaleb(number, exponent))


def ceil_int(value: Fraction) -> int:
    """Round up to an integer, as ``Quantity.Value`` does."""
    return -(-value.numerator // value.denominator)


def base_units(resource: str, value: Fraction) -> int:
    """Integer amount in the kubelet's units: millicores for cpu, base units otherwise."""
    return ceil_int(value * 1000) if resource == "cpu" else ceil_int(value)


@lru_cache(maxsize=4096)  # a refusal's detail names every zone's free amounts: the same few, again
def format_amount(resource: str, amount: int) -> str:
    """A human-readable amount for messages (``1500m``, ``2Gi``, ``3``)."""
    if resource == "cpu":
        return f"{amount // 1000}" if amount % 1000 == 0 else f"{amount}m"
    if resource in ("memory", "ephemeral-storage") or resource.startswith("hugepages-"):
        for suffix, size in (("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
            if amount and amount % size == 0:
                return f"{amount // size}{suffix}"
    return str(amount)
