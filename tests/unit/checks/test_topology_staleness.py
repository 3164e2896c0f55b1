"""What a node's NRT does not count yet (issue 27 item 4): pods the state saw bound after the NRT
last changed and binds in flight are placed where the kubelet would put them and taken from
those zones until the NRT changes; the binds in flight are coordinated across replicas through
the node's Lease; the NRT's ``nodeTopologyPodsFingerprint`` says whether its amounts count the
pods the guard knows there (``podfingerprint.Fingerprint.Sign``)."""

from __future__ import annotations

import json
import time

from tests.helpers.binds import binding, review_of
from tests.helpers.builders import node, pod
from tests.helpers.paths import FIXTURES
from tests.helpers.topology_builders import guaranteed, nrt
from webhook.binding import BindGuard
from webhook.checks import PodUnderReview, kubelet_admission
from webhook.config import config_from_dict
from webhook.coordination.reservations import Reservation, footprint_for, node_table
from webhook.engine import evaluate
from webhook.kube.podfingerprint import pod_hash, sign, xxh64
from webhook.kube.workloads import pod_shape
from webhook.serve.app import create_app
from webhook.state import ClusterState, node_from, pod_record
from webhook.state.source import FixedState
from webhook.state.topology import APP, Unit, topology_from

TWO_BY_12 = [{"cpu": ("16", "12", "12")}, {"cpu": ("16", "12", "12")}]
UPSTREAM_PODS = FIXTURES / "podfingerprint_pods.json"  # podfingerprint's testdata


def live_state(zones=TWO_BY_12, policy="single-numa-node", *, age_known=True, **attributes) -> ClusterState:
    """``node-1`` with an NRT of ``zones``; ``age_known``: a live state past its first lists."""
    state = ClusterState()
    state.set_node(node_from(node("node-1", cpu="256", memory="1Ti")))
    state.set_topology("node-1", topology_from(nrt("node-1", zones, policy=policy, attributes=attributes)))
    state.topology_age_known = age_known
    return state


def cpu_pod(name: str, cpu: str, node_name: str | None = None) -> dict:
    return pod(name, namespace="ml", node_name=node_name, containers=[guaranteed(cpu=cpu)])


def bind_pod(state: ClusterState, name: str, cpu: str) -> None:
    obj = cpu_pod(name, cpu, "node-1")
    state.set_pod(obj["metadata"]["uid"], pod_record(obj))


def reasons_for(state: ClusterState, cpu: str) -> list[str]:
    review = PodUnderReview.from_shape(pod_shape(cpu_pod("new", cpu, "node-1")))
    return [f.reason for f in kubelet_admission(review, state.nodes["node-1"], state.usage("node-1"))]


def refresh(state: ClusterState, available: tuple[str, str], **attributes) -> None:
    """The exporter's next NRT: the zones' available CPUs now ``available``."""
    zones = [{"cpu": ("16", "12", a)} for a in available]
    state.set_topology("node-1", topology_from(nrt("node-1", zones, attributes=attributes)))


# -- pods bound after the NRT ----------------------------------------------------------------------


def test_a_pod_bound_after_the_nrt_is_taken_from_the_lowest_zone_that_fits_until_the_nrt_changes():
    state = live_state()
    bind_pod(state, "first", "10")  # node-0: 12 → 2 free
    assert reasons_for(state, "10") == []  # node-1 still has 12
    bind_pod(state, "second", "10")  # node-1: 12 → 2 free
    assert reasons_for(state, "10") == ["TopologyAffinityError"]
    assert reasons_for(state, "2") == []
    refresh(state, ("2", "12"))  # the exporter saw only the first
    assert reasons_for(state, "10") == []


def test_the_placement_a_decision_reuses_is_redone_when_a_placed_pod_changes():
    """Decisions on one node reuse the zones its unaccounted pods were placed on, but only while
    those are the same pods: a pod resized in place (a new record) is placed again."""
    state = live_state()
    bind_pod(state, "a", "10")  # node-0: 2 left
    bind_pod(state, "b", "10")  # node-1: 2 left
    assert reasons_for(state, "10") == ["TopologyAffinityError"]
    assert reasons_for(state, "10") == ["TopologyAffinityError"]  # the same pods: the same zones
    bind_pod(state, "b", "2")  # b resized to 2: it fits node-0 beside a, node-1 is free again
    assert reasons_for(state, "10") == []


def test_pods_bound_in_bind_order_fill_zones_as_the_kubelet_does():
    """``singleNumaNodePolicy``: each pod takes the lowest-numbered zone that fits after the
    earlier ones: 8 goes to node-0 (4 left), 6 to node-1 (6 left), the next 6 to node-1 (0 left)."""
    state = live_state()
    bind_pod(state, "a", "8")  # node-0: 4 left
    bind_pod(state, "b", "6")  # 4 < 6: node-1, 6 left
    assert reasons_for(state, "6") == []  # node-1's 6
    bind_pod(state, "c", "6")
    assert reasons_for(state, "5") == ["TopologyAffinityError"]
    assert reasons_for(state, "4") == []  # node-0's 4


def test_a_pod_that_ends_no_longer_counts_against_its_zone():
    state = live_state()
    bind_pod(state, "first", "10")
    bind_pod(state, "second", "10")
    state.remove_pod("uid-second")
    assert reasons_for(state, "10") == []


def test_in_a_snapshot_the_pods_on_the_node_are_counted_in_its_nrt():
    """No way to tell the NRT's age: its ``available`` is taken to count every pod on the node."""
    state = live_state(age_known=False)
    bind_pod(state, "first", "10")
    bind_pod(state, "second", "10")
    assert reasons_for(state, "10") == []


def test_an_nrt_rewritten_with_the_same_content_does_not_count_the_pods_bound_since():
    """An exporter's periodic rewrite that still shows 12 free on each zone has not counted a
    10-CPU pod: only a change of the NRT's content ends the subtraction."""
    state = live_state()
    bind_pod(state, "first", "10")
    bind_pod(state, "second", "10")
    refresh(state, ("12", "12"))
    assert reasons_for(state, "10") == ["TopologyAffinityError"]


def test_a_multi_zone_placement_counts_against_every_zone_it_could_be_on():
    """``restricted``: 20 CPUs on 2x16 is preferred only as {0,1}, its CPUs somewhere in both
    (``takeByTopology``): 20 is then taken from each zone, as scheduler-plugins' overreserve does."""
    zones = [{"cpu": ("16", "16", "16")}, {"cpu": ("16", "16", "16")}]
    state = live_state(zones, policy="restricted")
    bind_pod(state, "wide", "20")
    assert reasons_for(state, "1") == ["TopologyAffinityError"]


def test_a_burstable_pod_bound_after_the_nrt_takes_nothing_from_the_zones():
    state = live_state()
    obj = pod("b", namespace="ml", node_name="node-1", requests={"cpu": "10"})
    state.set_pod("uid-b", pod_record(obj))
    assert not state.usage("node-1").unaccounted
    bind_pod(state, "first", "10")
    assert reasons_for(state, "10") == []


# -- binds in flight --------------------------------------------------------------------------------


def pending_state(*names: str, age_known=True) -> ClusterState:
    state = live_state(age_known=age_known)
    for name in names:
        obj = cpu_pod(name, "10")
        state.set_pod(obj["metadata"]["uid"], pod_record(obj))
    return state


def test_three_ten_cpu_binds_to_two_twelve_cpu_zones_get_exactly_two_allows(tmp_path):
    state = pending_state("a", "b", "c")
    guard = BindGuard(config_from_dict({}), node_table(tmp_path / "table"))
    answers = [guard.review(review_of(binding(n, "node-1")), FixedState(state)) for n in "abc"]
    assert [a.allowed for a in answers] == [True, True, False]
    assert answers[2].reasons == ["TopologyAffinityError"]


def test_three_ten_cpu_binds_over_two_replicas_get_two_allows_through_the_lease(tmp_path, leases):
    _, store = leases
    state = pending_state("a", "b", "c")
    replicas = [
        BindGuard(config_from_dict({}), node_table(tmp_path / name), store) for name in ("one", "two")
    ]
    answers = [
        replicas[i % 2].review(review_of(binding(n, "node-1")), FixedState(state))
        for i, n in enumerate("abc")
    ]
    assert [a.allowed for a in answers] == [True, True, False]


def test_a_reservation_carries_the_pods_footprint_under_a_key_earlier_versions_ignore():
    record = pod_record(cpu_pod("a", "10"))
    stored = Reservation.of(record, "node-1", 30, 1000.0).as_json()
    assert stored["numa"] == [[APP, 10_000, {"memory": 1 << 30}, {}]]
    earlier_keys = {"pod", "node", "requests", "hostPorts", "expires", "scheduler"}
    assert earlier_keys <= set(stored) and set(stored) - earlier_keys == {"numa"}
    read = Reservation.from_json(json.loads(json.dumps(stored)))
    assert read.numa == (Unit(APP, "", 10_000, {"memory": 1 << 30}, {}),)  # names are not stored
    plain = Reservation.of(pod_record(pod("b", requests={"cpu": "1"})), "node-1", 30, 1000.0).as_json()
    assert "numa" not in plain


def test_an_earlier_versions_reservation_is_placed_by_the_pods_footprint_in_the_state(tmp_path):
    """A record without ``numa`` (written by the previous version) holds the zone its pod's spec,
    as this replica's state has it, would take."""
    state = pending_state("a", "b", "c")
    old = Reservation(
        "uid-a", "node-1", {"cpu": 10_000, "memory": 1 << 30}, (), time.time() + 30, scheduler="s"
    )
    table = node_table(tmp_path / "table")
    with table.locked("node-1", time.monotonic() + 5) as held:
        held.store([old])
    guard = BindGuard(config_from_dict({}), table)
    assert guard.review(review_of(binding("b", "node-1")), FixedState(state)).allowed
    assert not guard.review(review_of(binding("c", "node-1")), FixedState(state)).allowed


def test_an_earlier_versions_reservation_of_an_unknown_pod_holds_its_devices_on_a_zone():
    old = Reservation("uid-x", "node-1", {"cpu": 1000, "nvidia.com/gpu": 1}, (), 1e12)
    assert footprint_for(old, ClusterState()) == (Unit(APP, "", 0, {}, {"nvidia.com/gpu": 1}),)


# -- nodeTopologyPodsFingerprint ---------------------------------------------------------------------


def test_the_fingerprint_is_podfingerprints_known_answer_for_its_testdata():
    """``podfingerprint_test.go :: TestCheck`` "correct fingerprint": pods.json signs to this."""
    pods = json.loads(UPSTREAM_PODS.read_text())
    assert sign(pod_hash(p["namespace"], p["name"]) for p in pods) == "pfp0v001e477a4e3b2fc0ec6"
    assert sign(pod_hash(p["namespace"], p["name"]) for p in reversed(pods)) == "pfp0v001e477a4e3b2fc0ec6"


def test_xxh64_gives_the_reference_digests():
    assert xxh64(b"") == 0xEF46DB3751D8E999
    assert xxh64(b"a") == 0xD24EC4F1A98C6E5B
    assert xxh64(b"abc") == 0x44BC2CF5AD770999


def fingerprint_of(*names: str) -> str:
    return sign(pod_hash("ml", n) for n in names)


def test_a_matching_fingerprint_shows_the_nrt_counts_the_pods_bound_since():
    state = live_state()
    bind_pod(state, "first", "10")
    bind_pod(state, "second", "10")
    assert reasons_for(state, "10") == ["TopologyAffinityError"]
    refresh(state, ("2", "2"), nodeTopologyPodsFingerprint=fingerprint_of("first", "second"))
    state.usage("node-1").unaccounted.update({"uid-first": None, "uid-second": None})  # as if bound after
    assert reasons_for(state, "2") == []  # not taken twice


def test_a_refusal_on_an_nrt_whose_fingerprint_differs_is_a_warning_counted_in_the_metric(tmp_path):
    state = live_state(nodeTopologyPodsFingerprint=fingerprint_of("someone-else"))
    bind_pod(state, "first", "10")
    bind_pod(state, "second", "10")
    decision = evaluate(cpu_pod("new", "10", "node-1"), "CREATE", state, config_from_dict({}))
    assert decision.allowed and decision.doubts == ["fingerprint-mismatch"]
    assert any("TopologyAffinityError" in w and "nodeTopologyPodsFingerprint" in w for w in decision.warnings)
    app = create_app(config_from_dict({}), FixedState(state)).test_client()
    kind = {"group": "", "version": "v1", "kind": "Pod"}
    request = {"uid": "u", "kind": kind, "namespace": "ml", "operation": "CREATE"}
    obj = cpu_pod("new", "10", "node-1")
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {**request, "object": obj},
    }
    assert app.post("/validate", json=review).get_json()["response"]["allowed"]
    scraped = app.get("/metrics").get_data(as_text=True)
    assert 'admit_guard_topology_refusals_doubted_total{reason="fingerprint-mismatch"} 1.0' in scraped


def test_a_doubted_topology_refusal_still_lets_the_predicates_refuse():
    state = live_state(nodeTopologyPodsFingerprint=fingerprint_of("someone-else"))
    state.set_node(node_from(node("node-1", cpu="4", memory="1Ti")))
    review = PodUnderReview.from_shape(pod_shape(cpu_pod("new", "13", "node-1")))
    failures = kubelet_admission(review, state.nodes["node-1"], state.usage("node-1"))
    assert [(f.reason, bool(f.doubt)) for f in failures] == [
        ("TopologyAffinityError", True),
        ("OutOfcpu", False),
    ]
