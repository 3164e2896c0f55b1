import contextlib
import tracemalloc
from decimal import Decimal, localcontext
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kubernetes.utils import parse_quantity as client_parse_quantity

from webhook.kube import quantity
from webhook.kube.errors import FieldError
from webhook.kube.quantity import QuantityError, base_units, format_amount, parse_quantity
from webhook.kube.resources import resource_list

SUFFIXES = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P", "E"]
digits = st.text("0123456789", min_size=1, max_size=12)


@st.composite
def kubernetes_quantities(draw) -> str:
    """Strings in apimachinery's quantity grammar."""
    sign = draw(st.sampled_from(["", "+", "-"]))
    whole = draw(digits)
    frac = draw(st.one_of(st.just(""), st.just("."), digits.map(lambda d: "." + d)))
    if draw(st.booleans()):
        suffix = draw(st.sampled_from(SUFFIXES))
    else:
        suffix = draw(st.sampled_from("eE")) + draw(st.sampled_from(["", "+", "-"]))
        suffix += str(draw(st.integers(0, 20)))
    return sign + whole + frac + suffix


def client_value(text) -> Fraction:
    """The client's value computed exactly (its Decimal context rounds past 28 digits), with
    magnitudes past 10**±40 saturated as the guard does."""
    with localcontext() as ctx:
        ctx.prec = 200
        value = Fraction(client_parse_quantity(text))
    magnitude = min(max(abs(value), Fraction(1, 10**40)), Fraction(10**40)) if value else value
    return magnitude if value >= 0 else -magnitude


@given(kubernetes_quantities())
def test_parser_equals_the_kubernetes_client_on_the_quantity_grammar(text):
    assert parse_quantity(text) == client_value(text)


@given(st.text(alphabet="0123456789.+-eEKMGTPinumk_ ", max_size=10))
def test_parser_accepts_nothing_the_kubernetes_client_would_refuse(text):
    try:
        ours = parse_quantity(text)
    except QuantityError:
        return
    assert ours == client_value(text)


@pytest.mark.parametrize(
    "text", ["1" * 5000 + "x", "1" * 50_000 + "x", "1." + "1" * 50_000 + "e", "1e" + "9" * 50_000 + "x"]
)
def test_a_long_malformed_quantity_is_an_error_not_a_hang(text):
    with pytest.raises(QuantityError, match=r"\(\d+ characters\)"):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("text", "millicores"),
    [
        ("1e31", 10**34),  # accepted by the API server: far beyond any node, so OutOfcpu
        ("1e999999999999", 10**43),  # saturates: any exponent compares as huge
        ("1" * 5000, 10**43),
        ("1e-31", 1),  # a positive request rounds up to one millicore, as MilliValue does
        ("0e99999", 0),
        ("-1e31", -(10**34)),
    ],
)
def test_quantities_with_any_exponent_or_length_parse_and_saturate(text, millicores):
    assert base_units("cpu", parse_quantity(text)) == millicores


MILLION = 1_000_001


@pytest.mark.parametrize(
    ("text", "millicores"),
    [
        ("1" * MILLION, 10**43),  # past decimal's default exponent limit: it raised Overflow
        ("-" + "9" * MILLION + "Ki", -(10**43)),
        ("1" * MILLION + "e-1000000", 1112),  # 1.111...: a long mantissa with an exponent to match
        ("1" * MILLION + "e-999999999999999999999", 1),
        ("0" * MILLION + "1.5", 1500),
        ("0." + "0" * MILLION + "1", 1),
        ("1." + "0" * MILLION + "1", 1001),
    ],
)
def test_a_million_digit_mantissa_parses_and_saturates(text, millicores):
    assert base_units("cpu", parse_quantity(text)) == millicores


@settings(max_examples=60, deadline=None)
@given(
    sign=st.sampled_from(["", "+", "-"]),
    zeros=st.sampled_from([0, 1, 4301, MILLION]),
    digits=st.sampled_from([0, 1, 4301, MILLION]),
    point=st.booleans(),
    fraction=st.sampled_from([0, 1, 4301, MILLION]),
    tail=st.sampled_from(["", "e", "e-", "E+", "Ki", "m", "n", "E", "x", ".", " "]),
    exponent=st.one_of(st.just(""), st.integers(-(10**30), 10**30).map(str)),
)
def test_every_string_parses_or_is_a_quantity_error(sign, zeros, digits, point, fraction, tail, exponent):
    text = sign + "0" * zeros + "7" * digits + ("." if point else "") + "3" * fraction + tail + exponent
    with contextlib.suppress(QuantityError):  # any other exception fails the test
        parse_quantity(text)
    with pytest.raises(FieldError, match=r"requests\.cpu"):
        resource_list({"cpu": text + "?"}, "requests")


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3000), st.integers(0, 3000), st.integers(-5, 5))
def test_long_mantissas_have_their_exact_value(whole, fraction, shift):
    text = "1" * whole + "." + "7" * fraction + f"e{shift - whole}"
    exact = Fraction(Decimal(text))
    assert base_units("cpu", parse_quantity(text)) == -(-exact * 1000 // 1)


def test_long_quantities_are_not_kept_in_the_cache():
    tracemalloc.start()
    try:
        for i in range(1, 201):
            assert parse_quantity(str(i) + "0" * 100_000) == quantity._HUGE
            assert parse_quantity(f"{i}0" + "0" * 50 + "e-50") == i * 10
        retained, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert retained < 2_000_000  # 200 cached 100 kB strings would hold 20 MB
    assert quantity._parse_cached.cache_info().currsize >= 200  # short ones still are


def test_long_request_strings_are_not_kept_by_the_resource_cache_either():
    from webhook.kube.resources import resource_list

    tracemalloc.start()
    try:
        for i in range(1, 101):
            assert resource_list({"cpu": str(i) + "0" * 100_000}, "requests")["cpu"] > 0
        retained, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert retained < 2_000_000  # 100 cached 100 kB strings would hold 10 MB


@given(st.integers(min_value=0, max_value=2**62))
def test_integer_yaml_numbers_are_exact(number):
    assert parse_quantity(number) == number


@pytest.mark.parametrize("text", ["1K", "1_000", "NaN", "Infinity", "", "1 Gi", "Gi", "1ki", "1.2.3", "0x10"])
def test_strings_the_api_server_rejects_are_errors(text):
    with pytest.raises(QuantityError):
        parse_quantity(text)


def test_booleans_and_lists_are_not_quantities():
    with pytest.raises(QuantityError):
        parse_quantity(True)
    with pytest.raises(QuantityError):
        parse_quantity([1])


@pytest.mark.parametrize(
    ("resource", "value", "expected"),
    [
        ("cpu", "100m", 100),
        ("cpu", "0.1", 100),
        ("cpu", 0.1, 100),  # the float 0.1 is the decimal 0.1, not 0.1000000000000000055
        ("cpu", "1", 1000),
        ("cpu", "1n", 1),  # MilliValue rounds up
        ("memory", "1Ki", 1024),
        ("memory", "1.5", 2),  # Value rounds up
        ("memory", "1e3", 1000),
        ("memory", "128974848", 128974848),
        ("nvidia.com/gpu", 2, 2),
    ],
)
def test_base_units_round_up_like_the_kubelet(resource, value, expected):
    assert base_units(resource, parse_quantity(value)) == expected


@given(st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False))
def test_cpu_millis_are_the_ceiling_of_a_thousandfold(value: Decimal):
    assert base_units("cpu", parse_quantity(str(value))) == int(
        (value * 1000).to_integral_value("ROUND_CEILING")
    )


def test_amounts_are_shown_in_familiar_units():
    assert format_amount("cpu", 1500) == "1500m"
    assert format_amount("cpu", 2000) == "2"
    assert format_amount("memory", 2 * 1024**3) == "2Gi"
    assert format_amount("nvidia.com/gpu", 3) == "3"
