"""DRA live: the informer keeps the device index from resource.k8s.io/v1 lists and watches (and
DeviceTaintRules from resource.k8s.io/v1alpha3, where served), and two guard servers of two
workers each never hand the last GPU of a pool to two claims."""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from tests.helpers.app import answer
from tests.helpers.builders import node
from tests.helpers.claims import status_update
from tests.helpers.dra_builders import DRIVER, claim, gpus, resource_slice, result
from tests.helpers.fake_apiserver import Cluster, FakeApiServer
from tests.helpers.informer import eventually
from tests.helpers.live_server import live_server, post_json
from webhook.allocation import AllocationGuard
from webhook.config import config_from_dict
from webhook.coordination.allocations import IN_FLIGHT, pool_leases, pool_table
from webhook.serve.app import create_app
from webhook.state.apiserver import ApiServer
from webhook.state.informer import Informer, Timing, live_snapshot
from webhook.state.snapshot import load_snapshot
from webhook.state.source import FixedState

GPU = ("gpu.example.com", "node-1", "gpu-1")


def dra_cluster(claims: int = 0) -> Cluster:
    cluster = Cluster(bookmark_every=0.2, serves_dra=True)
    cluster.load("nodes", [node("node-1")])
    cluster.load("pods", [])
    cluster.load("resourceslices", [resource_slice(devices=gpus("gpu-0", "gpu-1"))])
    holder = claim("holder", namespace="ml", results=[result("gpu-0")])
    waiting = [claim(f"trainer-{i}", namespace="ml") for i in range(claims)]
    cluster.load("resourceclaims", [holder, *waiting])
    cluster.load("deviceclasses", [])
    return cluster


@pytest.fixture
def informer(tmp_path):
    cluster = dra_cluster(claims=1)
    server = FakeApiServer(cluster)
    api = ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))
    informer = Informer(api, Timing(page_size=50)).start()
    assert informer.wait_synced(10)
    yield cluster, informer
    informer.stop()
    server.close()


def test_the_informer_lists_slices_and_claims_into_the_device_index(informer):
    _, live = informer
    assert live.state.devices.use(("gpu.example.com", "node-1", "gpu-0"))
    assert live.state.devices.named("ml", "trainer-0") == ("uid-ml-trainer-0", None)


def test_a_claim_allocated_then_deleted_in_the_watch_holds_then_frees_its_device(informer):
    cluster, live = informer
    allocated = claim("trainer-0", namespace="ml", results=[result("gpu-1")])
    cluster.put("resourceclaims", allocated)
    assert eventually(lambda: bool(live.state.devices.use(GPU)))
    cluster.delete("resourceclaims", "uid-ml-trainer-0")
    assert eventually(lambda: not live.state.devices.use(GPU))
    assert live.state.devices.named("ml", "trainer-0") is None


def test_a_cluster_that_does_not_serve_dra_is_said_once_and_skipped(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="webhook.state.informer")
    cluster = Cluster(bookmark_every=0.2)
    cluster.load("nodes", [node("node-1")])
    cluster.load("pods", [])
    server = FakeApiServer(cluster)
    api = ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))
    informer = Informer(api, Timing(page_size=50)).start()
    try:
        assert informer.wait_synced(10)
        assert informer.state.devices is None
        said = [r.message for r in caplog.records if "resource.k8s.io/v1" in r.message]
        assert len(said) == 1 and "DRA checks skipped" in said[0]
    finally:
        informer.stop()
        server.close()


# -- DeviceTaintRules ------------------------------------------------------------------------------


def taint_rule(name: str = "drain-gpu-1", effect: str = "NoSchedule") -> dict:
    """A DeviceTaintRule as Kubernetes 1.35 serves it (``resource.k8s.io/v1alpha3``) for gpu-1."""
    return {
        "apiVersion": "resource.k8s.io/v1alpha3",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": "node-1", "device": "gpu-1"},
            "taint": {"key": "drain", "value": "maintenance", "effect": effect},
        },
    }


@contextmanager
def watching(cluster: Cluster, tmp_path):
    """A started, synced informer on a fake API server serving ``cluster``."""
    server = FakeApiServer(cluster)
    api = ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))
    informer = Informer(api, Timing(page_size=50)).start()
    try:
        assert informer.wait_synced(10)
        yield informer
    finally:
        informer.stop()
        server.close()


def verdict(source, directory, review: dict) -> dict:
    """The guard's answer to ``review`` with ``source`` as its state (a fresh allocation table)."""
    conf = config_from_dict({})
    guard = AllocationGuard(conf, pool_table(directory))
    return answer(create_app(conf, source, allocation_guard=guard).test_client(), copy.deepcopy(review))


@pytest.mark.parametrize("effect", ["NoSchedule", "NoExecute"])
def test_a_device_taint_rule_in_the_cluster_denies_as_the_same_rule_in_a_snapshot(tmp_path, effect):
    import yaml

    cluster = dra_cluster(claims=1)
    cluster.serves_taint_rules = True
    cluster.load("devicetaintrules", [taint_rule(effect=effect)])
    review = status_update(claim("trainer-0", namespace="ml", results=[result("gpu-1")]))
    docs = [*cluster.truth("nodes"), *cluster.truth("resourceslices"), *cluster.truth("resourceclaims")]
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump_all([*docs, taint_rule(effect=effect)]))
    snapshot = load_snapshot([str(tmp_path / "cluster.yaml")])
    from_snapshot = verdict(FixedState(snapshot), tmp_path / "s", review)
    with watching(cluster, tmp_path) as live:
        assert [(t.key, t.effect) for t in live.state.devices.taints(GPU)] == [("drain", effect)]
        from_live = verdict(live, tmp_path / "l", review)
    assert from_live["allowed"] is False
    assert from_live["status"]["reason"] == "DeviceTaintNotTolerated"
    assert from_live == from_snapshot


def test_a_device_taint_rule_added_then_deleted_in_the_watch_taints_then_frees_its_device(tmp_path):
    cluster = dra_cluster()
    cluster.serves_taint_rules = True
    cluster.load("devicetaintrules", [])
    with watching(cluster, tmp_path) as live:
        assert live.state.devices.taints(GPU) == ()
        cluster.put("devicetaintrules", taint_rule())
        assert eventually(lambda: len(live.state.devices.taints(GPU)) == 1)
        cluster.delete("devicetaintrules", "drain-gpu-1")
        assert eventually(lambda: live.state.devices.taints(GPU) == ())


def test_a_cluster_without_device_taint_rules_is_ready_said_once_and_checks_the_rest(tmp_path, caplog):
    """Alpha in 1.35: most clusters answer 404. Readiness does not wait for it, nor retry."""
    caplog.set_level(logging.INFO, logger="webhook.state.informer")
    cluster = dra_cluster()
    with watching(cluster, tmp_path) as live:
        assert live.readiness().ready
        assert live.state.devices.use(("gpu.example.com", "node-1", "gpu-0"))
        time.sleep(0.3)
        assert cluster.requests.count("devicetaintrules list") == 1  # the 404: asked once, not retried
    said = [r.message for r in caplog.records if "devicetaintrules" in r.message]
    assert len(said) == 1 and "does not serve" in said[0]
    server = FakeApiServer(cluster)
    try:
        api = ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "again"))
        assert live_snapshot(api).devices is not None  # the one-off list of `check --kubeconfig` too
    finally:
        server.close()


def test_device_taint_rules_no_longer_served_are_dropped_and_the_guard_stays_ready(tmp_path):
    cluster = dra_cluster()
    cluster.serves_taint_rules = True
    cluster.load("devicetaintrules", [taint_rule()])
    with watching(cluster, tmp_path) as live:
        assert live.state.devices.taints(GPU)
        cluster.serves_taint_rules = False  # the API server restarted without the alpha API
        cluster.end_watches()
        assert eventually(lambda: live.state.devices.taints(GPU) == ())
        assert live.readiness().ready and live.synced


def test_twelve_concurrent_allocations_of_the_last_gpu_over_two_guards_allow_exactly_one(tmp_path):
    cluster = dra_cluster(claims=12)
    server = FakeApiServer(cluster)
    kubeconfig = server.kubeconfig(tmp_path / "kubeconfig")
    config = tmp_path / "config.yaml"
    config.write_text(
        "policies: {nodeAdmission: {reservations: {namespace: admit-guard, waitSeconds: 10}}}\n"
    )
    args = ("--kubeconfig", kubeconfig, "--config", str(config))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    try:
        with live_server(tmp_path / "a", *args) as first, live_server(tmp_path / "b", *args) as second:
            guards = [first, second]
            start = threading.Barrier(12)

            def allocate(i: int) -> dict:
                conn = guards[i % 2].connect()
                stored = json.loads(cluster.objects["resourceclaims"][f"uid-ml-trainer-{i}"])
                version = stored["metadata"]["resourceVersion"]
                review = status_update(
                    claim(f"trainer-{i}", namespace="ml", results=[result("gpu-1")]), version=version
                )
                start.wait()
                try:
                    return post_json(conn, "/validate", review)[1]["response"]
                finally:
                    conn.close()

            with ThreadPoolExecutor(12) as pool:
                responses = list(pool.map(allocate, range(12)))
    finally:
        server.close()
    allowed = [r for r in responses if r["allowed"]]
    assert len(allowed) == 1, json.dumps(responses, indent=1)
    assert "warnings" not in allowed[0]
    assert {r["status"]["reason"] for r in responses if not r["allowed"]} == {"DeviceAlreadyAllocated"}
    [(namespace, lease)] = cluster.leases  # one Lease for the pool, in the guard's namespace
    assert namespace == "admit-guard" and lease.startswith("admit-guard-pool-gpu.example.com-node-1-")


def test_the_api_server_down_answers_an_allocation_within_three_seconds_allowed_with_a_warning(tmp_path):
    from tests.helpers.claims import one_gpu_left
    from webhook.allocation import AllocationGuard
    from webhook.config import config_from_dict
    from webhook.serve.app import create_app
    from webhook.state.source import FixedState

    server = FakeApiServer(Cluster())
    api = ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))
    server.close()  # nothing listens any more
    table, leases = pool_table(tmp_path / "t"), pool_leases(api, "admit-guard")
    assert table.codec is IN_FLIGHT
    conf = config_from_dict({})
    client = create_app(
        conf, FixedState(one_gpu_left()), allocation_guard=AllocationGuard(conf, table, leases)
    ).test_client()
    started = time.monotonic()
    review = status_update(claim("a", namespace="ml", results=[result("gpu-1")]))
    response = client.post("/validate", json=copy.deepcopy(review)).get_json()["response"]
    assert time.monotonic() - started < 3
    assert response["allowed"] is True and "did not check this allocation" in response["warnings"][0]


def test_kube_schedulers_write_order_with_a_late_watch_never_hands_one_gpu_to_two_claims(tmp_path):
    """``bindClaim`` (pkg/scheduler/framework/plugins/dynamicresources) adds the delete-protection
    finalizer with an Update, then writes the allocation with UpdateStatus: the allocation's
    oldObject is newer than what the guards' watches show while their events are 0.5 s late.
    Claim B, written on the other replica for the same GPU, must still meet A's record."""
    cluster = dra_cluster(claims=2)
    cluster.watch_lag = 0.5
    server = FakeApiServer(cluster)
    kubeconfig = server.kubeconfig(tmp_path / "kubeconfig")
    config = tmp_path / "config.yaml"
    config.write_text("policies: {nodeAdmission: {reservations: {namespace: admit-guard}}}\n")
    args = ("--kubeconfig", kubeconfig, "--config", str(config))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    try:
        with live_server(tmp_path / "a", *args) as first, live_server(tmp_path / "b", *args) as second:
            responses = []
            for i, guard in enumerate((first, second)):
                stored = json.loads(cluster.objects["resourceclaims"][f"uid-ml-trainer-{i}"])
                stored["metadata"]["finalizers"] = ["resource.kubernetes.io/delete-protection"]
                cluster.put("resourceclaims", stored)  # the Update; the watch shows it 0.5 s later
                version = json.loads(cluster.objects["resourceclaims"][stored["metadata"]["uid"]])[
                    "metadata"
                ]["resourceVersion"]
                review = status_update(
                    claim(f"trainer-{i}", namespace="ml", results=[result("gpu-1")]), version=version
                )
                conn = guard.connect()
                try:
                    responses.append(post_json(conn, "/validate", review)[1]["response"])
                finally:
                    conn.close()
    finally:
        server.close()
    assert responses[0]["allowed"] is True, responses[0]
    assert responses[1]["allowed"] is False, responses[1]
    assert responses[1]["status"]["reason"] == "DeviceAlreadyAllocated"
