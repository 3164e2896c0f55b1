"""Fixtures more than one test module uses."""

from __future__ import annotations

import pytest

from tests.helpers.fake_apiserver import Cluster, FakeApiServer
from webhook.coordination.reservations import node_leases
from webhook.state.apiserver import ApiServer


@pytest.fixture
def leases(tmp_path):
    """A fake API server's Leases and a ``LeaseStore`` in namespace admit-guard on it."""
    cluster = Cluster()
    server = FakeApiServer(cluster)
    api = ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))
    yield cluster, node_leases(api, "admit-guard")
    server.close()
