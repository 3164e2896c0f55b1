"""The storm breaker: kubelet admission rejections per owner open a breaker that denies the
owner's new pods (AdmissionStorm), with a half-open probe, a doubling cool-down, and closing
when a pod of the owner runs. Live against the fake API server, and from snapshots."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest

from tests.helpers.builders import node, pod
from tests.helpers.fake_apiserver import Cluster, FakeApiServer
from tests.helpers.informer import eventually
from tests.helpers.storm import OWNER, owned, rejected
from webhook.config import config_from_dict
from webhook.engine import evaluate
from webhook.serve.app import create_app
from webhook.state.apiserver import ApiServer
from webhook.state.informer import Informer, Timing
from webhook.state.snapshot import load_snapshot
from webhook.state.storm import CLOSED, HALF_OPEN, MAX_COOLDOWN, MAX_KEPT, MAX_SEEN, OPEN, StormBreakers


def container_failure(name: str) -> dict:
    obj = owned(name, node_name="gpu-1")
    obj["status"] = {"phase": "Failed", "reason": "Error", "message": "container exited with 1"}
    return obj


# -- the breaker itself ---------------------------------------------------------------------


def test_threshold_rejections_within_the_window_open_the_breaker():
    storm = StormBreakers(threshold=3, window=60, cooldown=10)
    storm.rejected(OWNER, "a", "OutOfcpu", "n1", 0)
    storm.rejected(OWNER, "b", "OutOfcpu", "n1", 100)  # the first fell out of the window
    storm.rejected(OWNER, "c", "OutOfcpu", "n1", 110)
    assert storm.breakers["rs-uid"].state == CLOSED
    storm.rejected(OWNER, "c", "OutOfcpu", "n1", 111)  # the same pod again: not counted
    assert storm.breakers["rs-uid"].state == CLOSED
    storm.rejected(OWNER, "d", "OutOfcpu", "n1", 120)
    assert storm.breakers["rs-uid"].state == OPEN and storm.trips == 1
    assert storm.verdict("rs-uid", 125).deny


def test_after_the_cool_down_one_probe_is_admitted_and_the_others_still_denied():
    storm = StormBreakers(threshold=1, window=60, cooldown=10)
    storm.rejected(OWNER, "a", "OutOfcpu", "n1", 0)
    assert storm.verdict("rs-uid", 9).deny
    probe = storm.verdict("rs-uid", 10)
    assert not probe.deny and probe.probe
    storm.probe_admitted("rs-uid", 10)
    assert storm.breakers["rs-uid"].state == HALF_OPEN and storm.probes == 1
    assert storm.verdict("rs-uid", 11).deny


def test_a_rejected_probe_reopens_with_the_cool_down_doubled_up_to_an_hour():
    storm = StormBreakers(threshold=1, window=60, cooldown=1000)
    storm.rejected(OWNER, "a", "OutOfcpu", "n1", 0)
    cooldowns = []
    at = 0.0
    for n in range(4):
        at += storm.breakers["rs-uid"].cooldown
        storm.probe_admitted("rs-uid", at)
        storm.rejected(OWNER, f"probe-{n}", "OutOfcpu", "n1", at + 1)
        cooldowns.append(storm.breakers["rs-uid"].cooldown)
    assert cooldowns == [2000, MAX_COOLDOWN, MAX_COOLDOWN, MAX_COOLDOWN]
    assert storm.breakers["rs-uid"].state == OPEN


def test_a_running_pod_of_the_owner_closes_a_half_open_breaker():
    storm = StormBreakers(threshold=1, window=60, cooldown=5)
    storm.rejected(OWNER, "a", "OutOfcpu", "n1", 0)
    storm.running("rs-uid", 1)  # open: a pod that was already running proves nothing
    assert storm.breakers["rs-uid"].state == OPEN
    storm.probe_admitted("rs-uid", 5)
    storm.running("rs-uid", 6)
    assert storm.breakers["rs-uid"].state == CLOSED and not storm.verdict("rs-uid", 7).deny


def test_memory_is_bounded_whatever_the_number_of_failed_pods():
    storm = StormBreakers(threshold=5, window=60, cooldown=5)
    for n in range(20 * MAX_KEPT):
        storm.rejected(OWNER, f"p{n}", "OutOfcpu", "n1", n / 1000)
    breaker = storm.breakers["rs-uid"]
    assert len(breaker.recent) == MAX_KEPT and len(breaker.seen) == MAX_SEEN
    assert breaker.total == 20 * MAX_KEPT


def test_old_rejections_found_by_a_live_list_are_recorded_but_trip_nothing():
    storm = StormBreakers(threshold=3, window=60, cooldown=10)
    day = 86_400.0
    for n in range(5):
        storm.rejected(OWNER, f"p{n}", "OutOfcpu", "n1", n, now=day)  # a storm a day ago
    breaker = storm.breakers["rs-uid"]
    assert breaker.state == CLOSED and breaker.total == 5 and storm.trips == 0
    for n in range(3):
        storm.rejected(OWNER, f"new{n}", "OutOfcpu", "n1", day - 10 + n, now=day)  # a storm now
    assert breaker.state == OPEN and storm.trips == 1


def test_pods_listed_again_after_a_relist_are_not_counted_again():
    storm = StormBreakers(threshold=3, window=60, cooldown=10)
    for n in range(3):
        storm.rejected(OWNER, f"p{n}", "OutOfcpu", "n1", n)
    storm.probe_admitted("rs-uid", 20)
    for n in range(3):  # the relist finds the same Failed pods
        storm.rejected(OWNER, f"p{n}", "OutOfcpu", "n1", n, now=25)
    breaker = storm.breakers["rs-uid"]
    assert breaker.state == HALF_OPEN and breaker.cooldown == 10 and breaker.total == 3
    storm.running("rs-uid", 30)
    for n in range(3):
        storm.rejected(OWNER, f"p{n}", "OutOfcpu", "n1", n, now=35)
    assert breaker.state == CLOSED and storm.trips == 1


def test_an_open_breaker_whose_owner_creates_no_pods_is_forgotten_after_a_cooldown_and_a_window():
    storm = StormBreakers(threshold=1, window=60, cooldown=10)
    storm.rejected(OWNER, "a", "OutOfcpu", "n1", 0)
    storm.prune(69)
    assert [b.owner for b in storm.open_breakers()] == [OWNER]
    storm.prune(71)
    assert not storm.open_breakers() and not storm.breakers


def test_each_breaker_transition_is_one_log_line(caplog):
    caplog.set_level("INFO", logger="webhook.state.storm")
    storm = StormBreakers(threshold=1, window=60, cooldown=10)
    storm.rejected(OWNER, "a", "OutOfcpu", "n1", 0)
    storm.probe_admitted("rs-uid", 11)
    storm.running("rs-uid", 12)
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(" for ")[0] for line in lines] == [
        "storm breaker open",
        "storm breaker half-open",
        "storm breaker closed",
    ]
    assert all("ReplicaSet ml/trainer-7d9f" in line for line in lines)


def test_only_kubelet_admission_rejections_count():
    storm = StormBreakers(threshold=1, window=60, cooldown=5)
    storm.observe(container_failure("crashed"), 1.0)
    evicted = owned("evicted")
    evicted["status"] = {"phase": "Failed", "reason": "Evicted", "message": "The node was low on memory."}
    storm.observe(evicted, 1.0)
    deadline = owned("late")
    deadline["status"] = {"phase": "Failed", "reason": "DeadlineExceeded"}
    storm.observe(deadline, 1.0)
    assert not storm.breakers
    storm.observe(rejected("r"), 2.0)
    assert storm.breakers["rs-uid"].state == OPEN


# -- the policy, through the engine ----------------------------------------------------------


def _state_with_open_breaker():
    from webhook.state import ClusterState

    storm = StormBreakers(threshold=2, window=300, cooldown=120)
    for n in range(2):
        storm.observe(rejected(f"r{n}"), 1000.0)
    return ClusterState(storm)


def test_an_open_breaker_denies_the_owners_pod_creates_with_reasons_nodes_and_cleanup():
    decision = evaluate(owned("next"), "CREATE", _state_with_open_breaker(), config_from_dict({}), now=1010.0)
    [violation] = decision.violations
    assert violation.reason == "AdmissionStorm"
    assert "ReplicaSet ml/trainer-7d9f" in violation.message and "OutOfnvidia.com/gpu x2" in violation.message
    assert "gpu-1 x2" in violation.message
    assert (
        "kubectl delete pods -n ml --field-selector=status.phase=Failed -l app=trainer,pod-template-hash=7d9f"
        in violation.message
    )


def test_other_owners_and_pods_without_a_controller_are_not_touched():
    state = _state_with_open_breaker()
    stranger = pod("solo", namespace="ml")
    assert evaluate(stranger, "CREATE", state, config_from_dict({}), now=1010.0).violations == []


def test_warn_mode_warns_and_off_ignores():
    state = _state_with_open_breaker()
    warn = evaluate(
        owned("n"),
        "CREATE",
        state,
        config_from_dict({"policies": {"stormBreaker": {"mode": "warn"}}}),
        now=1010.0,
    )
    assert warn.allowed and "AdmissionStorm" in warn.warnings[0]
    off = evaluate(
        owned("n"),
        "CREATE",
        state,
        config_from_dict({"policies": {"stormBreaker": {"mode": "off"}}}),
        now=1010.0,
    )
    assert off.allowed and not off.warnings


# -- snapshots: the same states from creationTimestamp ---------------------------------------


def _stamp(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_a_snapshot_rebuilds_owner_states_from_creation_times(tmp_path):
    now = time.time()
    items = [node("gpu-1")] + [rejected(f"r{n}", created=_stamp(now - 60 + n)) for n in range(25)]
    (tmp_path / "snapshot.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    config = config_from_dict({})
    state = load_snapshot([str(tmp_path / "snapshot.json")], config.storm_breaker)
    assert state.storm.breakers["rs-uid"].state == OPEN
    assert evaluate(owned("next"), "CREATE", state, config, now=now).violations[0].reason == "AdmissionStorm"
    old = [node("gpu-1")] + [rejected(f"r{n}", created=_stamp(now - 86400 + n * 60)) for n in range(25)]
    (tmp_path / "old.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": old}))
    spread = load_snapshot([str(tmp_path / "old.json")], config.storm_breaker)
    assert spread.storm.breakers["rs-uid"].state == CLOSED  # one a minute: never 20 in 5 minutes


# -- live, against the fake API server -------------------------------------------------------

SHORT = {"policies": {"stormBreaker": {"threshold": 20, "windowSeconds": 300, "cooldownSeconds": 1.0}}}


@pytest.fixture
def live(tmp_path):
    cluster = Cluster(bookmark_every=0.2)
    cluster.load("nodes", [node("gpu-1")])
    cluster.load("pods", [])
    server = FakeApiServer(cluster)
    config = config_from_dict(SHORT)
    api = ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))
    informer = Informer(api, Timing(page_size=50), StormBreakers.from_config(config.storm_breaker)).start()
    assert informer.wait_synced(10)
    client = create_app(config, informer, source_name="informer").test_client()
    yield cluster, informer, client
    informer.stop()
    server.close()


def review(obj: dict, dry_run: bool = False) -> dict:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "ml",
            "operation": "CREATE",
            "object": obj,
            "dryRun": dry_run,
            "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
        },
    }


def answer(client, obj: dict, dry_run: bool = False) -> dict:
    return client.post("/validate", json=review(obj, dry_run)).get_json()["response"]


def test_live_rejections_trip_the_breaker_within_seconds_and_dry_runs_are_denied_too(live):
    cluster, _, client = live
    assert answer(client, owned("first"))["allowed"]
    for n in range(25):
        cluster.put("pods", rejected(f"r{n}"))
    assert eventually(lambda: not answer(client, owned("next"))["allowed"], timeout=5)
    denied = answer(client, owned("next"))
    assert denied["status"]["reason"] == "AdmissionStorm" and "25 of its pods" in denied["status"]["message"]
    assert answer(client, owned("dry"), dry_run=True)["status"]["reason"] == "AdmissionStorm"


def test_container_failures_never_trip_it(live):
    cluster, informer, client = live
    for n in range(40):
        cluster.put("pods", container_failure(f"c{n}"))
    assert eventually(lambda: informer.events >= 40)
    assert answer(client, owned("next"))["allowed"]
    assert not informer.state.storm.breakers


def test_half_open_probe_doubled_cool_down_and_closing_on_running(live):
    cluster, informer, client = live
    for n in range(20):
        cluster.put("pods", rejected(f"r{n}"))
    assert eventually(lambda: not answer(client, owned("x"))["allowed"], timeout=5)
    time.sleep(1.1)  # the 1 s cool-down
    assert answer(client, owned("probe"))["allowed"]  # the probe
    assert answer(client, owned("other"))["status"]["reason"] == "AdmissionStorm"  # the others wait
    cluster.put("pods", rejected("probe"))  # the kubelet rejects the probe
    assert eventually(lambda: informer.state.storm.breakers["rs-uid"].cooldown == 2.0)
    assert answer(client, owned("again"))["status"]["reason"] == "AdmissionStorm"
    time.sleep(2.1)
    assert answer(client, owned("probe-2"))["allowed"]
    running = owned("probe-2", node_name="gpu-1")
    running["status"] = {"phase": "Running"}
    cluster.put("pods", running)
    assert eventually(lambda: informer.state.storm.breakers["rs-uid"].state == CLOSED)
    assert answer(client, owned("after"))["allowed"]


def test_open_breakers_trips_and_probes_are_exported(live):
    cluster, _, client = live
    for n in range(20):
        cluster.put("pods", rejected(f"r{n}"))
    assert eventually(lambda: not answer(client, owned("x"))["allowed"], timeout=5)
    text = client.get("/metrics").get_data(as_text=True)
    assert 'admit_guard_storm_breakers_open{namespace="ml",owner="ReplicaSet/trainer-7d9f"} 1.0' in text
    assert "admit_guard_storm_trips 1.0" in text


def test_serve_writes_breaker_transitions_to_stderr_at_its_log_level(capsys):
    import logging

    from webhook.serve.app import log_events_to_stderr

    handler = log_events_to_stderr("info")
    try:
        storm = StormBreakers(threshold=1, window=60, cooldown=10)
        storm.rejected(OWNER, "a", "OutOfcpu", "n1", 0)
        storm.probe_admitted("rs-uid", 11)
        assert log_events_to_stderr("info") is handler  # installing twice keeps one handler
        handler.flush()  # lines are written by a thread of their own
    finally:
        package = logging.getLogger("webhook")
        package.removeHandler(handler)
        package.propagate = True
        package.setLevel(logging.NOTSET)
    err = capsys.readouterr().err
    assert "[WARNING] webhook.state.storm: storm breaker open for ReplicaSet ml/trainer-7d9f" in err
    assert "[INFO] webhook.state.storm: storm breaker half-open" in err
