"""The real server: gunicorn with TLS on loopback, spoken to over HTTPS with CA verification."""

from __future__ import annotations

import base64
import fcntl
import json
import os
import signal
import socket
import ssl
import time
from concurrent.futures import ThreadPoolExecutor

import jsonpatch
import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from tests.helpers.builders import node, pod
from tests.helpers.fake_apiserver import Cluster, FakeApiServer
from tests.helpers.live_server import (
    connections_by_worker,
    listening,
    live_server,
    metric_sum,
    post_json,
    wait_listening,
    worker_pids,
)
from tests.helpers.paths import EXAMPLES
from webhook.certs import issue
from webhook.coordination.names import table_file_name

CONFIG = """
excludedNamespaces: [kube-system, ops]
policies:
  pinnedNodeName: {mode: fix}
  deviceScheduler: {mode: warn}
  nodeAdmission: {mode: enforce}
"""


def example(name: str) -> dict:
    return json.loads((EXAMPLES / "admission" / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("serve")
    (workdir / "config.yaml").write_text(CONFIG)
    with live_server(
        workdir, "--cluster", str(EXAMPLES / "cluster"), "--config", str(workdir / "config.yaml")
    ) as s:
        yield s


def review(server, endpoint: str, body) -> dict:
    conn = server.connect()
    try:
        status, reply = post_json(conn, f"/{endpoint}", body)
    finally:
        conn.close()
    assert status == 200, reply
    return reply["response"]


def test_allows_a_good_deployment(server):
    assert review(server, "validate", example("good-deployment"))["allowed"] is True


def test_denies_a_pod_the_kubelet_would_reject(server):
    response = review(server, "validate", example("pod-host-port-conflict"))
    assert response["allowed"] is False
    assert response["status"] == {
        "code": 403,
        "reason": "NodePorts",
        "message": response["status"]["message"],
    }


def test_warn_mode_answers_with_warnings(server):
    response = review(server, "validate", example("incident-2-mixed-scheduler-job"))
    assert response["allowed"] is True
    assert any("MixedDeviceScheduler" in w for w in response["warnings"])


def test_mutate_patch_applies_and_the_result_passes_validation(server):
    incident = example("incident-1-pinned-deployment")
    response = review(server, "mutate", incident)
    patched = jsonpatch.apply_patch(
        incident["request"]["object"], json.loads(base64.b64decode(response["patch"]))
    )
    assert "nodeName" not in patched["spec"]["template"]["spec"]
    incident["request"]["object"] = patched
    assert review(server, "validate", incident)["allowed"] is True


def test_dry_run_is_answered_but_not_counted(server):
    dry = example("pod-host-port-conflict")
    dry["request"]["dryRun"] = True
    before = _metric(server, "admit_guard_violations_total", reason="NodePorts")
    assert review(server, "validate", dry)["allowed"] is False
    assert _metric(server, "admit_guard_violations_total", reason="NodePorts") == before


def test_excluded_namespace_is_allowed_untouched(server):
    pinned = example("pod-host-port-conflict")
    pinned["request"]["namespace"] = pinned["request"]["object"]["metadata"]["namespace"] = "ops"
    assert review(server, "validate", pinned) == {"uid": pinned["request"]["uid"], "allowed": True}


def test_bad_bodies_get_400_and_oversized_ones_413(server):
    conn = server.connect()
    status, reply = post_json(conn, "/validate", b"{not json")
    assert status == 400 and "not JSON" in reply["error"]
    status, reply = post_json(
        conn, "/validate", {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}
    )
    assert status == 400 and "request" in reply["error"]
    conn.close()
    conn = server.connect()
    status, reply = post_json(conn, "/validate", b" " * (3 * 1024 * 1024 + 1))
    assert status == 413
    conn.close()


def test_keep_alive_serves_many_reviews_on_one_connection(server):
    conn = server.connect()
    for _ in range(20):
        status, reply = post_json(conn, "/validate", example("good-deployment"))
        assert status == 200 and reply["response"]["allowed"]
    conn.close()


def test_tls_1_2_is_accepted(server):
    context = server.tls_context()
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    conn = server.connect()
    conn._context = context
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200
    assert conn.sock.version() == "TLSv1.2"
    conn.close()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_tls_below_1_2_is_refused_by_the_server(server):
    context = server.tls_context()
    context.minimum_version = context.maximum_version = ssl.TLSVersion.TLSv1_1
    context.set_ciphers("ALL:@SECLEVEL=0")
    conn = server.connect()
    conn._context = context  # same endpoint, old protocol
    with pytest.raises(ssl.SSLError):
        conn.request("GET", "/healthz")
        conn.getresponse()
    deadline = time.monotonic() + 5
    while "UNSUPPORTED_PROTOCOL" not in server.log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "UNSUPPORTED_PROTOCOL" in server.log.read_text()


def test_metrics_add_up_across_workers(server):
    before = _metric(server, "admit_guard_requests_total", endpoint="validate", kind="Pod")
    # Separate connections spread over both workers.
    for _ in range(12):
        review(server, "validate", example("good-pod-pinned-with-room"))
    assert _metric(server, "admit_guard_requests_total", endpoint="validate", kind="Pod") == before + 12


def test_rotated_certificate_reaches_new_connections_without_dropping_open_ones(tmp_path):
    with live_server(tmp_path, "--cluster", str(EXAMPLES / "cluster")) as server:
        old_ca = (server.cert_dir / "ca.crt").read_bytes()
        kept = server.connect()
        assert post_json(kept, "/validate", example("good-deployment"))[0] == 200
        issue("admit-guard", "admit-guard", server.cert_dir)  # a new CA and serving certificate
        # The open connection keeps working on the old certificate.
        assert post_json(kept, "/validate", example("good-deployment"))[0] == 200
        kept.close()
        # New connections get the new one: verified by the new CA, refused by the old.
        fresh = server.connect()
        fresh.request("GET", "/healthz")
        assert fresh.getresponse().status == 200
        served = x509.load_der_x509_certificate(fresh.sock.getpeercert(binary_form=True))
        assert served.public_bytes(Encoding.PEM) == (server.cert_dir / "tls.crt").read_bytes()
        fresh.close()
        stale = server.connect()
        stale._context = ssl.create_default_context(cadata=old_ca.decode())
        with pytest.raises(ssl.SSLCertVerificationError):
            stale.request("GET", "/healthz")


def _metric(server, name: str, **labels: str) -> float:
    conn = server.connect()
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    return metric_sum(text, name, **labels)


def test_a_graceful_shutdown_writes_every_decision_line(tmp_path):
    with live_server(tmp_path, "--cluster", str(EXAMPLES / "cluster")) as s:
        conn = s.connect()
        for _ in range(200):
            status, _reply = post_json(conn, "/validate", example("incident-1-pinned-deployment"))
            assert status == 200
        conn.close()
    decisions = [
        line for line in s.log.read_text().splitlines() if line.startswith("{") and '"decision"' in line
    ]
    assert len(decisions) == 200


def test_a_burst_of_connections_is_spread_over_the_workers(server):
    """16 connections opened together, as the API server opens its pool: each worker takes a
    share (one worker taking them all halves the replica's capacity while the other idles)."""
    raw = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(16)]
    context = server.tls_context()
    conns = []
    try:
        for sock in raw:
            conn = server.connect()
            conn.sock = context.wrap_socket(sock, server_hostname="localhost")
            status, _ = post_json(conn, "/validate", example("good-pod-pinned-with-room"))
            assert status == 200
            conns.append(conn)
        ports = {conn.sock.getsockname()[1] for conn in conns}
        held = {
            pid: ports & clients
            for pid, clients in connections_by_worker(server.process.pid, server.port).items()
        }
        assert sorted(len(p) for p in held.values()) != [0, 16], held
        assert sum(len(p) for p in held.values()) == 16
        assert all(held.values()), {pid: len(p) for pid, p in held.items()}
    finally:
        for conn in conns:
            conn.close()
        for sock in raw:
            sock.close()


def test_a_restarting_worker_loses_no_new_connection(tmp_path):
    """A worker told to stop leaves the port's listeners at once: connections opened while it
    stops and while its replacement boots are all answered, by the other worker or the new one."""
    with live_server(tmp_path, "--cluster", str(EXAMPLES / "cluster")) as server:
        stopping = worker_pids(server.process.pid)[0]
        os.kill(stopping, signal.SIGTERM)
        deadline = time.monotonic() + 3
        answered = 0
        while time.monotonic() < deadline:
            answered += review(server, "validate", example("good-pod-pinned-with-room"))["allowed"]
        assert answered > 10
        assert stopping not in worker_pids(server.process.pid)
        wait_listening(server.port, 2)  # its replacement listens
        for _ in range(8):
            assert review(server, "validate", example("good-pod-pinned-with-room"))["allowed"]


def _pinned_pod_create(i: int, node_name: str = "node-1") -> dict:
    """A Pod CREATE with ``spec.nodeName`` (so the node's state decides it) asking 1m of CPU."""
    obj = pod(f"pinned-{i}", node_name=node_name, requests={"cpu": "1m"})
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": f"uid-{i}", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "namespace": "default", "operation": "CREATE", "object": obj},
    }  # fmt: skip


@pytest.fixture
def api_server():
    cluster = Cluster(bookmark_every=0.2)
    cluster.load("nodes", [node("node-1", pods="100000")])
    server = FakeApiServer(cluster)
    yield cluster, server
    server.close()


def test_a_restarted_worker_takes_no_connection_before_its_state_is_synced(api_server, tmp_path):
    """A worker that crashed is replaced by one forked from the replica's state: it lists
    nothing (every list is slow from now on), and no review is answered from a state that is
    not there (a fail-open warning, or a node said not to exist)."""
    cluster, apiserver = api_server
    kubeconfig = apiserver.kubeconfig(tmp_path / "kubeconfig")
    with live_server(tmp_path, "--kubeconfig", kubeconfig) as server:
        assert cluster.lists == {"nodes": 1, "pods": 1}  # the replica's, none per worker
        cluster.list_delay = 3.0  # from now on, every list is slow
        crashed = worker_pids(server.process.pid)[0]
        os.kill(crashed, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while len(set(worker_pids(server.process.pid)) - {crashed}) < 2:
            assert time.monotonic() < deadline, "gunicorn did not replace the crashed worker"
            time.sleep(0.02)
        replacement = max(set(worker_pids(server.process.pid)) - {crashed})
        answers = []
        syncing_until = time.monotonic() + 2.5
        while time.monotonic() < syncing_until:
            answers.append(review(server, "validate", _pinned_pod_create(len(answers))))
        unchecked = [a for a in answers if not a["allowed"] or "warnings" in a]
        assert not unchecked, unchecked[0]
        assert len(answers) > 10
        wait_listening(server.port, 2, timeout=15)
        assert replacement in worker_pids(server.process.pid)
        assert cluster.lists == {"nodes": 1, "pods": 1}


def test_workers_forked_from_the_replica_state_see_what_changed_after_the_fork(api_server, tmp_path):
    """A worker starts from the state the master listed and watches on from its
    resourceVersion: a pod bound after the fork counts on its node in every worker."""
    cluster, apiserver = api_server
    cluster.put("nodes", node("node-2", cpu="4", pods="110"))
    kubeconfig = apiserver.kubeconfig(tmp_path / "kubeconfig")
    with live_server(tmp_path, "--kubeconfig", kubeconfig) as server:
        hog = pod("hog", node_name="node-2", requests={"cpu": "4"}, uid="uid-hog", phase="Running")
        cluster.put("pods", hog)
        time.sleep(1.0)
        answers = [review(server, "validate", _pinned_pod_create(n, "node-2")) for n in range(20)]
        assert all(not a["allowed"] and "OutOfcpu" in a["status"]["message"] for a in answers)
        assert cluster.lists == {"nodes": 1, "pods": 1}


def test_with_no_worker_ready_one_listens_so_the_replica_still_answers(api_server, tmp_path):
    """While the replica lists the cluster (starting, a slow API server), one of its workers
    listens: the liveness probe and the reviews answered per failOpen still reach the replica.
    Once the list is in, the workers forked before it are forked again from its state."""
    cluster, apiserver = api_server
    cluster.list_delay = 5.0
    kubeconfig = apiserver.kubeconfig(tmp_path / "kubeconfig")
    with live_server(tmp_path, "--kubeconfig", kubeconfig, ready=False) as server:
        assert listening(server.port) == 1
        early_workers = set(worker_pids(server.process.pid))
        conn = server.connect()
        conn.request("GET", "/readyz")
        assert conn.getresponse().status == 503
        conn.close()
        early = review(server, "validate", _pinned_pod_create(0))
        assert early["allowed"] and "ClusterStateUnavailable" in early["warnings"][0]
        deadline = time.monotonic() + 20
        while early_workers & set(worker_pids(server.process.pid)):
            assert time.monotonic() < deadline, "the workers forked before the list were not renewed"
            time.sleep(0.05)
        wait_listening(server.port, 2, timeout=15)
        late = [review(server, "validate", _pinned_pod_create(n)) for n in range(1, 21)]
        assert all(answer["allowed"] and "warnings" not in answer for answer in late)


def _audit_samples_by_process(metrics_dir) -> dict[int, dict[tuple[str, str], float]]:
    """The audit gauges each process wrote (``{pid: {(metric, type): value}}``), from the metric
    files of the multi-process mode; a process that only inherited a gauge writes it unset."""
    from prometheus_client.mmap_dict import MmapedDict

    written: dict[int, dict[tuple[str, str], float]] = {}
    for path in metrics_dir.glob("gauge_*.db"):
        pid = int(path.stem.rsplit("_", 1)[1])
        for key, value, timestamp, _ in MmapedDict.read_all_values_from_file(str(path)):
            name, _, labels, _ = json.loads(key)
            if name.startswith("admit_guard_audit_") and (value or timestamp):
                written.setdefault(pid, {})[name, labels.get("type", "")] = value
    return written


def test_the_replica_audits_once_in_the_master_and_every_worker_exports_it(tmp_path):
    """``--audit-interval``: the master audits the state its workers are forked from, once per
    replica. An audit in each worker read every record and so copied the whole state into
    every worker; every worker's /metrics still shows the master's findings."""
    cluster = Cluster(bookmark_every=0.2)
    cluster.load("nodes", [node("node-1", cpu="1")])
    cluster.load(
        "pods",
        [
            pod(f"p{i}", node_name="node-1", requests={"cpu": "1"}, uid=f"u{i}", phase="Running")
            for i in range(2)
        ],
    )
    apiserver = FakeApiServer(cluster)
    metrics_dir = tmp_path / "metrics"
    try:
        kubeconfig = apiserver.kubeconfig(tmp_path / "kubeconfig")
        args = ("--kubeconfig", kubeconfig, "--audit-interval", "1")
        with live_server(tmp_path, *args, metrics_dir=metrics_dir) as server:
            deadline = time.monotonic() + 15
            while _metric(server, "admit_guard_audit_findings", type="Overcommitted") != 1:
                assert time.monotonic() < deadline, "no audit finding on /metrics"
                time.sleep(0.1)
            workers = worker_pids(server.process.pid)
            time.sleep(2.5)  # two more audit passes
            written = _audit_samples_by_process(metrics_dir)
            assert set(written) == {server.process.pid}, written
            assert written[server.process.pid]["admit_guard_audit_findings", "Overcommitted"] == 1
            for _ in range(2 * len(workers)):  # new connections: each worker answers some
                assert _metric(server, "admit_guard_audit_findings", type="Overcommitted") == 1
            cluster.delete("pods", "u1")
            deadline = time.monotonic() + 15
            while _metric(server, "admit_guard_audit_findings", type="Overcommitted") != 0:
                assert time.monotonic() < deadline, "a resolved finding still counted"
                time.sleep(0.1)
    finally:
        apiserver.close()


def test_a_snapshot_replica_audits_once_in_the_master_too(tmp_path):
    metrics_dir = tmp_path / "metrics"
    args = ("--cluster", str(EXAMPLES / "cluster"), "--audit-interval", "1")
    with live_server(tmp_path, *args, metrics_dir=metrics_dir) as server:
        deadline = time.monotonic() + 15
        while _metric(server, "admit_guard_audit_findings", type="MixedDeviceScheduler") != 1:
            assert time.monotonic() < deadline, "no audit finding on /metrics"
            time.sleep(0.1)
        assert set(_audit_samples_by_process(metrics_dir)) == {server.process.pid}
        assert _metric(server, "admit_guard_audit_last_run_timestamp_seconds", source="snapshot") > 0


def test_a_review_waiting_for_its_node_table_leaves_the_workers_loop_answering(tmp_path, monkeypatch):
    """The loop answers admission reviews itself, without a pool thread, unless the decision
    would wait: one whose node's reservation table another process holds goes to a thread,
    which waits for it, while the loop answers the other connections; it is then decided
    whole, and every review is counted once."""
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("TMPDIR", str(shared))  # where the replica keeps its reservation tables
    with live_server(tmp_path, "--cluster", str(EXAMPLES / "cluster"), workers=1) as server:
        assert review(server, "validate", example("good-pod-pinned-with-room"))["allowed"]  # cpu-2's table
        [tables] = shared.glob("admit-guard-reservations-*")
        sibling = os.open(tables / table_file_name("cpu-2"), os.O_RDWR)
        second = example("good-pod-pinned-with-room")
        second["request"]["uid"] = second["request"]["object"]["metadata"]["uid"] = "second"
        second["request"]["name"] = second["request"]["object"]["metadata"]["name"] = "disk-check-2"
        try:
            fcntl.flock(sibling, fcntl.LOCK_EX)
            with ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(review, server, "validate", second)
                time.sleep(0.3)
                assert not waiting.done()
                elsewhere = review(server, "validate", _pinned_pod_create(1, "cpu-1"))
                health = server.connect()
                health.request("GET", "/healthz")
                assert health.getresponse().status == 200
                assert not waiting.done(), "the loop waited for the lock"
                fcntl.flock(sibling, fcntl.LOCK_UN)
                assert waiting.result(10)["allowed"]
        finally:
            os.close(sibling)
        assert "uid" in elsewhere
        assert _metric(server, "admit_guard_requests_total", endpoint="validate") == 3
