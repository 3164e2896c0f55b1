"""The bind-time guard: pods/binding reviews get the kubelet's verdict on the target node, and
reservations keep two binds from being handed the same capacity."""

from __future__ import annotations

import json
import os
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from tests.helpers.app import answer
from tests.helpers.binds import (
    SCHEDULER,
    binding,
    client_for,
    gpu_pod,
    pod_create,
    reserve,
    review_of,
    state_with,
)
from tests.helpers.builders import node, pod
from tests.helpers.fake_apiserver import Cluster, FakeApiServer
from tests.helpers.live_server import live_server, post_json
from webhook.admission import VALIDATE, parse_review, review
from webhook.binding import BindGuard
from webhook.config import config_from_dict
from webhook.coordination.reservations import Reservation, node_leases, node_table
from webhook.coordination.table import LocalTable
from webhook.serve.app import create_app
from webhook.state import ClusterState, pod_record
from webhook.state.apiserver import ApiServer
from webhook.state.source import FixedState, Readiness, StateView


def test_a_bind_the_kubelet_would_reject_is_denied_naming_pod_node_and_binder(tmp_path):
    state = state_with(
        node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("running", node_name="gpu-1"), gpu_pod("late")
    )
    response = answer(client_for(state, tmp_path), binding("late", "gpu-1"))
    assert response["allowed"] is False and response["status"]["reason"] == "OutOfnvidia.com/gpu"
    message = response["status"]["message"]
    assert "pod ml/late" in message and "gpu-1" in message and SCHEDULER in message
    assert "The scheduler will retry it elsewhere." in message


def test_a_second_bind_to_the_last_gpu_is_denied_by_the_first_ones_reservation(tmp_path):
    state = state_with(node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("a"), gpu_pod("b"))
    client = client_for(state, tmp_path)
    assert answer(client, binding("a", "gpu-1"))["allowed"] is True
    second = answer(client, binding("b", "gpu-1"))
    assert second["allowed"] is False and second["status"]["reason"] == "OutOfnvidia.com/gpu"
    assert answer(client, binding("a", "gpu-1"))["allowed"] is True  # its own reservation never counts twice


def test_a_dry_run_bind_reserves_nothing(tmp_path):
    state = state_with(node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("a"), gpu_pod("b"))
    client = client_for(state, tmp_path)
    assert answer(client, binding("a", "gpu-1", dry_run=True))["allowed"] is True
    assert answer(client, binding("b", "gpu-1"))["allowed"] is True


def test_an_expired_reservation_frees_the_capacity(tmp_path):
    now = [1000.0]
    state = state_with(node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("a"), gpu_pod("b"))
    client = client_for(
        state,
        tmp_path,
        {"policies": {"nodeAdmission": {"reservations": {"ttlSeconds": 30}}}},
        clock=lambda: now[0],
    )
    assert answer(client, binding("a", "gpu-1"))["allowed"] is True
    assert answer(client, binding("b", "gpu-1"))["allowed"] is False
    now[0] += 31
    assert answer(client, binding("b", "gpu-1"))["allowed"] is True


def test_once_the_winner_is_bound_its_own_record_counts_and_never_its_reservation_too(tmp_path):
    gpu_node = node("gpu-1", extra={"nvidia.com/gpu": "2"})
    state = state_with(gpu_node, gpu_pod("a"), gpu_pod("b"), gpu_pod("c"))
    client = client_for(state, tmp_path)
    assert answer(client, binding("a", "gpu-1"))["allowed"] is True
    bound = gpu_pod("a", node_name="gpu-1")
    state.set_pod("uid-a", pod_record(bound))  # the watch shows it bound
    assert answer(client, binding("b", "gpu-1"))["allowed"] is True
    denied = answer(client, binding("c", "gpu-1"))
    assert denied["allowed"] is False and "OutOfnvidia.com/gpu" in denied["status"]["reason"]


def test_an_unknown_pod_is_allowed_with_a_warning_and_counted(tmp_path):
    state = state_with(node("gpu-1", extra={"nvidia.com/gpu": "1"}))
    client = client_for(state, tmp_path)
    response = answer(client, binding("ghost", "gpu-1"))
    assert response["allowed"] is True and "not a pending pod" in response["warnings"][0]
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'admit_guard_binding_fail_open_total{reason="pod-unknown"} 1.0' in metrics


def test_an_untolerated_no_execute_taint_denies_the_bind(tmp_path):
    tainted = node(
        "gpu-1", extra={"nvidia.com/gpu": "1"}, taints=[{"key": "maintenance", "effect": "NoExecute"}]
    )
    state = state_with(tainted, gpu_pod("a"))
    response = answer(client_for(state, tmp_path), binding("a", "gpu-1"))
    assert response["allowed"] is False and response["status"]["reason"] == "TaintToleration"


def test_a_device_pod_bound_by_another_identity_is_a_mixed_scheduler_warning(tmp_path):
    config = {
        "policies": {
            "deviceScheduler": {"binders": {"nvidia.com/gpu": ["system:serviceaccount:volcano-system:*"]}}
        }
    }
    state = state_with(node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("a"))
    response = answer(
        client_for(state, tmp_path, config), binding("a", "gpu-1", user="system:kube-scheduler")
    )
    assert response["allowed"] is True
    assert (
        "MixedDeviceScheduler" in response["warnings"][0]
        and "system:kube-scheduler" in response["warnings"][0]
    )


def test_binders_are_not_checked_when_the_device_scheduler_policy_is_off(tmp_path):
    config = {
        "policies": {
            "deviceScheduler": {
                "mode": "off",
                "binders": {"nvidia.com/gpu": ["system:serviceaccount:volcano-system:*"]},
            }
        }
    }
    state = state_with(node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("a"))
    response = answer(
        client_for(state, tmp_path, config), binding("a", "gpu-1", user="system:kube-scheduler")
    )
    assert response["allowed"] is True and "warnings" not in response


def test_a_malformed_binding_is_a_400_naming_the_field(tmp_path):
    review = binding("a", "gpu-1")
    del review["request"]["object"]["target"]
    reply = client_for(state_with(), tmp_path).post("/validate", json=review)
    assert reply.status_code == 400 and "request.object.target.name" in reply.get_json()["error"]


def test_a_pod_created_with_node_name_reserves_like_a_bind(tmp_path):
    state = state_with(node("n1", cpu="1"), pod("a", namespace="ml", requests={"cpu": "1"}))
    client = client_for(state, tmp_path)
    created = pod("direct", namespace="ml", node_name="n1", requests={"cpu": "1"})
    review = pod_create(created)
    assert answer(client, review)["allowed"] is True
    denied = answer(client, binding("a", "n1"))  # the created pod holds the cpu until the watch shows it
    assert denied["allowed"] is False and denied["status"]["reason"] == "OutOfcpu"
    review["request"]["object"] = pod("second", namespace="ml", node_name="n1", requests={"cpu": "1"})
    second = answer(client, review)
    assert second["allowed"] is False and "Drop spec.nodeName" in second["status"]["message"]


def test_a_mirror_pod_is_neither_rechecked_nor_reserved(tmp_path):
    # The kubelet creates it for a static pod it already runs: refusing it changes nothing on
    # the node, and its capacity must not be held twice until the watch shows it.
    state = state_with(
        node("n1", cpu="1"), pod("running", namespace="ml", node_name="n1", requests={"cpu": "1"})
    )
    client = client_for(state, tmp_path)
    mirror = pod("etcd-n1", namespace="ml", node_name="n1", requests={"cpu": "1"})
    mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "hash"}
    assert answer(client, pod_create(mirror))["allowed"] is True
    assert node_table(tmp_path / "reservations").entries("n1", time.monotonic() + 1) == []


def test_a_pod_bound_between_the_engines_verdict_and_the_reservation_still_counts(tmp_path):
    # The re-check is skipped only while the state is at the revision the engine judged it on.
    state = state_with(node("n1", cpu="1"), pod("a", namespace="ml", requests={"cpu": "1"}))
    guard = BindGuard(config_from_dict({}), node_table(tmp_path / "table"))
    req = parse_review(
        json.dumps(pod_create(pod("direct", namespace="ml", node_name="n1", requests={"cpu": "1"})))
    )
    outcome = review(req, VALIDATE, state, config_from_dict({}))
    assert outcome.allowed
    judged = (state, state.revision)
    state.set_pod("uid-a", pod_record(pod("a", namespace="ml", node_name="n1", requests={"cpu": "1"})))
    late = guard.review_created(req, FixedState(state), outcome, judged)
    assert not late.allowed and late.reasons == ["OutOfcpu"]


def _created(name: str, node_name: str, cpu: str) -> object:
    return parse_review(
        json.dumps(pod_create(pod(name, namespace="ml", node_name=node_name, requests={"cpu": cpu})))
    )


def test_the_cheap_path_reserves_what_it_allows(tmp_path):
    # Nothing in the table and the state unchanged: the engine's verdict stands without a second
    # check, and the pod's record is written all the same, for the binds that follow.
    state = state_with(node("n1", cpu="1"), pod("a", namespace="ml", requests={"cpu": "1"}))
    config = config_from_dict({})
    guard = BindGuard(config, node_table(tmp_path / "table"))
    req = _created("direct", "n1", "1")
    outcome = review(req, VALIDATE, state, config)
    assert guard.review_created(req, FixedState(state), outcome, (state, state.revision)).allowed
    assert [r.node for r in node_table(tmp_path / "table").entries("n1", time.monotonic() + 1)] == ["n1"]
    denied = guard.review(parse_review(json.dumps(binding("a", "n1"))), FixedState(state))
    assert not denied.allowed and denied.reasons == ["OutOfcpu"]


def test_the_cheap_path_is_not_taken_over_a_sibling_reservation(tmp_path):
    # A bind reserved the node's cpu first: a pod created with nodeName that the engine allowed
    # (the state does not show the bind yet) is judged with the reservation counted.
    state = state_with(node("n1", cpu="1"), pod("a", namespace="ml", requests={"cpu": "1"}))
    config = config_from_dict({})
    guard = BindGuard(config, node_table(tmp_path / "table"))
    assert guard.review(parse_review(json.dumps(binding("a", "n1"))), FixedState(state)).allowed
    req = _created("direct", "n1", "1")
    outcome = review(req, VALIDATE, state, config)
    assert outcome.allowed
    late = guard.review_created(req, FixedState(state), outcome, (state, state.revision))
    assert not late.allowed and late.reasons == ["OutOfcpu"]


def test_concurrent_creates_and_binds_over_two_workers_tables_never_overcommit(tmp_path):
    # Two guards on one table directory (two workers of a replica), 16 threads at once: pods
    # created with nodeName (engine-judged, cheap path) and a few binds, one cpu each, to a
    # 4-cpu node.
    pending = [pod(f"p{i}", namespace="ml", requests={"cpu": "1"}) for i in range(16)]
    state = state_with(node("n1", cpu="4"), *pending)
    config = config_from_dict({})
    guards = [BindGuard(config, node_table(tmp_path / "table")) for _ in range(2)]
    start = threading.Barrier(16)

    def decide(i: int) -> bool:
        guard, source = guards[i % 2], FixedState(state)
        if i % 4 == 3:
            request = parse_review(json.dumps(binding(f"p{i}", "n1")))
            start.wait()
            return guard.review(request, source).allowed
        request = _created(f"direct-{i}", "n1", "1")
        outcome = review(request, VALIDATE, state, config)
        assert outcome.allowed  # alone, each fits: only the table keeps them apart
        start.wait()
        return guard.review_created(request, source, outcome, (state, state.revision)).allowed

    with ThreadPoolExecutor(16) as pool:
        allowed = sum(pool.map(decide, range(16)))
    assert allowed == 4
    assert len(node_table(tmp_path / "table").entries("n1", time.monotonic() + 1)) == 4


def test_the_api_server_down_means_allowed_with_a_warning_within_three_seconds(tmp_path):
    server = FakeApiServer(Cluster())
    api = ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))
    server.close()  # nothing listens any more
    state = state_with(node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("a"))
    client = client_for(state, tmp_path, leases=node_leases(api, "admit-guard"))
    started = time.monotonic()
    response = answer(client, binding("a", "gpu-1"))
    assert time.monotonic() - started < 3
    assert response["allowed"] is True and "did not check this binding" in response["warnings"][0]


def test_a_device_binds_cpu_reservation_counts_for_a_cpu_only_bind(tmp_path, leases):
    _, store = leases
    both = pod("a", namespace="ml", requests={"nvidia.com/gpu": "1", "cpu": "1"})
    cpu_only = pod("b", namespace="ml", requests={"cpu": "1"})
    state = state_with(node("gpu-1", cpu="1", extra={"nvidia.com/gpu": "1"}), both, cpu_only)
    guard = BindGuard(config_from_dict({}), node_table(tmp_path / "local"), store)
    assert guard.review(review_of(binding("a", "gpu-1")), FixedState(state)).allowed  # through the Lease
    second = guard.review(review_of(binding("b", "gpu-1")), FixedState(state))  # through the table
    assert not second.allowed and second.reasons == ["OutOfcpu"]


def test_a_cpu_only_binds_reservation_counts_for_a_device_bind(tmp_path, leases):
    _, store = leases
    cpu_only = pod("a", namespace="ml", requests={"cpu": "1"})
    both = pod("b", namespace="ml", requests={"nvidia.com/gpu": "1", "cpu": "1"})
    state = state_with(node("gpu-1", cpu="1", extra={"nvidia.com/gpu": "1"}), cpu_only, both)
    guard = BindGuard(config_from_dict({}), node_table(tmp_path / "local"), store)
    assert guard.review(review_of(binding("a", "gpu-1")), FixedState(state)).allowed
    second = guard.review(review_of(binding("b", "gpu-1")), FixedState(state))
    assert not second.allowed and second.reasons == ["OutOfcpu"]


class EventAfterRead:
    """A state source that applies one watch event right after the next read ends."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.event = None

    @contextmanager
    def reading(self):
        yield StateView(self.state)
        event, self.event = self.event, None
        if event:
            event()


def test_the_winner_bound_between_reading_the_pod_and_deciding_still_counts(tmp_path):
    state = state_with(node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("a"), gpu_pod("b"))
    source = EventAfterRead(state)
    guard = BindGuard(config_from_dict({}), node_table(tmp_path / "local"))
    assert guard.review(review_of(binding("a", "gpu-1")), source).allowed
    source.event = lambda: state.set_pod("uid-a", pod_record(gpu_pod("a", node_name="gpu-1")))
    second = guard.review(review_of(binding("b", "gpu-1")), source)
    assert not second.allowed and second.reasons == ["OutOfnvidia.com/gpu"]


def test_a_replica_whose_watch_lags_counts_and_keeps_the_other_replicas_reservation(tmp_path):
    table = tmp_path / "shared"  # one store for both, as their Lease is
    ahead = state_with(node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("a"), gpu_pod("b"))
    behind = state_with(node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("b"))  # has not seen a
    conf = config_from_dict({})
    assert (
        BindGuard(conf, node_table(table)).review(review_of(binding("a", "gpu-1")), FixedState(ahead)).allowed
    )
    second = BindGuard(conf, node_table(table)).review(review_of(binding("b", "gpu-1")), FixedState(behind))
    assert not second.allowed and second.reasons == ["OutOfnvidia.com/gpu"]
    assert [r.pod for r in node_table(table).entries("gpu-1", time.monotonic() + 1)] == ["uid-a"]


def test_a_bound_pods_reservation_stays_stored_for_replicas_that_have_not_seen_it_bound(tmp_path):
    table = tmp_path / "shared"
    state = state_with(node("gpu-1", extra={"nvidia.com/gpu": "2"}), gpu_pod("a"), gpu_pod("b"), gpu_pod("c"))
    guard = BindGuard(config_from_dict({}), node_table(table))
    assert guard.review(review_of(binding("a", "gpu-1")), FixedState(state)).allowed
    state.set_pod("uid-a", pod_record(gpu_pod("a", node_name="gpu-1")))
    assert guard.review(review_of(binding("b", "gpu-1")), FixedState(state)).allowed  # a counts once
    assert [r.pod for r in node_table(table).entries("gpu-1", time.monotonic() + 1)] == ["uid-a", "uid-b"]
    state.remove_pod("uid-a")  # deleted: its reservation ends everywhere it is seen ended
    assert guard.review(review_of(binding("c", "gpu-1")), FixedState(state)).allowed
    assert [r.pod for r in node_table(table).entries("gpu-1", time.monotonic() + 1)] == ["uid-b", "uid-c"]


def test_exemptions_cover_binds_and_pods_created_with_node_name(tmp_path):
    config = {"exemptions": [{"namespaces": ["ml"]}]}
    state = state_with(node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("running", node_name="gpu-1"),
                       gpu_pod("late"))  # fmt: skip
    client = client_for(state, tmp_path, config)
    assert answer(client, binding("late", "gpu-1"))["allowed"] is True
    created = gpu_pod("direct", node_name="gpu-1")
    review = pod_create(created)
    assert answer(client, review)["allowed"] is True
    other = config_from_dict({"exemptions": [{"namespaces": ["other"]}]})
    guard = BindGuard(other, node_table(tmp_path / "other"))
    assert not guard.review(review_of(binding("late", "gpu-1")), FixedState(state)).allowed


def test_an_api_server_slower_than_the_deadline_for_one_call_fails_open(tmp_path, leases):
    cluster, store = leases
    cluster.lease_delay = 0.8
    state = state_with(node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("a"))
    config = {"policies": {"nodeAdmission": {"reservations": {"deadlineSeconds": 0.5}}}}
    client = client_for(state, tmp_path, config, leases=store)
    started = time.monotonic()
    response = answer(client, binding("a", "gpu-1"))
    assert time.monotonic() - started < 1.5
    assert response["allowed"] is True and "did not check this binding" in response["warnings"][0]
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'admit_guard_binding_fail_open_total{reason="deadline"} 1.0' in metrics


def test_a_slow_api_server_within_the_deadline_for_each_call_is_waited_for_and_decides(tmp_path, leases):
    # 0.4 s a call: the Lease's read and write together take longer than one deadline, but
    # neither call is an outage, so the bind is checked (and the second one denied).
    cluster, store = leases
    cluster.lease_delay = 0.4
    state = state_with(node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("a"), gpu_pod("b"))
    config = {"policies": {"nodeAdmission": {"reservations": {"deadlineSeconds": 0.5}}}}
    client = client_for(state, tmp_path, config, leases=store)
    first = answer(client, binding("a", "gpu-1"))
    assert first["allowed"] is True and "warnings" not in first
    second = answer(client, binding("b", "gpu-1"))
    assert second["allowed"] is False and second["status"]["reason"] == "OutOfnvidia.com/gpu"
    assert cluster.lease_writes == 1


def test_the_state_not_ready_allows_a_bind_with_a_warning_and_counts_it(tmp_path):
    conf = config_from_dict({})
    guard = BindGuard(conf, node_table(tmp_path / "local"))

    class Unsynced:
        @contextmanager
        def reading(self):
            yield StateView(None, "the guard's cluster state is still being listed")

        def readiness(self):
            return Readiness(False, "listing")

        def close(self):
            pass

    client = create_app(conf, Unsynced(), bind_guard=guard).test_client()
    response = answer(client, binding("a", "gpu-1"))
    assert response["allowed"] is True and "still being listed" in response["warnings"][0]
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'admit_guard_binding_fail_open_total{reason="state-unavailable"} 1.0' in metrics


def test_an_unknown_node_is_allowed_with_unknown_node_allow_and_denied_by_default(tmp_path):
    state = state_with(node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("a"))
    allow = client_for(state, tmp_path, {"policies": {"nodeAdmission": {"unknownNode": "allow"}}})
    response = answer(allow, binding("a", "gpu-9"))
    assert response["allowed"] is True and "gpu-9" in response["warnings"][0]
    assert 'reason="node-unknown"} 1.0' in allow.get("/metrics").get_data(as_text=True)
    denied = answer(client_for(state, tmp_path), binding("a", "gpu-9"))
    assert denied["allowed"] is False and denied["status"]["reason"] == "UnknownNode"


def test_a_legacy_bindings_resource_is_checked_like_the_subresource(tmp_path):
    state = state_with(
        node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("running", node_name="gpu-1"), gpu_pod("late")
    )
    review = binding("late", "gpu-1")
    review["request"]["resource"] = {"group": "", "version": "v1", "resource": "bindings"}
    del review["request"]["subResource"]
    response = answer(client_for(state, tmp_path), review)
    assert response["allowed"] is False and response["status"]["reason"] == "OutOfnvidia.com/gpu"


# -- two guard servers, two workers each, coordinating through the API server's Leases -------


@pytest.fixture
def gpu_cluster(tmp_path):
    cluster = Cluster(bookmark_every=0.2)
    cluster.load("nodes", [node("gpu-1", extra={"nvidia.com/gpu": "1"})])
    cluster.load("pods", [gpu_pod(f"trainer-{i}") for i in range(12)])
    server = FakeApiServer(cluster)
    yield cluster, server
    server.close()


def _twelve_binds_over_two_guards(cluster, server, tmp_path, reservations: str) -> tuple[list[dict], float]:
    """Twelve binds of the last GPU at once, alternating between two guard servers (two workers
    each): the responses, and the slowest answer's time."""
    kubeconfig = server.kubeconfig(tmp_path / "kubeconfig")
    config = tmp_path / "config.yaml"
    config.write_text(f"policies: {{nodeAdmission: {{reservations: {{{reservations}}}}}}}\n")
    args = ("--kubeconfig", kubeconfig, "--config", str(config))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with live_server(tmp_path / "a", *args) as first, live_server(tmp_path / "b", *args) as second:
        guards = [first, second]
        start = threading.Barrier(12)

        def bind(i: int) -> tuple[dict, float]:
            conn = guards[i % 2].connect()
            start.wait()
            began = time.monotonic()
            try:
                response = post_json(conn, "/validate", binding(f"trainer-{i}", "gpu-1"))[1]["response"]
                return response, time.monotonic() - began
            finally:
                conn.close()

        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(bind, range(12)))
    return [r for r, _ in answers], max(t for _, t in answers)


def test_twelve_concurrent_binds_of_the_last_gpu_over_two_guards_allow_exactly_one(gpu_cluster, tmp_path):
    cluster, server = gpu_cluster
    responses, _ = _twelve_binds_over_two_guards(
        cluster, server, tmp_path, "namespace: admit-guard, deadlineSeconds: 2, waitSeconds: 10"
    )
    allowed = [r for r in responses if r["allowed"]]
    assert len(allowed) == 1, json.dumps(responses, indent=1)
    assert {r["status"]["reason"] for r in responses if not r["allowed"]} == {"OutOfnvidia.com/gpu"}
    assert [lease["metadata"]["name"] for lease in cluster.leases.values()] == ["admit-guard-node-gpu-1"]


def test_binds_queued_behind_a_slow_but_healthy_api_server_are_decided_never_waved_through(
    gpu_cluster, tmp_path
):
    # Every Lease call takes 0.5 s, inside the 1 s deadline: binds that wait for a sibling's
    # decision on the node are decided with what it wrote (or denied busy), not allowed unchecked.
    cluster, server = gpu_cluster
    cluster.lease_delay = 0.5
    responses, slowest = _twelve_binds_over_two_guards(cluster, server, tmp_path, "namespace: admit-guard")
    allowed = [r for r in responses if r["allowed"]]
    assert len(allowed) == 1, json.dumps(responses, indent=1)
    assert "warnings" not in allowed[0]  # checked, not waved through
    denied = {r["status"]["reason"] for r in responses if not r["allowed"]}
    assert denied <= {"OutOfnvidia.com/gpu", "ReservationBusy"}, denied
    assert slowest < 5, slowest  # the bindings webhook's timeoutSeconds in deploy/


def test_the_reservation_table_keeps_a_bounded_number_of_files_open(tmp_path):
    table = node_table(tmp_path / "table")
    before = len(os.listdir("/proc/self/fd"))
    for n in range(LocalTable.OPEN_FILES + 200):
        new = Reservation(f"uid-{n}", f"node-{n}", {"cpu": 1}, (), time.time() + 30)
        assert reserve(table, new, lambda stored: True, lambda r: True, deadline=time.monotonic() + 1)
    assert len(os.listdir("/proc/self/fd")) - before <= LocalTable.OPEN_FILES
    again = Reservation("uid-x", "node-0", {"cpu": 1}, (), time.time() + 30)
    seen: list = []
    reserve(
        table,
        again,
        lambda stored: seen.extend(stored) or True,
        lambda r: True,
        deadline=time.monotonic() + 1,
    )
    assert [r.pod for r in seen] == ["uid-0"]  # a kept-open file still reads what was written


def _reserve_from_threads(table: LocalTable, worker: int, capacity: int, results) -> None:
    """One forked worker: four threads each try to take one of ``capacity`` slots on node-1."""

    def decide(stored: list[Reservation]) -> bool:
        time.sleep(0.002)  # a slow decision (one through a Lease is): the others must wait it out
        return len(stored) < capacity

    def attempt(thread: int) -> bool:
        new = Reservation(f"uid-{worker}-{thread}", "node-1", {"cpu": 1}, (), time.time() + 30)
        return reserve(table, new, decide, lambda r: True, deadline=time.monotonic() + 10)

    with ThreadPoolExecutor(4) as pool:
        results.put(sum(pool.map(attempt, range(4))))


def test_workers_and_threads_racing_for_a_node_never_reserve_past_its_capacity(tmp_path):
    import multiprocessing

    table = node_table(tmp_path / "table")  # made before the fork, as gunicorn's workers get it
    table.entries("node-1", time.monotonic() + 1)  # and used before it too
    fork = multiprocessing.get_context("fork")
    results = fork.Queue()
    workers = [fork.Process(target=_reserve_from_threads, args=(table, w, 5, results)) for w in range(4)]
    for worker in workers:
        worker.start()
    allowed = sum(results.get(timeout=30) for _ in workers)
    for worker in workers:
        worker.join(10)
    assert allowed == 5
    assert len(table.entries("node-1", time.monotonic() + 1)) == 5


def test_the_reservation_table_grows_past_its_first_page_and_reads_back_from_another_worker(tmp_path):
    writer, reader = node_table(tmp_path / "table"), node_table(tmp_path / "table")
    assert reader.entries("node-1", time.monotonic() + 1) == []  # mapped while the file is small
    for n in range(200):  # ~100 bytes an entry: several pages
        new = Reservation(f"uid-{n:03}", "node-1", {"cpu": 1}, (("TCP", "", 8000 + n),), time.time() + 30)
        assert reserve(writer, new, lambda stored: True, lambda r: True, deadline=time.monotonic() + 1)
    assert [r.pod for r in reader.entries("node-1", time.monotonic() + 1)] == [
        f"uid-{n:03}" for n in range(200)
    ]


def test_a_table_whose_header_claims_more_than_the_file_holds_is_read_as_empty_and_rewritten(tmp_path):
    table = node_table(tmp_path / "table")
    first = Reservation("uid-a", "node-1", {"cpu": 1}, (), time.time() + 30)
    assert reserve(table, first, lambda stored: True, lambda r: True, deadline=time.monotonic() + 1)
    with open(tmp_path / "table" / "node-1.table", "r+b") as damaged:
        damaged.write(struct.pack("<QQQ", 7, 24, 2**62))  # a generation no worker wrote, an absurd length
    assert node_table(tmp_path / "table").entries("node-1", time.monotonic() + 1) == []
    second = Reservation("uid-b", "node-1", {"cpu": 1}, (), time.time() + 30)
    assert reserve(table, second, lambda stored: True, lambda r: True, deadline=time.monotonic() + 1)
    assert [r.pod for r in node_table(tmp_path / "table").entries("node-1", time.monotonic() + 1)] == [
        "uid-b"
    ]
    assert (tmp_path / "table" / "node-1.table").stat().st_size == 4096  # never grown to the claim


def test_a_worker_killed_before_its_write_is_committed_leaves_the_entries_whole(tmp_path, monkeypatch):
    from webhook.coordination import table as reservations

    table = node_table(tmp_path / "table")
    for pod_uid in ("uid-a", "uid-b"):
        new = Reservation(pod_uid, "node-1", {"cpu": 1}, (), time.time() + 30)
        assert reserve(table, new, lambda stored: True, lambda r: True, deadline=time.monotonic() + 1)

    class Killed(BaseException):
        pass

    class KilledBeforeTheHeader:  # the entries are written; the header that points to them is not
        size, unpack_from = reservations._HEADER.size, reservations._HEADER.unpack_from

        def pack_into(self, *args):
            raise Killed

    monkeypatch.setattr(reservations, "_HEADER", KilledBeforeTheHeader())
    late = Reservation("uid-c", "node-1", {"cpu": 1}, (), time.time() + 30)
    with pytest.raises(Killed):
        reserve(table, late, lambda stored: True, lambda r: True, deadline=time.monotonic() + 1)
    monkeypatch.undo()
    stored = node_table(tmp_path / "table").entries("node-1", time.monotonic() + 1)
    assert [r.pod for r in stored] == ["uid-a", "uid-b"]


def test_an_update_of_a_placed_pod_is_not_rechecked_by_the_bind_guard(tmp_path):
    # The kubelet admits a pod once; relabelling a running pod on a node under DiskPressure
    # must not meet the eviction manager's rule, nor reserve its capacity again.
    state = state_with(node("n1", conditions=["DiskPressure"]))
    running = pod("a", namespace="ml", node_name="n1", requests={"cpu": "1"})
    state.set_pod("uid-a", pod_record(running))
    updated = json.loads(json.dumps(running))
    updated["metadata"]["labels"] = {"tier": "batch"}
    review = pod_create(updated)
    review["request"].update(operation="UPDATE", oldObject=running)
    assert answer(client_for(state, tmp_path), review)["allowed"] is True
    assert node_table(tmp_path / "reservations").entries("n1", time.monotonic() + 1) == []


def test_a_table_that_cannot_be_remapped_fails_that_reservation_only(tmp_path, monkeypatch):
    from webhook.coordination import table as reservations

    table = node_table(tmp_path / "table")
    real_mmap = reservations.mmap.mmap

    def no_memory(*args):
        raise OSError(12, "Cannot allocate memory")

    def take(n: int) -> bool:
        new = Reservation(f"uid-{n:03}", "node-1", {"cpu": 1}, (), time.time() + 30)
        return reserve(table, new, lambda stored: True, lambda r: True, deadline=time.monotonic() + 1)

    assert take(0)  # mapped
    monkeypatch.setattr(reservations.mmap, "mmap", no_memory)
    with pytest.raises(OSError):
        for n in range(1, 200):  # until the file must grow
            take(n)
    monkeypatch.setattr(reservations.mmap, "mmap", real_mmap)
    assert take(999)  # the old mapping was kept, not left closed
    assert "uid-999" in [r.pod for r in table.entries("node-1", time.monotonic() + 1)]


def test_the_table_file_is_allocated_as_it_grows_never_sparse(tmp_path):
    # A store into an unallocated page of a mapping on a full disk is SIGBUS, not ENOSPC.
    table = node_table(tmp_path / "table")
    many = {f"example.com/r{i}": 1 for i in range(1000)}  # ~21 kB of JSON: the file grows to 32 kB
    new = Reservation("uid-a", "node-1", many, (), time.time() + 30)
    assert reserve(table, new, lambda stored: True, lambda r: True, deadline=time.monotonic() + 1)
    info = (tmp_path / "table" / "node-1.table").stat()
    assert info.st_size == 32768 and info.st_blocks * 512 >= info.st_size


def test_a_filesystem_that_cannot_allocate_ahead_still_holds_the_table(tmp_path, monkeypatch):
    import errno

    def unsupported(*args):
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(os, "posix_fallocate", unsupported)
    table = node_table(tmp_path / "table")
    new = Reservation("uid-a", "node-1", {"cpu": 1}, (), time.time() + 30)
    assert reserve(table, new, lambda stored: True, lambda r: True, deadline=time.monotonic() + 1)
    stored = node_table(tmp_path / "table").entries("node-1", time.monotonic() + 1)
    assert [r.pod for r in stored] == ["uid-a"]
