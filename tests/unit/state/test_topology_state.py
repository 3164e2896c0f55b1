"""NodeResourceTopology objects read into the state: zones, amounts, policy and scope
(topology-admission-spec §6.1, §6.2), strictly, naming the file, document and field."""

import pytest

from tests.helpers.builders import node, pod
from tests.helpers.topology_builders import nrt
from webhook.kube.errors import FieldError
from webhook.state import ClusterState, node_from
from webhook.state.snapshot import SnapshotError, load_snapshot
from webhook.state.topology import topology_from


def write(tmp_path, *objs):
    import yaml

    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": list(objs)}))
    return str(path)


def test_zones_of_type_node_are_read_by_numa_id_with_each_resource_per_zone():
    obj = nrt(
        zones=[{"cpu": ("16", "14", "10")}, {"cpu": "16", "nvidia.com/gpu": ("2", "2", "1")}], ids=[1, 0]
    )
    obj["zones"].append({"name": "socket-0", "type": "Socket", "resources": []})
    topology = topology_from(obj)
    assert topology.zones == (0, 1)
    cpu = topology.resources["cpu"]
    assert (cpu.capacity, cpu.allocatable, cpu.available) == ((16000, 16000), (16000, 14000), (16000, 10000))
    gpu = topology.resources["nvidia.com/gpu"]
    assert gpu.available == (1, 0) and gpu.listed == 0b01


def test_attributes_name_policy_and_scope_and_override_the_deprecated_topology_policies():
    legacy = topology_from(nrt(policy=None, legacy=["RestrictedPodLevel"]))
    assert (legacy.policy, legacy.scope) == ("restricted", "pod")
    both = topology_from(nrt(policy="single-numa-node", legacy=["RestrictedPodLevel"]))
    assert (both.policy, both.scope) == ("single-numa-node", "pod")


@pytest.mark.parametrize("legacy", [["Restricted"], ["BestEffort"], ["None"], ["whatever"], []])
def test_topology_policies_without_a_level_set_nothing(legacy):
    assert topology_from(nrt(policy=None, legacy=legacy)).policy is None


def test_invalid_policy_or_scope_values_are_ignored_like_scheduler_plugins():
    topology = topology_from(nrt(policy="strict", scope="node"))
    assert (topology.policy, topology.scope, topology.effective_scope) == (None, None, "container")


def test_zone_names_that_are_not_numa_ids_are_dropped():
    obj = nrt(zones=[{"cpu": "4"}])
    obj["zones"] += [{"name": "node-x", "type": "Node"}, {"name": "node-64", "type": "Node"}]
    assert topology_from(obj).zones == (0,)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda o: o["zones"][0]["resources"][0].update(capacity="lots"), "zones[0].resources[0].capacity"),
        (lambda o: o["zones"][0]["resources"][0].pop("available"), "zones[0].resources[0].available"),
        (lambda o: o.update(attributes=[{"name": "x", "value": 3}]), "attributes[0].value"),
        (lambda o: o.update(zones={"node-0": {}}), "zones"),
        (lambda o: o["metadata"].pop("name"), "metadata.name"),
    ],
)
def test_bad_fields_are_errors_naming_the_field(mutate, field):
    obj = nrt(zones=[{"cpu": "4"}])
    mutate(obj)
    with pytest.raises(FieldError) as err:
        topology_from(obj)
    assert err.value.field == field


def test_a_snapshot_attaches_each_nrt_to_its_node_whichever_comes_first(tmp_path):
    path = write(tmp_path, nrt("a", [{"cpu": "8"}]), node("a"), node("b"), pod("p", node_name="a"))
    state = load_snapshot([path])
    assert state.nodes["a"].topology.resources["cpu"].available == (8000,)
    assert state.nodes["b"].topology is None


def test_a_snapshot_error_in_an_nrt_names_the_file_document_and_field(tmp_path):
    bad = nrt("a", [{"cpu": "8"}])
    bad["zones"][0]["resources"][0]["allocatable"] = "8 cores"
    path = write(tmp_path, node("a"), bad)
    with pytest.raises(SnapshotError) as err:
        load_snapshot([path])
    [problem] = err.value.problems
    assert (
        problem.startswith(path)
        and "NodeResourceTopology: field zones[0].resources[0].allocatable" in problem
    )


def test_an_nrt_of_another_version_is_an_error_naming_the_version(tmp_path):
    old = nrt("a", [{"cpu": "8"}])
    old["apiVersion"] = "topology.node.k8s.io/v1alpha1"
    with pytest.raises(SnapshotError) as err:
        load_snapshot([write(tmp_path, node("a"), old)])
    assert "field apiVersion" in str(err.value) and "topology.node.k8s.io/v1alpha2" in str(err.value)


def test_set_topology_is_the_informers_seam_and_survives_node_updates():
    state = ClusterState()
    state.set_node(node_from(node("a")))
    topology = topology_from(nrt("a", [{"cpu": "8"}]))
    revision = state.revision
    state.set_topology("a", topology)
    assert state.nodes["a"].topology is topology and state.revision == revision + 1
    state.set_node(node_from(node("a")))  # a heartbeat keeps it
    assert state.nodes["a"].topology is topology
    state.set_topology("a", None)
    assert state.nodes["a"].topology is None and "a" not in state.topologies
