"""The topology manager check through the installed console script: ``check`` denies a pinned
Guaranteed pod no NUMA zone can hold with ``TopologyAffinityError``, and ``explain`` shows the
node refused with its zones, and ``audit`` reports the pods the topology manager rejected and
the NRT whose pods fingerprint is stale (issue 27 item 3)."""

from __future__ import annotations

import json

import yaml

from tests.helpers.builders import container, node, pod
from tests.helpers.console import cli, write
from tests.helpers.topology_builders import nrt

GUARANTEED = {"cpu": "6", "memory": "1Gi"}


def snapshot(tmp_path) -> str:
    zones = [{"cpu": ("16", "16", "4")}, {"cpu": ("16", "16", "4")}]
    items = [node("numa-1", cpu="32", memory="64Gi"), node("plain-1", cpu="32", memory="64Gi")]
    items += [nrt("numa-1", zones, policy="single-numa-node"), pod("running", node_name="numa-1")]
    return write(
        tmp_path, "cluster.yaml", yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items})
    )


def pinned(node_name: str | None = "numa-1") -> str:
    obj = pod(
        "hpc", node_name=node_name, containers=[container("app", requests=GUARANTEED, limits=GUARANTEED)]
    )
    del obj["metadata"]["uid"]
    return yaml.safe_dump(obj)


def test_check_denies_a_pinned_guaranteed_pod_no_zone_can_align_with_topology_affinity_error(tmp_path):
    result = cli("check", "-f", "-", "--cluster", snapshot(tmp_path), "-o", "json", stdin=pinned())
    assert result.returncode == 1, result.stderr
    text = result.stdout
    assert "TopologyAffinityError" in text
    assert "Resources cannot be allocated with Topology locality" in text
    assert "node-0: cpu 4; node-1: cpu 4" in text
    assert "OutOfcpu" not in text
    assert "plain-1" in text  # the node it fits on now


def test_check_allows_the_same_pod_pinned_where_no_nrt_says_anything(tmp_path):
    result = cli("check", "-f", "-", "--cluster", snapshot(tmp_path), stdin=pinned("plain-1"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_explain_shows_the_node_refused_with_its_zones(tmp_path):
    result = cli("explain", "-f", "-", "--cluster", snapshot(tmp_path), "-o", "json", stdin=pinned())
    assert result.returncode == 0, result.stderr
    [explained] = json.loads(result.stdout)["results"]
    nodes = {n["node"]: n for n in explained["nodes"]}
    assert nodes["numa-1"]["reasons"] == ["TopologyAffinityError"] and not nodes["numa-1"]["fits"]
    assert "node-0: cpu 4; node-1: cpu 4" in nodes["numa-1"]["zones"]
    assert nodes["plain-1"]["fits"]
    text = cli("explain", "-f", "-", "--cluster", snapshot(tmp_path), stdin=pinned()).stdout
    assert "TopologyAffinityError (topology manager policy single-numa-node" in text


def test_audit_reports_the_pods_the_topology_manager_rejected_and_the_stale_nrt(tmp_path):
    failed = pod("hpc-1", node_name="numa-1")
    failed["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "hpc-6f", "uid": "rs-1", "controller": True}
    ]
    failed["status"] = {
        "phase": "Failed",
        "reason": "TopologyAffinityError",
        "message": "Pod was rejected: Resources cannot be allocated with Topology locality",
    }
    stale = nrt(
        "numa-1",
        [{"cpu": ("16", "16", "4")}, {"cpu": ("16", "16", "4")}],
        attributes={"nodeTopologyPodsFingerprint": "pfp0v001deadbeefdeadbeef"},
    )
    items = [node("numa-1", cpu="32", memory="64Gi"), stale, pod("running", node_name="numa-1"), failed]
    path = write(
        tmp_path, "failed.yaml", yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items})
    )
    result = cli("audit", "--cluster", path, "-o", "json")
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    by_type = {f["type"]: f for f in report["findings"]}
    rejected = by_type["TopologyRejectedPods"]
    assert (rejected["kind"], rejected["name"], rejected["node"], rejected["count"]) == (
        "ReplicaSet",
        "hpc-6f",
        "numa-1",
        1,
    )
    assert "numa-1 1 (NRT policy single-numa-node, scope container)" in rejected["message"]
    assert (by_type["StaleNodeResourceTopology"]["name"], by_type["StaleNodeResourceTopology"]["count"]) == (
        "numa-1",
        1,
    )
    assert report["summary"]["byType"]["TopologyRejectedPods"] == 1
