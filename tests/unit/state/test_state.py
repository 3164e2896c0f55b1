"""Aggregates stay equal to a recomputation from scratch, whatever the order of events."""

from collections import Counter

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.builders import container, pod
from webhook.kube.errors import FieldError
from webhook.state import ClusterState, pod_record

NODES = ["n1", "n2", "n3"]


def pod_object(i: int, node: str | None, cpu: int, gpu: int, port: int | None, phase: str, scheduler: str):
    ports = [{"containerPort": port, "hostPort": port}] if port else []
    requests = {"cpu": f"{cpu}m", **({"nvidia.com/gpu": str(gpu)} if gpu else {})}
    return pod(
        f"p{i}",
        node_name=node,
        phase=phase,
        scheduler=scheduler,
        containers=[container(requests=requests, ports=ports)],
    )


events = st.lists(
    st.tuples(
        st.integers(0, 7),
        st.one_of(st.none(), st.sampled_from(NODES)),
        st.integers(0, 3000),
        st.integers(0, 2),
        st.one_of(st.none(), st.sampled_from([80, 443])),
        st.sampled_from(["Pending", "Running", "Succeeded", "Failed", "delete"]),
        st.sampled_from(["default-scheduler", "volcano"]),
    ),
    max_size=40,
)


@pytest.mark.parametrize("parsed_json", [False, True])
@settings(max_examples=200)
@given(sequence=events)
def test_aggregates_equal_a_recomputation_after_any_event_sequence(parsed_json, sequence):
    state = ClusterState()
    truth: dict[str, dict] = {}
    for i, node, cpu, gpu, port, phase, scheduler in sequence:
        key = f"uid-p{i}"
        if phase == "delete":
            state.remove_pod(key)
            truth.pop(key, None)
            continue
        obj = pod_object(i, node, cpu, gpu, port, phase, scheduler)
        state.set_pod(key, pod_record(orjson.loads(orjson.dumps(obj)), parsed_json=parsed_json))
        truth[key] = obj
    active = [pod_record(o) for o in truth.values() if o["status"]["phase"] not in ("Succeeded", "Failed")]
    for node in NODES:
        on_node = [r for r in active if r.node == node]
        usage = state.usage(node)
        assert usage.pod_count == len(on_node)
        expected = Counter()
        for r in on_node:
            expected.update({k: v for k, v in r.requests.items() if v})
        assert usage.requested == dict(expected)
        assert +usage.host_ports == Counter(p for r in on_node for p in r.host_ports)
        for scheduler in ("default-scheduler", "volcano"):
            holding = sum(1 for r in on_node if r.scheduler == scheduler and r.requests.get("nvidia.com/gpu"))
            assert state.device_holders(node, "nvidia.com/gpu").get(scheduler, 0) == holding


def test_pods_are_counted_before_their_node_appears_and_after_it_goes():
    state = ClusterState()
    state.set_pod("u1", pod_record(pod("a", node_name="late", requests={"cpu": "1"})))
    assert state.usage("late").requested == {"cpu": 1000}
    state.remove_node("late")
    assert state.usage("late").pod_count == 1


def test_a_pod_that_turns_terminal_frees_its_resources():
    state = ClusterState()
    running = pod("a", node_name="n1", requests={"cpu": "1"})
    state.set_pod("uid-a", pod_record(running))
    running["status"] = {"phase": "Failed"}
    state.set_pod("uid-a", pod_record(running))
    assert state.usage("n1").pod_count == 0
    assert "uid-a" not in state.pods


# -- records shared between pods of the same inputs (the informer's parsed JSON) ----------


def outcome(obj, **options):
    try:
        return pod_record(obj, **options)
    except FieldError as err:
        return str(err)


def base_pod():
    return {
        "metadata": {"name": "p", "uid": "u"},
        "spec": {
            "nodeName": "n1",
            "containers": [
                {"name": "a", "resources": {"requests": {"cpu": "1"}}},
                {"name": "b", "resources": {"limits": {"cpu": "1"}}, "ports": [{"hostPort": 80}]},
            ],
            "initContainers": [{"name": "i", "resources": {"requests": {"cpu": "2"}}}],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "PodResizePending", "reason": "Deferred"}],
            "containerStatuses": [{"name": "a", "allocatedResources": {"cpu": "1"}}],
        },
    }


# Every value the record's requests and ports depend on, and some they do not.
EDITS = {
    ("spec", "containers", 0, "resources", "requests", "cpu"): ["1", "3", "x"],
    ("spec", "containers", 1, "resources", "limits", "cpu"): ["1", "3"],
    ("spec", "containers", 1, "ports", 0, "hostPort"): [80, 81, 0, "80"],
    ("spec", "containers", 1, "ports", 0, "protocol"): ["TCP", "UDP"],
    ("spec", "containers", 1, "ports"): [[{"hostPort": 80}], "80"],  # "80": not a list
    ("spec", "containers", 0, "name"): ["a", "c"],
    ("spec", "containers", 0, "image"): ["one", "two"],
    ("spec", "initContainers"): [[{"name": "i", "resources": {"requests": {"cpu": "2"}}}], [5], {}],
    ("spec", "initContainers", 0, "restartPolicy"): [None, "Always"],
    ("spec", "initContainers", 0, "resources", "requests", "cpu"): ["2", "500m"],
    ("spec", "overhead"): [None, {"cpu": "100m"}],
    ("spec", "resources"): [None, {"requests": {"cpu": "5"}}],
    ("status", "containerStatuses"): [[{"name": "a", "allocatedResources": {"cpu": "1"}}], [], [5]],
    ("status", "containerStatuses", 0, "allocatedResources", "cpu"): ["1", "4"],
    ("status", "containerStatuses", 0, "resources"): [None, {"requests": {"cpu": "6"}}],
    ("status", "containerStatuses", 0, "name"): ["a", "b"],
    ("status", "conditions", 0, "reason"): ["Deferred", "Infeasible"],
    ("status", "conditions", 0, "lastProbeTime"): ["t1", "t2"],
}


@settings(max_examples=300)
@given(
    st.lists(
        st.sampled_from(sorted(EDITS, key=str)).flatmap(
            lambda p: st.tuples(st.just(p), st.sampled_from(EDITS[p]))
        )
    )
)
def test_every_change_a_watched_pod_can_see_reaches_its_shared_record(edits):
    """One pod modified field by field (a resize, a new port, a status update): each record
    from the shared path equals the pod's own computation, so no input is missing from the key."""
    obj = base_pod()
    for path, value in [(None, None), *edits]:
        if path is not None:
            *parents, last = path
            try:
                target = obj
                for step in parents:
                    target = target[step]
                target[last] = value
            except (LookupError, TypeError):
                continue  # the path is gone: an earlier edit replaced a list with a malformed value
        assert outcome(orjson.loads(orjson.dumps(obj)), parsed_json=True) == outcome(obj)


def test_pods_of_one_shape_share_their_requests_and_a_resize_gets_its_own():
    first = pod("a", node_name="n1", containers=[container(requests={"cpu": "1"})])
    second = pod("b", node_name="n2", containers=[container(requests={"cpu": "1"})])
    a, b = (pod_record(orjson.loads(orjson.dumps(p)), parsed_json=True) for p in (first, second))
    assert a.requests is b.requests and a.requests == {"cpu": 1000}
    first["status"] = {
        "phase": "Running",
        "containerStatuses": [{"name": "app", "allocatedResources": {"cpu": "3"}}],
    }
    resized = pod_record(orjson.loads(orjson.dumps(first)), parsed_json=True)
    assert resized.requests == {"cpu": 3000} and b.requests == {"cpu": 1000}


def test_a_resize_on_a_modified_pod_moves_the_aggregates():
    state = ClusterState()
    running = pod("a", node_name="n1", containers=[container(requests={"cpu": "1"})], phase="Running")
    running["status"]["containerStatuses"] = [{"name": "app", "resources": {"requests": {"cpu": "1"}}}]
    state.set_pod("uid-a", pod_record(orjson.loads(orjson.dumps(running)), parsed_json=True))
    running["status"]["containerStatuses"][0]["resources"]["requests"]["cpu"] = "2500m"  # actuated
    state.set_pod("uid-a", pod_record(orjson.loads(orjson.dumps(running)), parsed_json=True))
    assert state.usage("n1").requested == {"cpu": 2500}
    running["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "4"  # the spec resized
    state.set_pod("uid-a", pod_record(orjson.loads(orjson.dumps(running)), parsed_json=True))
    assert state.usage("n1").requested == {"cpu": 4000}


def test_a_record_is_filed_under_its_own_key_string():
    state = ClusterState()
    record = pod_record(pod("a", node_name="n1", uid="uid-a"))
    key = "".join(["uid-", "a"])  # equal, but another string object
    state.set_pod(key, record)
    assert next(iter(state.pods)) is record.key
    assert next(iter(state.usage("n1").pods)) is record.key


@pytest.mark.parametrize("phase", [["Failed"], {"a": 1}, 3])
def test_a_phase_that_is_not_a_string_is_a_field_error_not_a_crash(phase):
    obj = pod("p", node_name="n")
    obj["status"] = {"phase": phase}
    with pytest.raises(FieldError, match=r"status\.phase: must be a string"):
        pod_record(obj)


@pytest.mark.parametrize(
    ("status", "field"),
    [
        ({"containerStatuses": 2}, r"status\.containerStatuses: must be a list"),
        ({"containerStatuses": "x"}, r"status\.containerStatuses: must be a list"),
        ({"initContainerStatuses": ["x"]}, r"status\.initContainerStatuses\[0\]: must be a mapping"),
        ({"conditions": 1}, r"status\.conditions: must be a list"),
        ({"conditions": [3]}, r"status\.conditions\[0\]: must be a mapping"),
    ],
)
@pytest.mark.parametrize("parsed_json", [False, True])
def test_status_lists_a_record_reads_of_another_type_are_field_errors_not_crashes(status, field, parsed_json):
    obj = pod("p", node_name="n")
    obj["status"] = {"phase": "Running", **status}
    with pytest.raises(FieldError, match=field):
        pod_record(obj, parsed_json=parsed_json)
