"""The audit inside the server: node findings from the state it already holds, as gauges; and
the operating signals the alerts read (readiness, unchecked decisions)."""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager

from tests.helpers.audit_gauges import ScrapedGauges
from tests.helpers.builders import node, pod
from tests.helpers.live_server import metric_sum
from tests.helpers.paths import EXAMPLES
from webhook.config import Config, config_from_dict
from webhook.serve.app import create_app
from webhook.serve.metrics import Metrics
from webhook.serve.periodic_audit import PeriodicAudit
from webhook.state.model import ClusterState, node_from, object_key, pod_record
from webhook.state.source import FixedState, Readiness, StateView


def gpu_state() -> ClusterState:
    state = ClusterState()
    state.set_node(node_from(node("gpu-1", extra={"nvidia.com/gpu": "4"})))
    for name, scheduler in (("a", None), ("b", "volcano")):
        p = pod(name, node_name="gpu-1", requests={"nvidia.com/gpu": "1"}, scheduler=scheduler)
        state.set_pod(object_key(p), pod_record(p))
    return state


def findings_gauge(metrics: ScrapedGauges, **labels) -> float:
    return metric_sum(metrics.scrape(), "admit_guard_audit_findings", **labels)


def test_the_periodic_audit_publishes_node_findings_and_zeroes_resolved_ones():
    state, metrics = gpu_state(), ScrapedGauges()
    periodic = PeriodicAudit(FixedState(state), Config(), metrics, 60)
    [finding] = periodic.run_once()
    assert (finding.type, finding.name) == ("MixedDeviceScheduler", "gpu-1")
    assert findings_gauge(metrics, type="MixedDeviceScheduler", namespace="") == 1
    state.remove_pod("uid-b")
    assert periodic.run_once() == []
    text = metrics.scrape()
    assert 'admit_guard_audit_findings{namespace="",type="MixedDeviceScheduler"} 0.0' in text
    assert metric_sum(text, "admit_guard_audit_last_run_timestamp_seconds", source="snapshot") > 0


class UnreadPods(dict):
    """A node's pods whose records the test forbids reading (their keys may be looked up)."""

    def _read(self, *args):
        raise AssertionError("the audit read the records of the node's pods")

    values = items = __iter__ = _read


def test_the_periodic_audit_counts_device_holders_without_reading_the_pods_records():
    """The master audits the state its workers share copy-on-write: reading every pod's record
    there (a reference count bumped) copied the whole state into every worker. Who holds a
    device comes from the state's counts per scheduler."""
    state = gpu_state()
    usage = state.usage("gpu-1")
    usage.pods = UnreadPods(usage.pods)
    [finding] = PeriodicAudit(FixedState(state), Config(), ScrapedGauges(), 60).run_once()
    assert finding.type == "MixedDeviceScheduler"
    assert "held by default-scheduler (1 pod), volcano (1 pod); 2 of 4 allocated" in finding.message


class ReadersOnFile(FixedState):
    """A state source that writes down, in a file, the pid of each process that reads it."""

    def __init__(self, state: ClusterState, path) -> None:
        super().__init__(state)
        self.path = path

    @contextmanager
    def reading(self):
        with open(self.path, "a") as readers:
            readers.write(f"{os.getpid()}\n")
        yield StateView(self.state)


def test_each_pass_of_the_replicas_audit_reads_the_state_in_a_process_forked_for_it(tmp_path):
    """The master's audit reads every record: done there, the reference counts it bumps would
    copy the pages the workers share. A child forked for the pass copies them, and frees them
    when it exits; the master publishes what it found."""
    readers, metrics = tmp_path / "readers", ScrapedGauges()
    audit = PeriodicAudit(ReadersOnFile(gpu_state(), readers), Config(), metrics, 60, in_child=True)
    found = audit.run_once()
    assert [(f.type, f.namespace) for f in found] == [("MixedDeviceScheduler", "")]
    pids = set(readers.read_text().split())
    assert pids and str(os.getpid()) not in pids
    assert findings_gauge(metrics, type="MixedDeviceScheduler", namespace="") == 1


def gpu_nodes(count: int) -> ClusterState:
    """``count`` nodes, each with a GPU held by pods of two schedulers: a finding per node."""
    state = ClusterState()
    for n in range(count):
        state.set_node(node_from(node(f"gpu-{n}", extra={"nvidia.com/gpu": "4"})))
        for name, scheduler in (("a", None), ("b", "volcano")):
            p = pod(
                f"{name}-{n}", node_name=f"gpu-{n}", requests={"nvidia.com/gpu": "1"}, scheduler=scheduler
            )
            state.set_pod(object_key(p), pod_record(p))
    return state


def test_the_replicas_audit_judges_the_nodes_a_group_at_a_time_each_in_a_process_of_its_own(
    tmp_path, monkeypatch
):
    """What a child copies grows with the nodes it judges (their objects lie scattered over the
    heap): the replica's peak is one group's copy, not the whole cluster's."""
    monkeypatch.setattr("webhook.serve.periodic_audit.KEYS_PER_CHILD", 2)
    readers, metrics = tmp_path / "readers", ScrapedGauges()
    found = PeriodicAudit(
        ReadersOnFile(gpu_nodes(5), readers), Config(), metrics, 60, in_child=True
    ).run_once()
    assert sorted(f.name for f in found) == [f"gpu-{n}" for n in range(5)]
    assert findings_gauge(metrics, type="MixedDeviceScheduler", namespace="") == 5
    pids = readers.read_text().split()
    assert str(os.getpid()) not in pids
    assert len(set(pids)) == 1 + 3  # the child that lists the nodes, then groups of 2 + 2 + 1


def test_a_group_that_fails_in_its_process_fails_the_pass_and_leaves_the_gauges(monkeypatch, caplog):
    from webhook import audit

    def judged(state, config, names):
        if "gpu-3" in names:
            raise RuntimeError("node gpu-3 broke the audit")
        return node_findings(state, config, names)

    node_findings = audit.node_findings
    monkeypatch.setattr("webhook.serve.periodic_audit.KEYS_PER_CHILD", 2)
    monkeypatch.setattr(audit, "node_findings", judged)
    metrics = ScrapedGauges()
    assert PeriodicAudit(FixedState(gpu_nodes(5)), Config(), metrics, 60, in_child=True).run_once() is None
    assert "node gpu-3 broke the audit" in caplog.text
    assert "admit_guard_audit_findings{" not in metrics.scrape()


def test_a_pass_that_fails_in_its_process_is_logged_and_leaves_the_gauges(caplog):
    class Broken(FixedState):
        @contextmanager
        def reading(self):
            raise RuntimeError("the state is broken")
            yield

    metrics = ScrapedGauges()
    assert PeriodicAudit(Broken(None), Config(), metrics, 60, in_child=True).run_once() is None
    assert "the state is broken" in caplog.text
    assert "admit_guard_audit_findings{" not in metrics.scrape()


def test_the_periodic_audit_counts_storms_in_progress_by_namespace_and_zeroes_ended_ones():
    from webhook.kube.rejection import Owner
    from webhook.state.storm import StormBreakers

    state, metrics = ClusterState(StormBreakers(threshold=2, window=60, cooldown=10)), ScrapedGauges()
    owner = Owner("rs-1", "ReplicaSet", "trainer-7d9f", "ml")
    for n in range(2):
        state.storm.rejected(owner, f"p{n}", "OutOfcpu", "n1", 100 + n)
    periodic = PeriodicAudit(FixedState(state), Config(), metrics, 60)
    periodic.run_once()
    assert findings_gauge(metrics, type="AdmissionStorm", namespace="ml") == 1
    state.storm.probe_admitted("rs-1", 120)
    state.storm.running("rs-1", 121)
    periodic.run_once()
    assert findings_gauge(metrics, type="AdmissionStorm", namespace="ml") == 0


def test_the_periodic_audit_reads_the_state_one_chunk_of_nodes_at_a_time(monkeypatch):
    monkeypatch.setattr("webhook.audit.NODES_PER_CHUNK", 2)
    state = ClusterState()
    for i in range(5):
        state.set_node(node_from(node(f"n{i}")))

    class CountingSource(FixedState):
        reads = 0

        @contextmanager
        def reading(self):
            CountingSource.reads += 1
            yield StateView(self.state)

    PeriodicAudit(CountingSource(state), Config(), ScrapedGauges(), 60).run_once()
    assert CountingSource.reads == 1 + 3  # the node list, then 2 + 2 + 1 nodes (the last with the findings)


def test_without_usable_state_the_audit_leaves_the_gauges_alone():
    class Unavailable(FixedState):
        @contextmanager
        def reading(self):
            yield StateView(None, "not synced")

    metrics = ScrapedGauges()
    assert PeriodicAudit(Unavailable(None), Config(), metrics, 60).run_once() is None
    assert "admit_guard_audit_findings{" not in metrics.scrape()


def test_readiness_and_fail_open_decisions_are_exported():
    metrics = Metrics()
    metrics.observe_state(Readiness(False, "listing"), "informer")
    assert metric_sum(metrics.scrape().decode(), "admit_guard_state_ready", source="informer") == 0
    client = create_app(config_from_dict({}), FixedState(None)).test_client()
    review = json.loads((EXAMPLES / "admission" / "good-deployment.json").read_text())
    review["request"]["object"]["spec"]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "lots"}
    }
    assert client.post("/validate", json=review).get_json()["response"]["allowed"] is True
    text = client.get("/metrics").get_data(as_text=True)
    assert metric_sum(text, "admit_guard_unchecked_decisions_total", answer="fail-open") == 1
    assert metric_sum(text, "admit_guard_state_ready") == 1


def test_the_periodic_audit_makes_no_api_request_of_its_own(tmp_path):
    from tests.helpers.fake_apiserver import Cluster, FakeApiServer
    from webhook.state.apiserver import ApiServer
    from webhook.state.informer import Informer

    cluster = Cluster()
    cluster.load("nodes", [node("gpu-1", extra={"nvidia.com/gpu": "4"})])
    cluster.load(
        "pods",
        [
            pod(n, node_name="gpu-1", requests={"nvidia.com/gpu": "1"}, scheduler=s)
            for n, s in (("a", None), ("b", "volcano"))
        ],
    )
    server = FakeApiServer(cluster)
    informer = Informer(ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))).start()
    try:
        assert informer.wait_synced(10)
        deadline = time.monotonic() + 10
        while len(cluster.requests) < 4 and time.monotonic() < deadline:  # both lists and both watches
            time.sleep(0.01)
        before = list(cluster.requests)
        periodic = PeriodicAudit(informer, Config(), ScrapedGauges(), 60, "informer")
        for _ in range(3):
            [finding] = periodic.run_once()
            assert finding.type == "MixedDeviceScheduler"
        assert cluster.requests == before
    finally:
        informer.stop()
        server.close()
