"""YAML snapshots are read a batch of items at a time through yaml_rs, and only when every
plain scalar reads the same in YAML 1.2 as in the strict YAML 1.1 reader."""

import re

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webhook.formats import yaml_items
from webhook.formats.json_items import NotStreamable
from webhook.formats.manifests import StrictLoader
from webhook.formats.yaml_items import list_items

PIECES = [
    *"0123456789yYnNoOeE.:_-+xXbB~aAtTrRuUfFlLsSiI \"'[]{},&*!|>%@`?#=<\\",
    "true",
    "Null",
    "yes",
    "off",
]
SCALARS = st.lists(
    st.sampled_from([*PIECES, "0x", "0o", ".inf", "1e", "<<", ": ", "- "]), min_size=1, max_size=7
)
CONTEXTS = ["  k: {}\n", "  {}: v\n", "  l:\n  - {}\n", "  m:\n    n: {}\n", "  l:\n  - k: {}\n"]


@settings(max_examples=3000, derandomize=True, suppress_health_check=list(HealthCheck), deadline=None)
@given(SCALARS.map("".join), st.sampled_from(CONTEXTS))
def test_a_streamed_yaml_list_reads_exactly_as_the_strict_reader_or_is_not_streamed(scalar, context):
    text = "apiVersion: v1\nkind: List\nitems:\n- a: b\n" + context.format(scalar) + "- c: d\n"
    try:
        streamed = list(list_items(text))
    except NotStreamable:
        return
    assert yaml.load(text, Loader=StrictLoader)["items"] == streamed


@pytest.mark.parametrize("value", ["on", "yes", "0o17", "1:30", "1e3", "!!str 1", "&a x", "{a: on}", "-.5"])
def test_plain_scalars_yaml_1_1_reads_otherwise_are_sent_to_the_strict_reader(value):
    with pytest.raises(NotStreamable):
        list(
            list_items(f"apiVersion: v1\nkind: List\nitems:\n- metadata:\n    labels: {{}}\n    x: {value}\n")
        )


def test_items_are_read_in_batches_in_order():
    items = "".join(
        f"- apiVersion: v1\n  kind: Pod\n  metadata:\n    name: p{i}\n    labels:\n      a: 'on'\n"
        for i in range(5000)
    )
    streamed = list(
        list_items("apiVersion: v1\nitems:\n" + items + "kind: List\nmetadata:\n  resourceVersion: ''\n")
    )
    assert [item["metadata"]["name"] for item in streamed] == [f"p{i}" for i in range(5000)]


@settings(max_examples=2000, derandomize=True, deadline=None)
@given(st.lists(st.sampled_from([*PIECES, "\n", "\n  ", "\n- ", "- - ", ":\n"]), max_size=40).map("".join))
def test_the_possessive_scans_find_what_backtracking_ones_would(text):
    for scan in (yaml_items._KEYS, yaml_items._VALUES, yaml_items._ENTRIES):
        backtracking = re.compile(scan.pattern.replace("*+", "*").replace("++", "+"))
        assert scan.pattern != backtracking.pattern
        assert scan.findall(text) == backtracking.findall(text)
