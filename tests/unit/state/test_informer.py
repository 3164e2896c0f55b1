"""The live informer against a fake API server on loopback: it converges to the truth after
every fault, and never loses or double-counts a pod (aggregates equal a recomputation)."""

from __future__ import annotations

import gc
import json
import time
from contextlib import contextmanager

import pytest

from tests.helpers.builders import container, node, pod
from tests.helpers.fake_apiserver import Cluster, FakeApiServer, Fault
from tests.helpers.informer import Reads, chunked, converged, eventually, fingerprint, recomputed
from webhook.config import config_from_dict
from webhook.engine import evaluate
from webhook.state.apiserver import ApiError, ApiServer, _dechunked
from webhook.state.informer import Informer, Timing, live_snapshot

FAST = Timing(page_size=2, watch_timeout=3, read_timeout=1.0, backoff_base=0.02, backoff_cap=0.2, max_age=30)


@pytest.fixture
def cluster():
    cluster = Cluster(bookmark_every=0.2)
    cluster.load("nodes", [node(f"n{i}", cpu="4", pods="10") for i in range(3)])
    cluster.load(
        "pods",
        [
            pod(f"p{i}", node_name=f"n{i % 3}", requests={"cpu": "500m", "nvidia.com/gpu": "1"})
            for i in range(5)
        ],
    )
    return cluster


@pytest.fixture
def server(cluster):
    server = FakeApiServer(cluster)
    yield server
    server.close()


@pytest.fixture
def informer(server, tmp_path):
    api = ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))
    informer = Informer(api, FAST).start()
    assert informer.wait_synced(10)
    yield informer
    informer.stop()


def test_initial_list_is_paginated_and_makes_the_informer_ready(informer, cluster):
    assert cluster.requests.count("pods list") == 3  # 5 pods, 2 per page
    assert converged(informer, cluster)
    readiness = informer.readiness()
    assert readiness.ready and (readiness.nodes, readiness.pods) == (3, 5)


def test_events_update_aggregates_incrementally(informer, cluster):
    cluster.put("pods", pod("new", node_name="n1", requests={"cpu": "1"}, uid="uid-new"))
    cluster.put("pods", pod("p1", node_name="n1", requests={"cpu": "2"}))  # resized
    cluster.put("pods", pod("p2", node_name="n2", phase="Succeeded"))  # terminal: leaves the sums
    cluster.delete("pods", "uid-p3")
    cluster.put("nodes", node("n3", cpu="8"))
    assert converged(informer, cluster)
    assert "uid-p2" not in informer.state.pods


def test_node_deleted_while_its_pods_remain_keeps_their_usage(informer, cluster):
    cluster.delete("nodes", "n0")
    assert converged(informer, cluster)
    assert "n0" not in informer.state.nodes
    assert informer.state.usage("n0").pod_count == 2


def test_connection_dropped_mid_stream_resumes_without_loss(informer, cluster):
    cluster.inject("pods", Fault("drop", after=2))
    cluster.end_watches()
    for i in range(6):
        cluster.put("pods", pod(f"d{i}", node_name="n0", requests={"cpu": "100m"}))
    assert converged(informer, cluster)


def test_malformed_event_line_resumes_from_the_last_good_version(informer, cluster):
    cluster.inject("pods", Fault("malformed", after=1))
    cluster.end_watches()
    for i in range(4):
        cluster.put("pods", pod(f"m{i}", node_name="n2", requests={"cpu": "100m"}))
    assert converged(informer, cluster)


def test_gone_relists_and_counts_the_relist(informer, cluster):
    relists = informer.relists
    cluster.inject("pods", Fault("gone"))
    cluster.end_watches()
    cluster.put("pods", pod("g", node_name="n2"))
    assert eventually(lambda: informer.relists > relists)
    assert converged(informer, cluster)


def test_compacted_history_relists_and_drops_objects_deleted_meanwhile(informer, cluster):
    cluster.inject("pods", Fault("stall", seconds=1.5))  # the watch stalls ...
    cluster.end_watches()
    cluster.put("pods", pod("s", node_name="n0"))
    cluster.delete("pods", "uid-p0")
    cluster.compact("pods")  # ... and by the time it resumes, its history is gone
    assert converged(informer, cluster)
    assert "uid-p0" not in informer.state.pods


def test_stalled_stream_is_detected_by_the_read_timeout(informer, cluster):
    cluster.bookmark_every = 5.0  # no bookmarks either: only the read timeout can notice
    cluster.inject("pods", Fault("stall", seconds=3))
    cluster.end_watches()
    cluster.put("pods", pod("stalled", node_name="n1"))
    assert converged(informer, cluster, timeout=15)


def test_slow_stream_still_converges(informer, cluster):
    cluster.inject("pods", Fault("slow", seconds=0.05))
    cluster.end_watches()
    for i in range(5):
        cluster.put("pods", pod(f"slow{i}", node_name="n1"))
    assert converged(informer, cluster)


def test_server_errors_and_expired_continue_tokens_are_retried(server, cluster, tmp_path):
    cluster.inject("nodes", Fault("http500"), Fault("http500"))
    cluster.inject("pods", Fault("expire-continue"))
    api = ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))
    informer = Informer(api, FAST).start()
    try:
        assert informer.wait_synced(10)
        assert converged(informer, cluster)
    finally:
        informer.stop()


def test_not_ready_until_both_lists_complete_and_node_checks_fail_open_with_the_reason(
    server, cluster, tmp_path
):
    cluster.inject("pods", *[Fault("http500")] * 1000)
    api = ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))
    informer = Informer(api, FAST).start()
    try:
        time.sleep(0.5)
        readiness = informer.readiness()
        assert not readiness.ready and "pods" in readiness.reason
        pinned = pod("x", node_name="n0", requests={"cpu": "100"})
        with informer.reading() as view:
            assert view.state is None
            opened = evaluate(
                pinned, "CREATE", view.state, config_from_dict({}), state_unavailable=view.unavailable
            )
            closed = evaluate(
                pinned,
                "CREATE",
                view.state,
                config_from_dict({"failOpen": False}),
                state_unavailable=view.unavailable,
            )
        assert opened.allowed and "has not finished listing pods" in opened.warnings[0]
        assert not closed.allowed and closed.violations[0].reason == "ClusterStateUnavailable"
    finally:
        informer.stop()


@contextmanager
def quiet_informer(server, cluster, tmp_path, max_age: float):
    """A synced informer whose API server sends no bookmarks: only events keep it fresh."""
    cluster.bookmark_every = 60.0
    api = ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))
    informer = Informer(api, Timing(page_size=2, max_age=max_age)).start()
    try:
        assert informer.wait_synced(10)
        yield informer
    finally:
        informer.stop()


def test_state_older_than_the_bound_is_not_trusted(server, cluster, tmp_path):
    with quiet_informer(server, cluster, tmp_path, max_age=0.3) as informer:
        time.sleep(0.5)
        with informer.reading() as view:
            assert view.state is None and "old" in view.unavailable
        readiness = informer.readiness()
        assert not readiness.ready and "old" in readiness.reason  # /readyz answers 503 with it


def test_readiness_returns_once_the_stale_state_hears_from_the_api_server_again(server, cluster, tmp_path):
    with quiet_informer(server, cluster, tmp_path, max_age=0.5) as informer:
        assert eventually(lambda: not informer.readiness().ready)
        cluster.put("pods", pod("late", node_name="n0", requests={"cpu": "100m"}))
        cluster.put("nodes", node("n0", cpu="4", pods="10"))
        assert eventually(lambda: informer.readiness().ready, timeout=5)


def test_a_silent_node_watch_is_stale_even_while_pod_events_arrive(server, cluster, tmp_path):
    with quiet_informer(server, cluster, tmp_path, max_age=0.5) as informer:
        for n in range(8):  # pod events keep coming; nothing about nodes
            cluster.put("pods", pod(f"busy-{n}", node_name="n0", requests={"cpu": "10m"}))
            time.sleep(0.1)
        readiness = informer.readiness()
        assert not readiness.ready and "nothing heard of nodes" in readiness.reason


def test_the_backoff_starts_small_again_once_the_api_server_answers(server, cluster, tmp_path, caplog):
    cluster.inject("pods", *[Fault("http500") for _ in range(6)])
    api = ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))
    informer = Informer(api, Timing(page_size=2, backoff_base=0.01, backoff_cap=0.5)).start()
    try:
        assert informer.wait_synced(10)
        retries = [r for r in caplog.records if r.getMessage().startswith("watch pods: 500")]
        assert len(retries) == 6
        # The count is read after the sync, not polled: the seventh try may succeed at once.
        assert informer._failures.get("pods") == 0
    finally:
        informer.stop()


def test_the_default_backoff_is_capped_at_a_few_seconds():
    assert Timing().backoff_cap <= 5


def test_policies_that_need_no_state_still_apply_while_unsynced(informer):
    from tests.helpers.builders import deployment

    pinned = deployment({"nodeName": "n0", "containers": [container()]})
    decision = evaluate(pinned, "CREATE", None, config_from_dict({}), state_unavailable="not synced")
    assert [v.reason for v in decision.violations] == ["PinnedNodeName"]


def test_wrong_token_is_an_error_not_a_hang(server, cluster, tmp_path):
    cluster.token = "another"
    api = ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))
    cluster.token = "test-token"
    with pytest.raises(Exception, match="401"):
        live_snapshot(api)


def test_live_snapshot_lists_once(server, cluster, tmp_path):
    api = ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))
    state = live_snapshot(api, page_size=2)
    assert fingerprint(state) == fingerprint(recomputed(cluster))


def test_the_records_a_list_builds_are_frozen_so_no_collection_scans_the_state_again(server, tmp_path):
    api = ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))
    gc.unfreeze()
    state = live_snapshot(api, page_size=2)
    young = {id(obj) for obj in gc.get_objects()}  # the permanent generation is not in it
    records = list(state.pods.values())
    assert records and gc.get_freeze_count() >= len(records)
    assert all(gc.is_tracked(record) and id(record) not in young for record in records)


def test_stop_ends_the_watches_promptly(informer):
    started = time.monotonic()
    informer.stop()
    assert time.monotonic() - started < 5
    assert not any(t.is_alive() for t in informer._threads)


def test_check_dry_runs_against_live_state_from_a_kubeconfig(server, cluster, tmp_path):
    from click.testing import CliRunner

    from webhook.cli import main

    cluster.put("nodes", node("tiny", pods="1"))
    cluster.put("pods", pod("occupant", node_name="tiny"))
    manifest = tmp_path / "pinned.json"
    manifest.write_text(json.dumps(pod("newcomer", node_name="tiny")))
    result = CliRunner().invoke(
        main, ["check", "-f", str(manifest), "--kubeconfig", server.kubeconfig(tmp_path / "kc"), "-o", "json"]
    )
    assert result.exit_code == 1, result.output
    [entry] = json.loads(result.stdout)["results"]
    assert [v["reason"] for v in entry["violations"]] == ["OutOfpods"]


def test_serve_answers_from_live_state_and_follows_changes(server, cluster, tmp_path):
    from tests.helpers.live_server import live_server, post_json

    cluster.put("nodes", node("tiny", pods="1"))
    cluster.put("pods", pod("occupant", node_name="tiny"))
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u1", "operation": "CREATE", "object": pod("newcomer", node_name="tiny")},
    }
    with live_server(tmp_path, "--kubeconfig", server.kubeconfig(tmp_path / "kc")) as live:

        def allowed() -> bool:
            conn = live.connect()
            try:
                return post_json(conn, "/validate", review)[1]["response"]["allowed"]
            finally:
                conn.close()

        assert eventually(lambda: not allowed())  # both workers synced: tiny is full
        cluster.delete("pods", "uid-occupant")
        assert eventually(lambda: all(allowed() for _ in range(6)))  # every worker saw the delete


def test_an_in_place_resize_on_a_modified_event_moves_the_aggregates(informer, cluster):
    resized = pod("p1", node_name="n1", requests={"cpu": "500m", "nvidia.com/gpu": "1"}, phase="Running")
    resized["status"]["containerStatuses"] = [{"name": "app", "resources": {"requests": {"cpu": "500m"}}}]
    cluster.put("pods", resized)
    assert converged(informer, cluster)
    resized["status"]["containerStatuses"][0]["resources"]["requests"]["cpu"] = (
        "3"  # actuated: only the status
    )
    cluster.put("pods", resized)
    assert converged(informer, cluster)
    assert informer.state.usage("n1").requested["cpu"] == 3000 + 500  # and p4 (n1) unchanged


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 64, 65536])
def test_a_chunked_stream_is_decoded_whatever_the_read_sizes(size):
    events = [b'{"type":"ADDED"}\n', b'{"type":"MOD', b'IFIED"}\n', b"\r\n\r\n" * 3, b"x" * 300]
    body = chunked(*events)
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    assert b"".join(_dechunked(Reads(*pieces))) == b"".join(events)


@pytest.mark.parametrize(
    "body", [b"5\r\nabc", b"5\r\nabcde\r\n", b"zz\r\nab\r\n0\r\n\r\n", b"2\r\nabcd\r\n0\r\n\r\n", b"1" * 2000]
)
def test_a_cut_or_malformed_chunked_stream_is_an_error(body):
    with pytest.raises(ApiError):
        list(_dechunked(Reads(body)))


@pytest.mark.parametrize("size", [b"+5", b"0x5", b" 5", b"5 ", b"0_5", b"5\n"])
def test_a_watch_streams_chunk_sizes_are_read_by_the_servers_strict_grammar(size):
    with pytest.raises(ApiError, match="chunk-size line"):
        list(_dechunked(Reads(size + b"\r\nabcde\r\n0\r\n\r\n")))
