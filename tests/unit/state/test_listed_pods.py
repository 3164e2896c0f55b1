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
from webhook.kube.errors import FieldError
from webhook.state import model
from webhook.state.listed_pods import ListedPod, listed_key, listed_record, pod_event, pod_page
from webhook.state.model import MIRROR_ANNOTATION, object_key, pod_record
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


# -- pods of every shape the record reads, odd JSON types included ---------------------------

ODD = st.one_of(st.integers(-3, 3), st.booleans(), st.just("x"), st.just([1]), st.just({"k": 1}))
QUANTITY = st.sampled_from(["100m", "1", "2Gi", "0", "1.5", "abc", "-1", 3, 0.5])
RESOURCE = st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "example.com/fpga", "hugepages-2Mi", "pods"])
RESOURCE_LIST = st.dictionaries(RESOURCE, QUANTITY, max_size=3)


def maybe(strategy, odd):
    """Mostly ``strategy``; sometimes absent or null (None here: ``present`` drops it), or odd."""
    return st.one_of(strategy, strategy, strategy, st.none(), odd)


def present(**fields: Any) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None}


@st.composite
def containers(draw, odd) -> list[Any]:
    made = []
    for _ in range(draw(st.integers(0, 3))):
        resources = draw(
            maybe(
                st.fixed_dictionaries({}, optional={"requests": RESOURCE_LIST, "limits": RESOURCE_LIST}), odd
            )
        )
        ports = draw(maybe(st.lists(st.fixed_dictionaries(
            {"containerPort": st.sampled_from([80, 8080])},
            optional={
                "hostPort": st.sampled_from([0, 80, 9090, "x"]),
                "protocol": st.sampled_from(["TCP", "UDP"]),
            },
        ), max_size=2), odd))  # fmt: skip
        made.append(present(
            name=draw(maybe(st.sampled_from(["app", "side", "init"]), odd)),
            restartPolicy=draw(maybe(st.sampled_from(["Always", "Never"]), odd)),
            resources=resources,
            ports=ports,
            image="registry.example/app:1",
        ))  # fmt: skip
    return made if draw(st.integers(0, 20)) else draw(st.one_of(st.just(made), odd))


@st.composite
def pods(draw, odd_types: bool = True) -> dict[str, Any]:
    """Pods; one in four with fields of another JSON type here and there (``odd_types``), so
    that most pages decode typed."""
    with_odd = odd_types and draw(st.integers(0, 3)) == 0
    odd = ODD if with_odd else st.nothing()
    odd_priority = st.one_of(ODD, st.sampled_from([True, 1.0, "1", 2**70])) if with_odd else st.nothing()
    annotations = draw(
        maybe(st.sampled_from([{}, {MIRROR_ANNOTATION: "x"}, {MIRROR_ANNOTATION: None}, {"a": "b"}]), odd)
    )
    metadata = present(
        name=draw(maybe(st.sampled_from(["p", "web-0", ""]), odd)),
        generateName=draw(maybe(st.just("web-"), odd)),
        namespace=draw(maybe(st.sampled_from(["default", "team-a", ""]), odd)),
        uid=draw(maybe(st.sampled_from(["uid-1", "uid-2", ""]), odd)),
        labels=draw(maybe(st.just({"app": "web"}), odd)),
        annotations=annotations,
    )
    statuses = draw(maybe(st.lists(st.fixed_dictionaries(
        {"name": maybe(st.sampled_from(["app", "side"]), odd)},
        optional={
            "allocatedResources": RESOURCE_LIST,
            "resources": st.fixed_dictionaries({"requests": RESOURCE_LIST}),
        },
    ), max_size=2), odd))  # fmt: skip
    conditions = draw(maybe(st.lists(st.fixed_dictionaries({
        "type": st.sampled_from(["Ready", "PodResizePending"]),
        "reason": st.sampled_from(["Infeasible", "Deferred"]),
    }), max_size=2), odd))  # fmt: skip
    spec = present(
        nodeName=draw(maybe(st.sampled_from(["node-1", "node-2", ""]), odd)),
        schedulerName=draw(maybe(st.sampled_from(["default-scheduler", "volcano", ""]), odd)),
        priority=draw(
            maybe(
                st.sampled_from([0, 1000, 2_000_000_000, 2**40]),
                odd_priority,
            )
        ),
        containers=draw(containers(odd)),
        initContainers=draw(maybe(containers(odd), odd)),
        resources=draw(
            maybe(
                st.fixed_dictionaries({}, optional={"requests": RESOURCE_LIST, "limits": RESOURCE_LIST}), odd
            )
        ),
        overhead=draw(maybe(RESOURCE_LIST, odd)),
        nodeSelector=draw(maybe(st.just({"zone": "a"}), odd)),
        affinity=draw(maybe(st.just({}), odd)),
        tolerations=draw(maybe(st.lists(st.just({"operator": "Exists"}), max_size=1), odd)),
    )
    status = present(
        phase=draw(maybe(st.sampled_from(["Running", "Pending", "Succeeded", "Failed"]), odd)),
        containerStatuses=statuses,
        conditions=conditions,
    )
    return present(
        apiVersion="v1",
        kind="Pod",
        metadata=draw(maybe(st.just(metadata), odd)),
        spec=draw(maybe(st.just(spec), odd)),
        status=draw(maybe(st.just(status), odd)),
    )


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
