"""Large JSON snapshots are streamed item by item, with the same records and errors as a whole read."""

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.builders import container, pod
from webhook.formats.json_items import NotStreamable, list_items
from webhook.formats.manifests import Location, documents_in, list_item, read_documents
from webhook.state.snapshot import SnapshotError, load_snapshot

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=200)
@given(
    items=st.lists(json_values, max_size=6),
    extra=st.dictionaries(st.sampled_from(["metadata", "x", "zz"]), json_values, max_size=2),
    indent=st.sampled_from([None, 2, 4]),
)
def test_streamed_items_equal_the_items_of_the_whole_document(items, extra, indent):
    text = json.dumps({**extra, "apiVersion": "v1", "items": items, "kind": "List"}, indent=indent)
    assert list(list_items(text)) == json.loads(text)["items"]  # the whole-file read's decoder


@settings(max_examples=200)
@given(
    numbers=st.lists(
        st.integers(min_value=2**63 - 2, max_value=2**200)
        | st.integers(min_value=-(2**200), max_value=-(2**63) + 2)
        | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False),
        min_size=1,
        max_size=4,
    )
)
def test_streamed_numbers_of_any_size_read_as_the_whole_file_reads_them(numbers):
    items = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"c{i}"}, "data": {"n": n}}
        for i, n in enumerate(numbers)
    ]
    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    whole = [doc.obj for doc in documents_in(text, "cluster.json")]
    streamed = [
        list_item(item, Location("cluster.json", 1, i)).obj for i, item in enumerate(list_items(text), 1)
    ]
    # 2**64 == float(2**64): compare the text, so that an integer read as a float shows.
    assert json.dumps(streamed) == json.dumps(whole) == json.dumps(items)


@pytest.mark.parametrize(
    "text",
    [
        '[{"kind": "Pod"}]',
        '{"apiVersion": "v1", "kind": "List", "items": [{"a": 1},]}',
        '{"apiVersion": "v1", "kind": "List", "items": [NaN]}',
        '{"apiVersion": "v1", "kind": "List", "items": []} trailing',
        '{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}',
        '{"kind": "List", "items": []}',
        '{"apiVersion": "v1", "kind": "List", "items": {}}',
        '{"apiVersion": "v1", "kind": "List", "items": [], "items": []}',
        '{"apiVersion": "v1", "kind": "List", "items": [{"kind": "Pod", "kind": "Node"}]}',
    ],
)
def test_anything_but_one_json_list_object_is_not_streamed(text):
    with pytest.raises(NotStreamable):
        list(list_items(text))


def snapshot_items():
    return [
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
         "status": {"allocatable": {"cpu": "4", "pods": "10"}}},
        pod("a", node_name="n1", containers=[container(requests={"cpu": "1"})]),
        pod("b", node_name="n1", phase="Succeeded", containers=[container(requests={"cpu": "1"})]),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ignored"}},
    ]  # fmt: skip


def test_streamed_snapshot_builds_the_same_state_as_a_yaml_one(tmp_path):
    streamed, whole = tmp_path / "cluster.json", tmp_path / "cluster.yaml"
    document = {"apiVersion": "v1", "kind": "List", "items": snapshot_items()}
    streamed.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    whole.write_text(json.dumps(document))  # JSON is YAML: read whole
    whole.write_text("# not JSON at the first byte\n" + whole.read_text())
    a, b = load_snapshot([str(streamed)]), load_snapshot([str(whole)])
    assert a.pods == b.pods and a.nodes == b.nodes
    assert a.usage("n1").requested == {"cpu": 1000}


def test_streamed_snapshot_errors_name_the_file_document_and_item(tmp_path):
    items = snapshot_items()
    items[1]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    items.append({"kind": "Pod"})
    path = tmp_path / "cluster.json"
    path.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    with pytest.raises(SnapshotError) as err:
        load_snapshot([str(path)])
    assert err.value.problems[0].startswith(f"{path}: document 1, item 2: Pod: field spec.containers[0]")
    assert err.value.problems[1] == f"{path}: document 1, item 5: field apiVersion: missing or not a string"


def test_a_file_that_cannot_be_streamed_is_read_whole_with_the_usual_errors(tmp_path):
    path = tmp_path / "cluster.json"
    path.write_text('{"apiVersion": "v1", "kind": "List", "items": [{"kind": "Pod"},]}')
    expected = [str(e) for e in read_documents([str(path)])]
    with pytest.raises(SnapshotError) as err:
        load_snapshot([str(path)])
    assert err.value.problems == expected
