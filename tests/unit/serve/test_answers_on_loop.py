"""A review decided on the worker's event loop (``state/waiting.py``): where its decision would
wait, it stops before it counted, logged, reserved or claimed anything, so the pool thread that
decides it next decides it whole, as if the loop had never tried."""

from __future__ import annotations

import time

import pytest

from tests.helpers.binds import binding, client_for, gpu_pod, pod_create, state_with
from tests.helpers.builders import node, pod
from tests.helpers.live_server import metric_sum
from tests.helpers.storm import owned, rejected
from webhook.config import config_from_dict
from webhook.coordination.names import table_file_name
from webhook.coordination.probes import shared_probes
from webhook.coordination.reservations import node_table
from webhook.serve.app import ANSWERS_WITHOUT_WAITING, create_app
from webhook.serve.framing import Head
from webhook.serve.limits import MAX_BODY_ON_LOOP
from webhook.serve.worker import on_loop
from webhook.state import ClusterState
from webhook.state.source import FixedState
from webhook.state.storm import HALF_OPEN, StormBreakers
from webhook.state.waiting import WouldWait, without_waiting


def requests_total(client) -> float:
    return metric_sum(client.get("/metrics").get_data(as_text=True), "admit_guard_requests_total")


def test_the_admission_paths_are_the_ones_the_loop_may_answer(tmp_path):
    app = create_app(config_from_dict({}), FixedState(None))
    assert getattr(app, ANSWERS_WITHOUT_WAITING) == {"/validate", "/mutate"}


def test_a_pinned_pod_whose_node_table_a_sibling_holds_is_decided_again_whole(tmp_path):
    client = client_for(state_with(node("n1", cpu="1")), tmp_path)
    review = pod_create(pod("direct", namespace="ml", node_name="n1", requests={"cpu": "1"}))
    sibling = node_table(tmp_path / "reservations")  # another worker's view of the same files
    held = sibling.hold("n1", time.monotonic() + 1)
    try:
        with without_waiting(), pytest.raises(WouldWait):
            client.post("/validate", json=review)
    finally:
        held.release()
    assert sibling.entries("n1", time.monotonic() + 1) == []  # nothing reserved
    assert requests_total(client) == 0  # nor counted
    reply = client.post("/validate", json=review).get_json()["response"]  # a pool thread's turn
    assert reply["allowed"]
    assert [r.node for r in sibling.entries("n1", time.monotonic() + 1)] == ["n1"]
    assert requests_total(client) == 1


def test_a_storm_probe_is_claimed_only_by_a_decision_that_may_wait(tmp_path):
    config = config_from_dict({"policies": {"stormBreaker": {"threshold": 2, "cooldownSeconds": 10}}})
    storm = StormBreakers.from_config(config.storm_breaker)
    for n in range(2):
        storm.observe(rejected(f"r{n}"), time.time() - 20)  # open, and its cool-down is over
    probes = shared_probes(tmp_path / "probes", None, "admit-guard", 1.0, 1.0)
    client = create_app(config, FixedState(ClusterState(storm)), storm_probes=probes).test_client()
    review = pod_create(owned("next"))
    with without_waiting(), pytest.raises(WouldWait, match="probe"):
        client.post("/validate", json=review)
    assert storm.breakers["rs-uid"].state != HALF_OPEN  # the slot is still free
    reply = client.post("/validate", json=review).get_json()["response"]
    assert reply["allowed"]  # the probe, taken by the decision that could wait for it
    assert storm.breakers["rs-uid"].state == HALF_OPEN


PATHS = frozenset({"/validate", "/mutate"})


@pytest.mark.parametrize(
    ("target", "body", "pipelined", "answered_there"),
    [
        ("/validate?timeout=10s", 2_000, False, True),  # as the API server calls
        ("/mutate", 2_000, False, True),
        ("/metrics", 0, False, False),  # the other paths wait as they like, in a thread
        ("/validate", MAX_BODY_ON_LOOP + 1, False, False),  # would hold the loop too long
        ("/validate", 2_000, True, False),  # its successor would be answered down the stack
    ],
)
def test_the_loop_answers_admission_reviews_that_are_not_large_nor_followed(
    target, body, pipelined, answered_there
):
    head = Head("POST", target, 1, [])
    assert on_loop(head, body, pipelined, PATHS) is answered_there


def test_a_head_gunicorn_parses_is_never_answered_by_the_loop():
    assert not on_loop(None, 2_000, False, PATHS)


class UnusedLeases:
    """A Lease store the decision on the loop must give up before it is used."""

    def __getattr__(self, name: str):
        raise AssertionError(f"the Leases were used on the loop ({name})")


def test_a_bind_the_leases_may_coordinate_goes_to_a_thread_before_any_work(tmp_path):
    state = state_with(node("n1", cpu="1"), pod("a", namespace="ml", requests={"cpu": "1"}))
    client = client_for(state, tmp_path, leases=UnusedLeases())
    with without_waiting(), pytest.raises(WouldWait, match="a bind the Leases may coordinate"):
        client.post("/validate", json=binding("a", "n1"))
    assert not (tmp_path / "reservations" / table_file_name("n1")).exists()  # no table read
    assert requests_total(client) == 0


def test_a_pinned_pod_whose_reservation_the_leases_coordinate_goes_to_a_thread_before_its_table(tmp_path):
    state = state_with(node("n1", extra={"nvidia.com/gpu": "2"}))
    client = client_for(state, tmp_path, leases=UnusedLeases())
    review = pod_create(gpu_pod("direct", node_name="n1"))
    with without_waiting(), pytest.raises(WouldWait, match="a coordinated decision's Leases"):
        client.post("/validate", json=review)
    assert not (tmp_path / "reservations" / table_file_name("n1")).exists()
    assert requests_total(client) == 0
