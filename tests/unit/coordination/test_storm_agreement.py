"""Storm breakers agree across workers and replicas: the probe slot and the cool-down live in
shared state (the replica's table, a Lease per open breaker), so exactly one probe passes per
half-open period cluster-wide, whichever worker a pod's CREATE reaches."""

from __future__ import annotations

import time

import pytest

from tests.helpers.storm import owned, rejected
from webhook.config import config_from_dict
from webhook.coordination.probes import shared_probes
from webhook.serve.app import create_app
from webhook.state import ClusterState
from webhook.state.source import FixedState
from webhook.state.storm import CLOSED, HALF_OPEN, StormBreakers

COOLDOWN = 10.0


def tripped() -> StormBreakers:
    """A worker's breakers after the informer saw the same two rejections every worker sees."""
    storm = StormBreakers(threshold=2, window=300, cooldown=COOLDOWN)
    for n in range(2):
        storm.observe(rejected(f"r{n}"), 1000.0)
    return storm


def workers(tmp_path, count: int, *, api=None, replicas: int = 1):
    """``count`` workers per replica: each its breakers and the replica's shared probe slots."""
    made = []
    for replica in range(replicas):
        for _ in range(count):
            probes = shared_probes(tmp_path / f"replica-{replica}", api, "admit-guard", 1.0, 1.0)
            made.append((tripped(), probes))
    return made


def test_two_workers_of_a_replica_admit_one_probe_between_them(tmp_path):
    (first, first_probes), (second, second_probes) = workers(tmp_path, 2)
    at = 1000.0 + COOLDOWN
    assert first_probes.claim(first, "rs-uid", at)
    assert not second_probes.claim(second, "rs-uid", at + 1)
    assert second.breakers["rs-uid"].state == HALF_OPEN  # it adopted the other worker's probe
    assert second.verdict("rs-uid", at + 2).deny and first.verdict("rs-uid", at + 2).deny


def test_a_rejected_probe_doubles_the_cool_down_on_the_worker_that_did_not_admit_it(tmp_path):
    (first, first_probes), (second, second_probes) = workers(tmp_path, 2)
    probe_at = 1000.0 + COOLDOWN
    assert first_probes.claim(first, "rs-uid", probe_at)
    rejected_at = probe_at + 1
    for storm in (first, second):  # every informer sees the probe rejected
        storm.observe(rejected("probe"), rejected_at)
    after_base = rejected_at + COOLDOWN  # the base cool-down: not enough after a failed probe
    assert not second_probes.claim(second, "rs-uid", after_base)
    assert second.breakers["rs-uid"].cooldown == 2 * COOLDOWN
    assert first.verdict("rs-uid", after_base).deny and second.verdict("rs-uid", after_base).deny
    after_doubled = rejected_at + 2 * COOLDOWN
    assert second_probes.claim(second, "rs-uid", after_doubled)
    assert not first_probes.claim(first, "rs-uid", after_doubled + 0.5)


def test_a_running_probe_closes_the_breaker_of_a_worker_that_did_not_admit_it(tmp_path):
    (first, first_probes), (second, second_probes) = workers(tmp_path, 2)
    probe_at = 1000.0 + COOLDOWN
    assert first_probes.claim(first, "rs-uid", probe_at)
    running = owned("probe")
    running["status"] = {"phase": "Running"}
    for storm in (first, second):
        storm.observe(running, probe_at + 2)
    assert first.breakers["rs-uid"].state == CLOSED
    assert second_probes.claim(second, "rs-uid", probe_at + 3)  # allowed: the storm is over
    assert second.breakers["rs-uid"].state == CLOSED


@pytest.fixture
def lease_api(leases):
    cluster, store = leases
    return cluster, store.api


def test_two_replicas_of_two_workers_admit_exactly_one_probe_through_the_lease(tmp_path, lease_api):
    cluster, api = lease_api
    everyone = workers(tmp_path, 2, api=api, replicas=2)
    at = 1000.0 + COOLDOWN
    admitted = [probes.claim(storm, "rs-uid", at + i * 0.01) for i, (storm, probes) in enumerate(everyone)]
    assert admitted.count(True) == 1, admitted
    assert [name for _, name in cluster.leases] == ["admit-guard-storm-rs-uid"]


def test_the_server_denies_a_second_probe_that_reaches_another_replica(tmp_path, lease_api):
    _, api = lease_api
    config = config_from_dict({"policies": {"stormBreaker": {"threshold": 2, "cooldownSeconds": COOLDOWN}}})
    clients = []
    for replica in range(2):
        probes = shared_probes(tmp_path / f"replica-{replica}", api, "admit-guard", 1.0, 1.0)
        storm = StormBreakers.from_config(config.storm_breaker)
        for n in range(2):
            storm.observe(rejected(f"r{n}"), time.time() - 2 * COOLDOWN)  # the cool-down is over
        app = create_app(config, FixedState(ClusterState(storm)), storm_probes=probes)
        clients.append(app.test_client())
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "namespace": "ml",
                    "operation": "CREATE", "object": owned("next")},
    }  # fmt: skip
    answers = [client.post("/validate", json=review).get_json()["response"] for client in clients * 2]
    assert [a["allowed"] for a in answers].count(True) == 1, answers
    assert {a["status"]["reason"] for a in answers if not a["allowed"]} == {"AdmissionStorm"}
