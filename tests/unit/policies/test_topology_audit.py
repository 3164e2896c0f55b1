"""``nodeAdmission``'s audit of the topology manager (issue 27 item 3): the pods it already
rejected (``TopologyRejectedPods``, by top controller) and the nodes whose NodeResourceTopology
does not count the pods on them (``StaleNodeResourceTopology``, per node, also in the server's
periodic audit)."""

from __future__ import annotations

from tests.helpers.audit_gauges import ScrapedGauges
from tests.helpers.builders import node, pod
from tests.helpers.live_server import metric_sum
from tests.helpers.storm import rejected
from tests.helpers.topology_builders import guaranteed, nrt
from webhook import audit
from webhook.config import Config, config_from_dict
from webhook.kube.podfingerprint import pod_hash, sign
from webhook.policies.node_admission.topology_audit import STALE_TOPOLOGY, TOPOLOGY_REJECTED
from webhook.policies.storm_breaker import REASON as STORM
from webhook.serve.periodic_audit import PeriodicAudit
from webhook.state.apiserver import Page
from webhook.state.inventory import InventoryBuilder, live_inventory
from webhook.state.model import ClusterState, node_from, object_key, pod_record
from webhook.state.source import FixedState
from webhook.state.topology import topology_from

NOW = 1_900_000_000.0
ZONES = [{"cpu": ("16", "16", "4")}, {"cpu": ("16", "16", "4")}]


def inventory(*objects):
    builder = InventoryBuilder()
    for obj in objects:
        builder.add(obj)
    return builder.inventory


def of_type(findings, finding_type):
    return [f for f in findings if f.type == finding_type]


def run(*objects, config=None):
    return audit.run_audit(inventory(*objects), config or Config(), NOW).findings


def fingerprint_of(*pods: tuple[str, str]) -> str:
    return sign(pod_hash(namespace, name) for namespace, name in pods)


# -- TopologyRejectedPods -------------------------------------------------------------------


def gpu_cluster():
    """gpu-1 publishes an NRT with a policy; gpu-2 publishes none."""
    return [node("gpu-1"), node("gpu-2"), nrt("gpu-1", ZONES, policy="single-numa-node")]


def test_pods_the_topology_manager_rejected_are_one_finding_per_owner_naming_nodes_and_count():
    pods = [
        rejected("t-1", "TopologyAffinityError"),
        rejected("t-2", "TopologyAffinityError"),
        rejected("t-3", "SMTAlignmentError", node_name="gpu-2"),
        rejected("other", "OutOfcpu"),
    ]
    [finding] = of_type(run(*gpu_cluster(), *pods), TOPOLOGY_REJECTED)
    assert (finding.namespace, finding.kind, finding.name, finding.count) == (
        "ml",
        "ReplicaSet",
        "trainer-7d9f",
        3,
    )
    assert finding.severity == "high"  # a replacement was already sent back and refused again
    assert "reasons TopologyAffinityError 2, SMTAlignmentError 1" in finding.message
    assert "gpu-1 2 (NRT policy single-numa-node, scope container)" in finding.message
    assert (
        "gpu-2 1 (no NodeResourceTopology with a policy: the guard cannot predict it there)"
        in finding.message
    )
    assert "kube-scheduler cannot see NUMA zones" in finding.message
    assert "admit-guard explain" in finding.message and "full-pcpus-only" in finding.message
    assert "kubectl delete pods -n ml t-1 t-2 t-3 " in finding.message + " "  # not the OutOfcpu pod


def test_one_rejected_pod_on_one_node_is_medium_and_names_that_node():
    [finding] = of_type(run(*gpu_cluster(), rejected("t-1", "TopologyAffinityError")), TOPOLOGY_REJECTED)
    assert (finding.severity, finding.count, finding.node) == ("medium", 1, "gpu-1")
    assert "1 pod of ReplicaSet ml/trainer-7d9f was rejected" in finding.message
    assert "full-pcpus-only" not in finding.message


def test_pods_rejected_for_other_reasons_make_no_topology_finding():
    assert of_type(run(*gpu_cluster(), rejected("a", "OutOfcpu"), rejected("b")), TOPOLOGY_REJECTED) == []


def test_the_finding_says_when_the_storm_audit_counts_the_same_pods():
    pods = [rejected(f"t-{i}", "TopologyAffinityError") for i in range(3)] + [rejected("o", "OutOfcpu")]
    config = config_from_dict({"policies": {"stormBreaker": {"threshold": 4}}})
    findings = run(*gpu_cluster(), *pods, config=config)
    [storm] = of_type(findings, STORM)
    [topology] = of_type(findings, TOPOLOGY_REJECTED)
    assert (storm.count, topology.count) == (4, 3)
    assert "The same pods are counted in this owner's AdmissionStorm finding." in topology.message


def test_below_the_storm_threshold_or_with_the_storm_breaker_off_no_storm_is_named():
    pods = [rejected(f"t-{i}", "TopologyAffinityError") for i in range(3)]
    off = config_from_dict({"policies": {"stormBreaker": {"mode": "off", "threshold": 2}}})
    for config in (config_from_dict({"policies": {"stormBreaker": {"threshold": 4}}}), off):
        [topology] = of_type(run(*gpu_cluster(), *pods, config=config), TOPOLOGY_REJECTED)
        assert "AdmissionStorm" not in topology.message


def test_excluded_namespaces_and_node_admission_off_are_not_audited_for_topology_rejections():
    pods = [rejected("t-1", "TopologyAffinityError")]
    excluded = config_from_dict({"excludedNamespaces": ["ml"]})
    off = config_from_dict({"policies": {"nodeAdmission": {"mode": "off"}}})
    assert of_type(run(*gpu_cluster(), *pods), TOPOLOGY_REJECTED)
    for config in (excluded, off):
        assert of_type(run(*gpu_cluster(), *pods, config=config), TOPOLOGY_REJECTED) == []


def test_without_failed_pods_the_topology_rejections_are_not_judged_but_the_stale_nrts_are():
    unjudged = audit.unjudged(inventory(*gpu_cluster(), pod("a", node_name="gpu-1")))
    assert TOPOLOGY_REJECTED in unjudged and STALE_TOPOLOGY not in unjudged
    assert TOPOLOGY_REJECTED not in audit.unjudged(
        inventory(*gpu_cluster(), rejected("t-1", "TopologyAffinityError"))
    )


# -- StaleNodeResourceTopology --------------------------------------------------------------


def numa_node(fingerprint: str | None, *pods: str, **attributes: str):
    """numa-1 with ``pods`` bound (namespace default) and an NRT publishing ``fingerprint``."""
    if fingerprint is not None:
        attributes["nodeTopologyPodsFingerprint"] = fingerprint
    objects = [node("numa-1", cpu="32"), nrt("numa-1", ZONES, attributes=attributes)]
    return objects + [pod(name, node_name="numa-1") for name in pods]


def test_a_node_whose_nrt_fingerprint_is_not_that_of_its_pods_is_stale():
    published = fingerprint_of(("default", "a"))
    [finding] = of_type(run(*numa_node(published, "a", "b")), STALE_TOPOLOGY)
    assert (finding.kind, finding.name, finding.node, finding.count) == ("Node", "numa-1", "numa-1", 2)
    assert finding.severity == "medium"
    known = fingerprint_of(("default", "a"), ("default", "b"))
    assert f"nodeTopologyPodsFingerprint {published} is not the fingerprint of the 2 pods" in finding.message
    assert f"({known}, method all)" in finding.message
    assert "only warns of TopologyAffinityError on this node" in finding.message


def test_a_node_whose_nrt_fingerprint_matches_its_pods_or_publishes_none_is_not_stale():
    matching = fingerprint_of(("default", "a"), ("default", "b"))
    assert of_type(run(*numa_node(matching, "a", "b")), STALE_TOPOLOGY) == []
    assert of_type(run(*numa_node(None, "a", "b")), STALE_TOPOLOGY) == []


def test_with_exclusive_resources_only_the_pods_that_align_something_are_fingerprinted():
    """``nodeTopologyPodsFingerprintMethod: with-exclusive-resources``: a best-effort pod is not
    in the exporter's set, so leaving it out of the published fingerprint is not stale."""
    pinned = pod("pinned", node_name="numa-1", containers=[guaranteed(cpu="2", memory="1Gi")])
    published = fingerprint_of(("default", "pinned"))
    objects = numa_node(
        published, "best-effort", nodeTopologyPodsFingerprintMethod="with-exclusive-resources"
    )
    assert of_type(run(*objects, pinned), STALE_TOPOLOGY) == []
    assert of_type(run(*numa_node(published, "best-effort"), pinned), STALE_TOPOLOGY)


def test_with_the_topology_check_off_no_nrt_is_judged_stale():
    config = config_from_dict({"policies": {"nodeAdmission": {"topology": "off"}}})
    assert of_type(run(*numa_node(fingerprint_of(), "a"), config=config), STALE_TOPOLOGY) == []


def live_state(published: str) -> ClusterState:
    """A live state (the informer's: an NRT's age is known) where ``late`` was bound after numa-1's
    NRT last changed."""
    state = ClusterState()
    state.topology_age_known = True
    state.set_node(node_from(node("numa-1", cpu="32")))
    attributes = {"nodeTopologyPodsFingerprint": published}
    state.set_topology("numa-1", topology_from(nrt("numa-1", ZONES, attributes=attributes)))
    late = pod("late", node_name="numa-1", containers=[guaranteed(cpu="2", memory="1Gi")])
    state.set_pod(object_key(late), pod_record(late))
    return state


def test_pods_bound_since_the_nrt_last_changed_are_named_as_the_exporter_catching_up():
    [finding] = audit.node_findings(live_state(fingerprint_of()), Config(), ["numa-1"])
    assert finding.type == STALE_TOPOLOGY
    assert "1 pod was bound since the NRT last changed" in finding.message


def test_the_periodic_audit_publishes_stale_nrts_as_a_gauge_and_not_the_failed_pods_it_cannot_see():
    [(types, _), *_] = audit.periodic_passes(Config())
    assert STALE_TOPOLOGY in types and TOPOLOGY_REJECTED not in types
    metrics = ScrapedGauges()
    periodic = PeriodicAudit(FixedState(live_state(fingerprint_of())), Config(), metrics, 60)
    assert [f.type for f in periodic.run_once()] == [STALE_TOPOLOGY]
    scraped = metrics.scrape()
    assert metric_sum(scraped, "admit_guard_audit_findings", type=STALE_TOPOLOGY) == 1
    assert 'type="TopologyRejectedPods"' not in scraped


class TopologyApi:
    """Serves nodes, pods and NRTs; discovery answers for the topology group only."""

    def __init__(self, objects: dict[str, list[dict]]) -> None:
        self.objects = objects
        self.asked: list[str] = []

    def served_kinds(self, groups):
        return {}

    def serves(self, group_version):
        return group_version == "topology.node.k8s.io/v1alpha2"

    def list_page(self, resource, limit, token=""):
        self.asked.append(resource)
        return Page(self.objects.get(resource, []), "1", "")


def test_a_live_audit_reads_the_nrts_where_the_cluster_serves_them():
    [numa, nrt_obj, a] = numa_node(fingerprint_of(), "a")
    items = {"nodes": [numa], "pods": [a], "noderesourcetopologies": [nrt_obj]}
    api = TopologyApi(
        {
            k: [{x: y for x, y in o.items() if x not in ("kind", "apiVersion")} for o in v]
            for k, v in items.items()
        }
    )
    found = audit.run_audit(live_inventory(api, page_size=10), Config(), NOW).findings
    assert "noderesourcetopologies" in api.asked
    assert [f.name for f in of_type(found, STALE_TOPOLOGY)] == ["numa-1"]
