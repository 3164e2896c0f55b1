"""A pod list page decoded typed gives every pod the key and record its parsed JSON gives."""

from __future__ import annotations

import json
import random
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.builders import cluster_pod, pod
from tests.helpers.pod_shapes import pods
from webhook.kube.errors import FieldError
from webhook.state import model
from webhook.state.listed_pods import ListedPod, listed_key, listed_record, pod_event, pod_page
from webhook.state.model import object_key, pod_record
from webhook.state.storm import StormBreakers


def page_of(pods: list[Any], resource_version: str = "42", token: str = "") -> bytes:
    metadata = {"resourceVersion": resource_version, **({"continue": token} if token else {})}
    page = {"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": pods}
    return json.dumps(page).encode()  # the standard library writes integers past 64 bits too


def outcome(build, obj):
    """A record, or the field error it raised (both paths must agree on either)."""
    model._shared.clear()  # each path derives requests itself, not from the other's cache
    try:
        return build(obj)
    except FieldError as err:
        return ("error", str(err))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(pods(), min_size=1, max_size=4))
def test_a_typed_pod_has_the_key_and_record_or_error_of_its_parsed_json(listed: list[dict[str, Any]]):
    body = page_of(listed)
    page = pod_page(body, None)
    if page is None:
        return  # a field of another type: the informer parses the page whole (the old path)
    parsed = orjson.loads(body)["items"]  # what the informer read before, and reads otherwise
    assert len(page.items) == len(parsed)
    for item, obj in zip(page.items, parsed, strict=True):
        if isinstance(item, ListedPod):
            assert listed_key(item) == object_key(obj)
            assert outcome(listed_record, item) == outcome(lambda o: pod_record(o, parsed_json=True), obj)
        else:
            assert item == obj


def test_a_pod_derives_from_its_inputs_once_whichever_way_it_was_read():
    """Typed pods share a derivation under their inputs' text; the cache never mixes the two
    keys, and a typed pod's first derivation equals the dict path's."""
    obj = cluster_pod(7, 10, random.Random(1))
    model._shared.clear()
    (item,) = pod_page(page_of([obj]), None).items
    typed = listed_record(item)
    assert listed_record(item).requests is typed.requests  # shared, not derived again
    assert pod_record(obj, parsed_json=True) == typed
    assert len(model._shared) == 2


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(pods(odd_types=False), min_size=1, max_size=6))
def test_a_page_of_pods_of_the_apis_own_types_decodes_typed(listed: list[dict[str, Any]]):
    """The property above is not met by falling back: pods of the API's types decode typed,
    and only the pending ones are kept whole."""
    page = pod_page(page_of(listed), None)
    assert page is not None
    for item, obj in zip(page.items, listed, strict=True):
        spec, phase = obj.get("spec") or {}, (obj.get("status") or {}).get("phase")
        whole = not spec.get("nodeName") and phase not in model.TERMINAL_PHASES
        assert isinstance(item, dict) == whole


def test_the_pods_of_the_benchmarks_cluster_decode_typed():
    rng = random.Random(5)
    page = pod_page(page_of([cluster_pod(i, 50, rng) for i in range(200)]), None)
    assert page is not None
    assert all(isinstance(item, ListedPod) for item in page.items)


def test_the_bound_pods_of_a_page_are_typed_and_pending_ones_kept_whole():
    listed = [
        pod("bound", node_name="node-1", phase="Running"),
        pod("pending", phase="Pending"),
        pod("done", node_name="node-1", phase="Succeeded"),
    ]
    page = pod_page(page_of(listed, "7", "next"), None)
    assert page is not None
    assert [type(item) for item in page.items] == [ListedPod, dict, ListedPod]
    assert page.items[1] == listed[1]  # its record keeps the whole spec for the bind checks
    assert (page.resource_version, page.continue_token) == ("7", "next")
    assert listed_record(page.items[2]) is None  # terminal: it holds nothing


def test_failed_pods_are_kept_whole_for_the_storm_breakers_and_running_ones_once_one_counts():
    failed = pod("failed", node_name="node-1", phase="Failed")
    running = pod("running", node_name="node-1", phase="Running")
    storm = StormBreakers()
    assert [type(i) for i in pod_page(page_of([running]), storm).items] == [ListedPod]
    # A Failed pod on the page may start a breaker before its Running pods are observed.
    assert [type(i) for i in pod_page(page_of([running, failed]), storm).items] == [dict, dict]
    assert [type(i) for i in pod_page(page_of([failed]), None).items] == [ListedPod]


@pytest.mark.parametrize(
    "odd",
    [
        {"spec": {"nodeName": "n", "priority": "high"}},
        {"spec": {"nodeName": 5}},
        {"spec": {"nodeName": "n", "containers": {"name": "app"}}},
        {"spec": {"nodeName": "n"}, "metadata": {"labels": ["a"]}},
        {"spec": {"nodeName": "n"}, "status": {"phase": {"x": 1}}},
        {"spec": {"nodeName": "n", "priority": 2**70}},
    ],
)
def test_a_page_with_a_field_of_another_type_is_left_to_the_json_parse(odd):
    assert pod_page(page_of([pod("ok", node_name="n"), odd]), None) is None


def test_a_body_that_is_not_a_pod_list_is_left_to_the_json_parse():
    assert pod_page(b"not json", None) is None
    assert pod_page(b"[1, 2]", None) is None


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods(odd_types=False))
def test_a_record_is_named_exactly_when_its_pod_holds_an_extended_resource(obj: dict[str, Any]):
    """``ClusterState.set_pod`` counts a pod's devices only for a named record."""
    try:
        record = pod_record(obj, parsed_json=True)
    except FieldError:
        return
    if record is not None:
        assert bool(record.name) == any(True for _ in record.devices)


# -- watch events ---------------------------------------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods(), st.sampled_from(["ADDED", "MODIFIED", "DELETED"]), st.sampled_from([None, "17"]))
def test_a_typed_watch_event_reads_as_its_parsed_json(obj: dict[str, Any], event: str, version: str | None):
    if version and isinstance(obj.get("metadata"), dict):
        obj["metadata"]["resourceVersion"] = version
    line = json.dumps({"type": event, "object": obj}).encode()
    decoded = pod_event(line, None)
    if decoded is None:
        return  # read as parsed JSON (the old path)
    parsed = orjson.loads(line)["object"]
    kind_of_event, item, resource_version = decoded
    assert kind_of_event == event
    assert resource_version == (parsed.get("metadata") or {}).get("resourceVersion")
    assert listed_key(item) == object_key(parsed)
    if event != "DELETED":
        assert outcome(listed_record, item) == outcome(lambda o: pod_record(o, parsed_json=True), parsed)


def event_line(event: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"type": event, "object": obj}).encode()


def test_a_bound_pods_event_and_a_bookmark_are_read_typed():
    bound = pod("web", node_name="node-1", phase="Running")
    bound["metadata"]["resourceVersion"] = "8"
    kind_of_event, item, version = pod_event(event_line("MODIFIED", bound), StormBreakers())
    assert (kind_of_event, version, listed_key(item)) == ("MODIFIED", "8", "uid-web")
    bookmark = {"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "9"}}
    assert pod_event(event_line("BOOKMARK", bookmark), None)[::2] == ("BOOKMARK", "9")


def test_errors_pending_pods_and_the_pods_the_storm_breakers_read_are_left_to_the_json_parse():
    status = {"kind": "Status", "code": 410, "message": "too old resource version"}
    assert pod_event(event_line("ERROR", status), None) is None
    assert pod_event(event_line("ADDED", pod("pending", phase="Pending")), None) is None
    failed = pod("failed", node_name="node-1", phase="Failed")
    assert pod_event(event_line("MODIFIED", failed), StormBreakers()) is None
    assert pod_event(event_line("MODIFIED", failed), None) is not None  # no breakers to read it
    assert pod_event(event_line("DELETED", pod("pending", phase="Pending")), None) is not None
    assert pod_event(b'{"type": "ADDED"}', None) is None
    assert pod_event(b"not json", None) is None
