"""Waiting for an informer, and the wire pieces its tests feed it."""

from __future__ import annotations

import time

from tests.helpers.fake_apiserver import Cluster
from webhook.state import ClusterState, node_from, pod_record
from webhook.state.informer import Informer


def eventually(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def converged(informer: Informer, cluster: Cluster, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with informer.lock:
            if fingerprint(informer.state) == fingerprint(recomputed(cluster)):
                return True
        time.sleep(0.05)
    return False


class Reads:
    """A socket file that returns the given pieces, one per ``read1``."""

    def __init__(self, *pieces: bytes) -> None:
        self.pieces = list(pieces)

    def read1(self, size: int) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""


def chunked(*events: bytes) -> bytes:
    return b"".join(b"%x;ext=1\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\nTrailer: x\r\n\r\n"


def recomputed(cluster: Cluster) -> ClusterState:
    state = ClusterState()
    for obj in cluster.truth("nodes"):
        state.set_node(node_from(obj))
    for obj in cluster.truth("pods"):
        state.set_pod(obj["metadata"]["uid"], pod_record(obj))
    return state


def fingerprint(state: ClusterState) -> dict:
    """Everything the checks read, in comparable form."""
    node_names = set(state.nodes) | {r.node for r in state.pods.values() if r.node}
    return {
        "nodes": dict(state.nodes),
        "pods": dict(state.pods),
        "usage": {
            n: (dict(state.usage(n).requested), sorted(state.usage(n).pods), +state.usage(n).host_ports)
            for n in node_names
        },
        "devices": {n: dict(state.device_holders(n, "nvidia.com/gpu")) for n in node_names},
        "offering": sorted(state.nodes_offering("nvidia.com/gpu")),
    }
