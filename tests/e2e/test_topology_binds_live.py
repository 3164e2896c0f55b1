"""The topology check's binds in flight across replicas, live: two guard servers of two workers
each on one fake API server, coordinating through its Leases (issue 27 item 4): concurrent
Bindings to one node get only as many allows as its NUMA zones hold."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from tests.helpers.binds import binding
from tests.helpers.builders import node
from tests.helpers.fake_apiserver import Cluster, FakeApiServer
from tests.helpers.informer import eventually
from tests.helpers.live_server import live_server, post_json
from tests.helpers.topology_builders import guaranteed_pod, nrt


@contextmanager
def two_guards(tmp_path, cluster: Cluster):
    """Two servers of two workers each on ``cluster``, coordinating through its Leases."""
    server = FakeApiServer(cluster)
    config = tmp_path / "config.yaml"
    config.write_text(
        "policies: {nodeAdmission: {reservations: {namespace: admit-guard, waitSeconds: 10}}}\n"
    )
    args = ("--kubeconfig", server.kubeconfig(tmp_path / "kubeconfig"), "--config", str(config))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    try:
        with live_server(tmp_path / "a", *args) as first, live_server(tmp_path / "b", *args) as second:
            yield first, second
    finally:
        server.close()


def bind_all(guards, names: list[str]) -> list[dict]:
    """Every bind at once, alternating between the guards."""
    start = threading.Barrier(len(names))

    def bind(i: int) -> dict:
        conn = guards[i % len(guards)].connect()
        start.wait()
        try:
            return post_json(conn, "/validate", binding(names[i], "node-1"))[1]["response"]
        finally:
            conn.close()

    with ThreadPoolExecutor(len(names)) as pool:
        return list(pool.map(bind, range(len(names))))


def numa_cluster(pods: list[dict], available: tuple[str, str]) -> Cluster:
    cluster = Cluster(bookmark_every=0.2, serves_topologies=True)
    cluster.load("nodes", [node("node-1", cpu="64", memory="256Gi")])
    cluster.load("pods", pods)
    cluster.load("noderesourcetopologies", [nrt("node-1", zones(available))])
    return cluster


def zones(available: tuple[str, str]) -> list[dict]:
    return [{"cpu": ("16", "12", a)} for a in available]


def test_three_concurrent_ten_cpu_binds_over_two_guards_get_one_allow_per_twelve_cpu_zone(tmp_path):
    pods = [*(guaranteed_pod(name) for name in "abc"), guaranteed_pod("small", "2")]
    pods.append(guaranteed_pod("big", "3"))
    cluster = numa_cluster(pods, ("12", "12"))
    with two_guards(tmp_path, cluster) as guards:
        responses = bind_all(guards, ["a", "b", "c"])
        assert [r["allowed"] for r in responses].count(True) == 2, json.dumps(responses, indent=1)
        assert [r["status"]["reason"] for r in responses if not r["allowed"]] == ["TopologyAffinityError"]
        # one per zone: each zone has 2 CPUs left, so 3 fits neither and 2 fits one
        assert bind_all(guards[:1], ["big"])[0]["allowed"] is False
        assert bind_all(guards[1:], ["small"])[0]["allowed"] is True


def test_two_binds_that_fit_one_zone_each_but_not_together_get_one_allow_until_the_nrt_frees_it(tmp_path):
    """node-0 has 12 free, node-1 4: two 8-CPU binds, exactly one allowed. The winner lands and
    the exporter shows node-0 at 4: the loser still does not fit. The winner ends and the exporter
    shows node-0 at 12 again: now it does."""
    cluster = numa_cluster([guaranteed_pod("a", "8"), guaranteed_pod("b", "8")], ("12", "4"))
    with two_guards(tmp_path, cluster) as guards:
        responses = bind_all(guards, ["a", "b"])
        assert [r["allowed"] for r in responses].count(True) == 1, json.dumps(responses, indent=1)
        winner, loser = ("a", "b") if responses[0]["allowed"] else ("b", "a")
        cluster.put("pods", guaranteed_pod(winner, "8", node_name="node-1"))
        cluster.put("noderesourcetopologies", nrt("node-1", zones(("4", "4"))))
        time.sleep(1.0)
        assert all(not r["allowed"] for g in guards for r in bind_all([g], [loser]))
        cluster.delete("pods", f"uid-{winner}")
        cluster.put("noderesourcetopologies", nrt("node-1", zones(("12", "4"))))
        assert eventually(lambda: all(r["allowed"] for g in guards for r in bind_all([g], [loser])), 10)
