"""Aggregates stay equal to a recomputation from scratch, whatever the order of events."""

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import container, pod
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


@settings(max_examples=200)
@given(events)
def test_aggregates_equal_a_recomputation_after_any_event_sequence(sequence):
    state = ClusterState()
    truth: dict[str, dict] = {}
    for i, node, cpu, gpu, port, phase, scheduler in sequence:
        key = f"uid-p{i}"
        if phase == "delete":
            state.remove_pod(key)
            truth.pop(key, None)
            continue
        obj = pod_object(i, node, cpu, gpu, port, phase, scheduler)
        state.set_pod(key, pod_record(obj))
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
        expected = sum(1 for r in active if r.scheduler == scheduler and r.requests.get("nvidia.com/gpu"))
        assert state.device_schedulers("nvidia.com/gpu").get(scheduler, 0) == expected


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
