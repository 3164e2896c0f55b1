"""The live informer keeps each node's NodeResourceTopology, with the informer's rules; a
cluster without an NRT exporter (the CRD absent: 404) is said once and skipped."""

from __future__ import annotations

import logging

import pytest

from tests.helpers.builders import node
from tests.helpers.fake_apiserver import Cluster, FakeApiServer
from tests.helpers.informer import eventually
from tests.helpers.topology_builders import nrt
from webhook.state.apiserver import ApiServer
from webhook.state.informer import Informer, Timing


def topology_cluster(*, served: bool) -> Cluster:
    cluster = Cluster(bookmark_every=0.2, serves_topologies=served)
    cluster.load("nodes", [node("node-1"), node("node-2")])
    cluster.load("pods", [])
    cluster.load("noderesourcetopologies", [nrt("node-1", [{"cpu": "8"}, {"cpu": "8"}])])
    return cluster


@pytest.fixture
def live(tmp_path):
    started = []

    def start(cluster: Cluster) -> Informer:
        server = FakeApiServer(cluster)
        api = ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))
        informer = Informer(api, Timing(page_size=50)).start()
        started.append((informer, server))
        assert informer.wait_synced(10)
        return informer

    yield start
    for informer, server in started:
        informer.stop()
        server.close()


def test_the_informer_lists_and_watches_node_resource_topologies_onto_their_nodes(live):
    cluster = topology_cluster(served=True)
    informer = live(cluster)
    assert informer.state.nodes["node-1"].topology.policy == "single-numa-node"
    assert informer.state.nodes["node-2"].topology is None
    cluster.put("noderesourcetopologies", nrt("node-2", [{"cpu": "4"}], policy="restricted"))
    assert eventually(lambda: informer.state.nodes["node-2"].topology is not None)
    assert informer.state.nodes["node-2"].topology.policy == "restricted"
    cluster.delete("noderesourcetopologies", "node-1")
    assert eventually(lambda: informer.state.nodes["node-1"].topology is None)
    assert informer.readiness().ready


def test_a_cluster_without_node_resource_topologies_is_said_once_and_ready(live, caplog):
    caplog.set_level(logging.INFO, logger="webhook.state.informer")
    informer = live(topology_cluster(served=False))
    assert informer.readiness().ready
    assert informer.state.nodes["node-1"].topology is None
    said = [r.message for r in caplog.records if "noderesourcetopologies" in r.message]
    assert len(said) == 1 and "not predicted" in said[0], said
