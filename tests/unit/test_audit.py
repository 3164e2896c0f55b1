"""``admit-guard audit``: the four finding types, grouping storms by their top controller,
the JSON contract, exit codes, PolicyReports valid against the wg-policy CRDs (strict about
field names), live reads."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime

import jsonschema
import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers import fake_apiserver
from tests.helpers.builders import deployment, node, pod
from tests.helpers.paths import FIXTURES, ROOT
from webhook import audit
from webhook.cli import main
from webhook.config import Config, config_from_dict
from webhook.dra.judge import ALREADY_ALLOCATED
from webhook.policies.device_scheduler import REASON as MIXED
from webhook.policies.node_admission.overcommitted import OVERCOMMITTED
from webhook.policies.pinned_node_name import REASON as PINNED
from webhook.policies.storm_breaker import REASON as STORM
from webhook.policies.storm_breaker import storms
from webhook.state.apiserver import Page
from webhook.state.inventory import InventoryBuilder, Progress, RejectedPod, live_inventory

SCHEMAS = FIXTURES / "schemas"
CRDS = {
    "ClusterPolicyReport": SCHEMAS / "wgpolicyk8s.io_clusterpolicyreports.v1alpha2.yaml",
    "PolicyReport": SCHEMAS / "wgpolicyk8s.io_policyreports.v1alpha2.yaml",
}
NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC).timestamp()


def at(seconds_before_now: float) -> str:
    return datetime.fromtimestamp(NOW - seconds_before_now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ref(kind, name, uid, api_version="apps/v1"):
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True}


def owned(obj, *owner):
    obj["metadata"]["ownerReferences"] = [ref(*owner)]
    return obj


def with_uid(obj, uid):
    obj["metadata"]["uid"] = uid
    return obj


def replica_set(name, uid, deployment_name, deployment_uid, spec=None, namespace="default"):
    rs = deployment(spec or {"containers": [{"name": "app", "image": "img"}]}, name, namespace)
    rs["kind"] = "ReplicaSet"
    return owned(with_uid(rs, uid), "Deployment", deployment_name, deployment_uid)


def rejected(name, owner, *, reason="OutOfcpu", node_name="edge-1", created=None, labels=None, ns="default"):
    p = pod(name, node_name=node_name, namespace=ns)
    p["status"] = {
        "phase": "Failed",
        "reason": reason,
        "message": f"Pod was rejected: Node didn't have enough resource: {reason}",
    }
    p["metadata"]["creationTimestamp"] = created or at(60)
    p["metadata"]["labels"] = labels if labels is not None else {"app": "web", "pod-template-hash": "abc"}
    return owned(p, *owner) if owner else p


def inventory(*objects):
    builder = InventoryBuilder()
    for obj in objects:
        builder.add(obj)
    return builder.inventory


def findings(*objects, config: Config | None = None, now: float = NOW):
    return audit.run_audit(inventory(*objects), config or Config(), now).findings


def of_type(items, finding_type):
    return [f for f in items if f.type == finding_type]


def storm(count, *, created=None, reason="OutOfcpu"):
    """A Deployment, its ReplicaSet, and ``count`` pods of it the kubelet rejected."""
    return [
        with_uid(deployment({"containers": [{"name": "app", "image": "img"}]}, "web"), "dep-1"),
        replica_set("web-abc", "rs-1", "web", "dep-1"),
        *(
            rejected(f"web-abc-{i}", ("ReplicaSet", "web-abc", "rs-1"), created=created, reason=reason)
            for i in range(count)
        ),
    ]


# -- AdmissionStorm -----------------------------------------------------------------------


def test_rejected_pods_are_grouped_under_the_deployment_that_owns_their_replica_set():
    [finding] = of_type(findings(*storm(25)), STORM)
    assert (finding.kind, finding.namespace, finding.name, finding.count) == (
        "Deployment",
        "default",
        "web",
        25,
    )
    assert "reasons OutOfcpu 25" in finding.message
    assert "nodes edge-1 25" in finding.message
    assert finding.node == "edge-1"


def rejected_group(count, owner=None, labels=lambda i: (("app", "web"),)):
    pods = [RejectedPod("default", f"p{i}", owner, "OutOfpods", "n", "", labels(i)) for i in range(count)]
    return storms.StormGroup("default", owner, pods)


def test_a_small_storm_is_cleaned_up_by_name_deleting_exactly_the_pods_counted():
    assert storms.cleanup_command(rejected_group(2)) == "kubectl delete pods -n default p0 p1"
    command = storms.cleanup_command(rejected_group(storms.CLEANUP_NAMES_LIMIT))
    assert "--field-selector" not in command and "-l " not in command
    assert command.split()[5:] == [f"p{i}" for i in range(storms.CLEANUP_NAMES_LIMIT)]


def test_a_large_storm_is_cleaned_up_by_labels_and_phase_and_says_it_deletes_every_failed_pod():
    [finding] = of_type(findings(*storm(25)), STORM)
    assert finding.message.endswith(
        "Clean up: kubectl delete pods -n default --field-selector=status.phase=Failed "
        "-l app=web,pod-template-hash=abc (it deletes every Failed pod in namespace default with "
        "these labels, whatever made it fail, not only the 25 the kubelet rejected)"
    )


def test_a_large_storm_without_shared_labels_says_the_command_deletes_the_namespaces_failed_pods():
    command = storms.cleanup_command(rejected_group(30, labels=lambda i: (("i", str(i)),)))
    assert command.startswith("kubectl delete pods -n default --field-selector=status.phase=Failed (")
    assert "-l " not in command
    assert "deletes every Failed pod in namespace default, whatever made it fail" in command


def test_the_storm_message_stays_bounded_for_thousands_of_pods():
    [finding] = of_type(findings(*storm(5000)), STORM)
    assert len(finding.message) < 1000
    assert "web-abc-4999" not in finding.message


def test_rejected_pods_without_a_controller_are_named_by_their_namespace():
    objects = [rejected(f"bare-{i}", None, ns="other") for i in range(7)]
    config = config_from_dict({"policies": {"stormBreaker": {"threshold": 5}}})
    [finding] = of_type(findings(*objects, config=config), STORM)
    assert (finding.kind, finding.name, finding.count) == ("Pod", "", 7)
    assert finding.message.startswith(
        "7 pods without a controller in namespace other were rejected by the kubelet at admission "
        "and are still present (Failed)"
    )
    assert "pods of pods" not in finding.message


def test_a_single_rejected_pod_is_told_in_the_singular():
    config = config_from_dict({"policies": {"stormBreaker": {"threshold": 1}}})
    [finding] = of_type(findings(*storm(1), config=config), STORM)
    assert finding.message.startswith(
        "1 pod of Deployment default/web was rejected by the kubelet at admission and is still present"
    )


def test_below_the_storm_threshold_is_not_a_storm():
    assert of_type(findings(*storm(19)), STORM) == []
    assert len(of_type(findings(*storm(20)), STORM)) == 1


def test_the_storm_threshold_follows_the_storm_breaker_config():
    config = config_from_dict({"policies": {"stormBreaker": {"threshold": 5}}})
    assert audit.run_audit(inventory(), config, NOW).summary["stormThreshold"] == 5
    assert audit.run_audit(inventory(), Config(), NOW).summary["stormThreshold"] == 20


def test_container_failures_are_not_counted_as_a_storm():
    objects = storm(0)
    for i in range(30):
        p = owned(pod(f"crash-{i}", node_name="edge-1"), "ReplicaSet", "web-abc", "rs-1")
        p["status"] = {"phase": "Failed", "reason": "Error", "message": "container exited 1"}
        objects.append(p)
    assert of_type(findings(*objects), STORM) == []


def test_a_recent_storm_is_high_and_an_old_one_is_medium_damage():
    [running] = of_type(findings(*storm(25, created=at(30))), STORM)
    [over] = of_type(findings(*storm(25, created=at(86_400))), STORM)
    assert running.severity == "high" and "still running" in running.message
    assert over.severity == "medium" and "storm is over" in over.message


def test_the_storm_message_gives_first_and_last_time_and_the_rate():
    objects = storm(0) + [
        rejected(f"web-abc-{i}", ("ReplicaSet", "web-abc", "rs-1"), created=at(600 - i * 6))
        for i in range(25)
    ]
    [finding] = of_type(findings(*objects), STORM)
    assert f"first {at(600)}, last {at(600 - 24 * 6)}" in finding.message
    assert "(10.4 pods/min)" in finding.message  # 25 pods over 144 s


def test_job_pods_are_grouped_under_their_cron_job():
    cron = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "nightly", "namespace": "batch", "uid": "cron-1"},
        "spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}}},
    }
    jobs = [
        owned(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": f"nightly-{j}", "namespace": "batch", "uid": f"job-{j}"},
                "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}},
            },
            "CronJob",
            "nightly",
            "cron-1",
            "batch/v1",
        )
        for j in range(3)
    ]
    pods = [
        rejected(f"nightly-{j}-{i}", ("Job", f"nightly-{j}", f"job-{j}", "batch/v1"), ns="batch")
        for j in range(3)
        for i in range(10)
    ]
    [finding] = of_type(findings(cron, *jobs, *pods), STORM)
    assert (finding.kind, finding.name, finding.count) == ("CronJob", "nightly", 30)


def test_without_the_replica_set_in_the_snapshot_the_direct_owner_is_reported():
    objects = [rejected(f"web-abc-{i}", ("ReplicaSet", "web-abc", "rs-1")) for i in range(20)]
    [finding] = of_type(findings(*objects), STORM)
    assert (finding.kind, finding.name) == ("ReplicaSet", "web-abc")


# -- PinnedNodeName -----------------------------------------------------------------------


def pinned_deployment(node_name="edge-1", cpu="1"):
    spec = {
        "nodeName": node_name,
        "containers": [{"name": "app", "image": "img", "resources": {"requests": {"cpu": cpu}}}],
    }
    return with_uid(deployment(spec, "sensor"), "dep-s"), replica_set(
        "sensor-1", "rs-s", "sensor", "dep-s", spec
    )


def test_a_pinned_deployment_is_reported_once_with_the_kubelet_verdict_on_its_node():
    dep, rs = pinned_deployment(cpu="3")
    full = pod("busy", node_name="edge-1", requests={"cpu": "2"})
    [finding] = of_type(findings(node("edge-1", cpu="4"), full, dep, rs), PINNED)
    assert (finding.kind, finding.name, finding.node, finding.count) == ("Deployment", "sensor", "edge-1", 2)
    assert finding.severity == "high"
    assert "Node edge-1 would reject it: OutOfcpu" in finding.message


def test_a_pinned_workload_whose_node_has_room_is_medium():
    dep, rs = pinned_deployment(cpu="1")
    [finding] = of_type(findings(node("edge-1", cpu="4"), dep, rs), PINNED)
    assert finding.severity == "medium"
    assert "would admit one pod now" in finding.message


def test_a_pinned_workload_on_a_node_that_does_not_exist_is_high():
    dep, _ = pinned_deployment("gone")
    [finding] = of_type(findings(dep), PINNED)
    assert finding.severity == "high" and "not in the cluster state" in finding.message


def test_excluded_namespaces_and_policies_turned_off_are_not_audited():
    dep, _ = pinned_deployment()
    dep["metadata"]["namespace"] = "kube-system"
    assert of_type(findings(dep), PINNED) == []
    off = config_from_dict({"policies": {"pinnedNodeName": {"mode": "off"}}})
    assert of_type(findings(*pinned_deployment(), config=off), PINNED) == []


# -- node findings ------------------------------------------------------------------------

GPU = {"nvidia.com/gpu": "4"}


def gpu_pod(name, scheduler=None, count="1", **kw):
    return pod(name, node_name="gpu-1", requests={"nvidia.com/gpu": count}, scheduler=scheduler, **kw)


def test_two_schedulers_holding_one_device_on_a_node_are_reported_on_the_node():
    objects = [node("gpu-1", extra=GPU), gpu_pod("a"), gpu_pod("b", "volcano"), gpu_pod("c", "volcano")]
    [finding] = of_type(findings(*objects), MIXED)
    assert (finding.kind, finding.name, finding.node, finding.resource, finding.count) == (
        "Node",
        "gpu-1",
        "gpu-1",
        "nvidia.com/gpu",
        3,
    )
    assert "volcano (2 pods), default-scheduler (1 pod)" in finding.message
    assert finding.severity == "medium"  # 3 of 4 in use: not yet the last one


def test_one_scheduler_per_device_is_clean():
    objects = [node("gpu-1", extra=GPU), gpu_pod("a", "volcano"), gpu_pod("b", "volcano")]
    assert of_type(findings(*objects), MIXED) == []


def test_pods_whose_controller_pins_nodename_count_as_a_holder_of_their_own():
    spec = {
        "nodeName": "gpu-1",
        "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}],
    }
    dep = with_uid(deployment(spec, "pinned-gpu"), "dep-g")
    rs = replica_set("pinned-gpu-1", "rs-g", "pinned-gpu", "dep-g", spec)
    bypass = owned(gpu_pod("pinned-gpu-1-x"), "ReplicaSet", "pinned-gpu-1", "rs-g")
    objects = [node("gpu-1", extra=GPU), dep, rs, bypass, gpu_pod("scheduled", count="3")]
    [finding] = of_type(findings(*objects), MIXED)
    assert "pods that set spec.nodeName themselves (1 pod)" in finding.message
    assert finding.severity == "high"  # all four GPUs are allocated


def test_a_node_whose_pods_request_more_than_allocatable_is_overcommitted():
    objects = [node("gpu-1", extra={"nvidia.com/gpu": "2"}), gpu_pod("a", count="2"), gpu_pod("b")]
    [finding] = of_type(findings(*objects), OVERCOMMITTED)
    assert (finding.name, finding.resource, finding.count, finding.severity) == (
        "gpu-1",
        "nvidia.com/gpu",
        2,
        "high",
    )
    assert "request 3 nvidia.com/gpu, but only 2 is allocatable" in finding.message


def test_more_pods_than_the_node_allows_is_overcommitted_pods():
    objects = [node("n", pods="2"), *(pod(f"p{i}", node_name="n") for i in range(3))]
    [finding] = of_type(findings(*objects), OVERCOMMITTED)
    assert (finding.resource, finding.count) == ("pods", 3)


def test_a_node_that_fits_its_pods_is_clean():
    assert findings(node("n", cpu="4"), pod("p", node_name="n", requests={"cpu": "4"})) == []


# -- order, contract, exit codes ----------------------------------------------------------


def test_findings_come_worst_first():
    objects = [
        *storm(25, created=at(86_400)),  # medium, 25
        node("gpu-1", extra={"nvidia.com/gpu": "1"}),
        gpu_pod("a", count="2"),  # Overcommitted, high
    ]
    assert [(f.type, f.severity) for f in findings(*objects)] == [
        (OVERCOMMITTED, "high"),
        (STORM, "medium"),
    ]


def write_snapshot(tmp_path, *objects) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": list(objects)}))
    return str(path)


def run_audit(*args):
    return CliRunner().invoke(main, ["audit", *args])


def test_json_output_follows_the_contract_and_findings_exit_1(tmp_path):
    result = run_audit("--cluster", write_snapshot(tmp_path, node("n"), *storm(25)), "-o", "json")
    assert result.exit_code == 1, result.output
    body = json.loads(result.stdout)
    assert set(body) == {"findings", "summary"}
    [entry] = body["findings"]
    assert set(entry) == {
        "type",
        "severity",
        "namespace",
        "kind",
        "name",
        "node",
        "resource",
        "count",
        "message",
    }
    assert body["summary"]["byType"][STORM] == 1
    assert body["summary"]["scanned"]["rejectedPods"] == 25


def test_a_clean_cluster_exits_0(tmp_path):
    result = run_audit("--cluster", write_snapshot(tmp_path, node("n"), pod("p", node_name="n")))
    assert result.exit_code == 0, result.output
    assert "no findings" in result.stdout


def test_unusable_input_exits_2_and_names_file_and_field(tmp_path):
    bad = pod("p", node_name="n")
    bad["spec"]["priority"] = "high"
    path = write_snapshot(tmp_path, bad)
    result = run_audit("--cluster", path)
    assert result.exit_code == 2
    assert f"{path}: document 1, item 1: Pod: field spec.priority" in result.output
    assert run_audit().exit_code == 2  # no cluster at all


def test_text_output_has_one_table_per_type_worst_first(tmp_path):
    old_storm = storm(25, created="2020-01-01T00:00:00Z")
    objects = [*old_storm, node("gpu-1", extra={"nvidia.com/gpu": "1"}), gpu_pod("a", count="2")]
    # Judged long after the storm (by default, the snapshot's newest timestamp: during it).
    result = run_audit("--cluster", write_snapshot(tmp_path, *objects), "--now", "2026-01-01T00:00:00Z")
    lines = result.stdout.splitlines()
    # the overcommitted GPU node is high; the old storm is medium
    assert lines.index("Overcommitted (1)") < lines.index("AdmissionStorm (1)")
    header = lines[lines.index("AdmissionStorm (1)") + 1]
    assert header.split() == ["SEVERITY", "NAMESPACE", "KIND", "NAME", "NODE", "RESOURCE", "COUNT"]


def test_the_bundled_example_cluster_shows_its_mixed_scheduler_gpu_node():
    result = run_audit("--cluster", str(ROOT / "examples" / "cluster"), "-o", "json")
    assert result.exit_code == 1
    assert [(f["type"], f["name"]) for f in json.loads(result.stdout)["findings"]] == [(MIXED, "gpu-2")]


# -- PolicyReports ------------------------------------------------------------------------


def crd(kind):
    [document] = [d for d in yaml.safe_load_all(CRDS[kind].read_text()) if d]
    assert document["spec"]["names"]["kind"] == kind
    return document


def crd_schema(kind="ClusterPolicyReport"):
    [version] = crd(kind)["spec"]["versions"]
    assert version["name"] == "v1alpha2"
    return version["schema"]["openAPIV3Schema"]


def strict(schema):
    """A copy that rejects unknown field names: ``additionalProperties: false`` wherever
    ``properties`` is given and the schema neither sets ``additionalProperties`` nor keeps
    unknown fields. The API server prunes unknown fields silently, so a misspelled key in a
    report would be lost on apply without an error; this catches it here."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if "properties" in schema:
        out["properties"] = {name: strict(sub) for name, sub in schema["properties"].items()}
        if "additionalProperties" not in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    for keyword in ("items", "additionalProperties"):
        if isinstance(schema.get(keyword), dict):
            out[keyword] = strict(schema[keyword])
    return out


def validate(report):
    """Against the strict schema of the CRD for the report's kind, with the CRD's scope."""
    namespaced = crd(report["kind"])["spec"]["scope"] == "Namespaced"
    assert ("namespace" in report["metadata"]) == namespaced, report["metadata"]
    jsonschema.validate(report, strict(crd_schema(report["kind"])))


def policy_reports(tmp_path):
    objects = [*storm(25), *pinned_deployment(), node("edge-1"), node("gpu-1", extra={"nvidia.com/gpu": "1"})]
    objects.append(gpu_pod("a", count="2"))
    result = run_audit("--cluster", write_snapshot(tmp_path, *objects), "-o", "policyreport")
    assert result.exit_code == 1, result.output
    return list(yaml.safe_load_all(result.stdout))


def test_policy_reports_are_one_per_namespace_plus_a_cluster_report_for_nodes(tmp_path):
    reports = policy_reports(tmp_path)
    assert [(r["kind"], r["metadata"].get("namespace")) for r in reports] == [
        ("ClusterPolicyReport", None),
        ("PolicyReport", "default"),
    ]
    cluster, default = reports
    assert {r["rule"] for r in default["results"]} == {STORM, PINNED}
    assert [r["resources"][0]["kind"] for r in cluster["results"]] == ["Node"]
    assert all(r["source"] == "admit-guard" for report in reports for r in report["results"])
    assert default["summary"]["fail"] + default["summary"]["warn"] == 2


def test_each_policy_report_is_valid_against_the_strict_schema_of_its_own_crd(tmp_path):
    reports = policy_reports(tmp_path)
    assert {r["kind"] for r in reports} == set(CRDS)
    for report in reports:
        validate(report)


def test_the_two_crds_define_the_same_fields():
    """PolicyReport and ClusterPolicyReport share one Go type: a field one CRD knows and the
    other prunes would be lost from half the reports."""

    def fields(schema, path=""):
        names = {path}
        for name, sub in schema.get("properties", {}).items():
            names |= fields(sub, f"{path}.{name}")
        if isinstance(schema.get("items"), dict):
            names |= fields(schema["items"], f"{path}[]")
        return names

    assert fields(crd_schema("PolicyReport")) == fields(crd_schema("ClusterPolicyReport"))


def rename(obj, old, new):
    obj[new] = obj.pop(old)


MISTAKES = {
    "result field resourcez": lambda r: rename(r["results"][0], "resources", "resourcez"),
    "top-level field reslts": lambda r: rename(r, "results", "reslts"),
    "summary count fial": lambda r: rename(r["summary"], "fail", "fial"),
    "reference field nmae": lambda r: rename(r["results"][0]["resources"][0], "name", "nmae"),
    "property not a string": lambda r: r["results"][0]["properties"].update(count=25),
    "summary count a string": lambda r: r["summary"].update(fail="1"),
    "scored a string": lambda r: r["results"][0].update(scored="true"),
    "result outside the enum": lambda r: r["results"][0].update(result="failed"),
}


@pytest.mark.parametrize("kind", sorted(CRDS))
@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_the_strict_schema_catches_misspelled_fields_and_wrong_types(tmp_path, kind, mistake):
    [report] = [r for r in policy_reports(tmp_path) if r["kind"] == kind]
    validate(report)
    MISTAKES[mistake](report)
    with pytest.raises(jsonschema.ValidationError):
        validate(report)


def test_without_strictness_a_misspelled_field_would_pass_and_be_pruned(tmp_path):
    """Why the test derives a strict schema: the CRD's own schema accepts unknown fields."""
    [report] = [r for r in policy_reports(tmp_path) if r["kind"] == "PolicyReport"]
    MISTAKES["result field resourcez"](report)
    jsonschema.validate(report, crd_schema("PolicyReport"))  # accepted: the server would prune it


def test_the_crd_schema_rejects_what_it_does_not_know(tmp_path):
    report = policy_reports(tmp_path)[0]
    report["results"][0]["severity"] = "critical"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(report, crd_schema("ClusterPolicyReport"))


def test_a_clean_cluster_prints_an_empty_cluster_policy_report_that_clears_old_results(tmp_path):
    result = run_audit(
        "--cluster", write_snapshot(tmp_path, node("n"), pod("p", node_name="n")), "-o", "policyreport"
    )
    assert result.exit_code == 0, result.output
    [report] = list(yaml.safe_load_all(result.stdout))
    assert (report["kind"], report["metadata"]["name"]) == ("ClusterPolicyReport", audit.REPORT_NAME)
    assert report["results"] == []
    assert report["summary"] == {"pass": 0, "fail": 0, "warn": 0, "error": 0, "skip": 0}
    validate(report)


def test_namespace_findings_alone_still_come_with_the_cluster_report():
    report = audit.Report(of_type(findings(*storm(25)), STORM))
    cluster, default = audit.policy_reports(report, NOW)
    assert (cluster["kind"], cluster["results"]) == ("ClusterPolicyReport", [])
    assert (default["kind"], default["metadata"]["namespace"]) == ("PolicyReport", "default")


# -- live reads ---------------------------------------------------------------------------


class PagedApi:
    """Serves each resource in pages of ``limit``; list items carry no kind, like the API."""

    def __init__(self, objects: dict[str, list[dict]]) -> None:
        self.objects = objects
        self.requests: list[tuple[str, str]] = []

    def served_kinds(self, groups):
        return {}  # no custom resources served

    def serves(self, group_version):
        return "resourceclaims" in self.objects  # DRA where the test gives claims

    def list_page(self, resource, limit, token=""):
        self.requests.append((resource, token))
        items = self.objects.get(resource, [])
        start = int(token or 0)
        end = start + limit
        return Page(items[start:end], "1", str(end) if end < len(items) else "")


def bare(obj):
    return {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}


def test_a_live_read_pages_through_every_kind_and_stamps_their_kinds():
    objects = storm(25)
    api = PagedApi(
        {
            "deployments": [bare(objects[0])],
            "replicasets": [bare(objects[1])],
            "pods": [bare(p) for p in objects[2:]],
        }
    )
    inv = live_inventory(api, page_size=10)
    assert [t for t, token in api.requests if t == "pods"] == ["pods"] * 3
    assert {r for r, _ in api.requests} >= {
        "nodes",
        "pods",
        "deployments",
        "cronjobs",
        "replicationcontrollers",
    }
    [finding] = of_type(audit.run_audit(inv, Config(), NOW).findings, STORM)
    assert (finding.kind, finding.name) == ("Deployment", "web")


def test_a_live_read_lists_dra_where_served_and_its_claims_count_as_judged():
    api = PagedApi({"resourceclaims": [], "resourceslices": []})
    inv = live_inventory(api, page_size=10)
    assert {"resourceslices", "resourceclaims", "deviceclasses"} <= {r for r, _ in api.requests}
    assert ALREADY_ALLOCATED not in audit.unjudged(inv)
    assert ALREADY_ALLOCATED in audit.unjudged(live_inventory(PagedApi({}), page_size=10))


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_the_progress_line_appears_only_on_a_tty_after_a_second():
    clock = iter([0.0, 0.5, 1.5]).__next__
    stream = Tty()
    progress = Progress(stream, clock=clock)
    progress.update("pods", 500)
    assert stream.getvalue() == ""
    progress.update("pods", 1000)
    assert "reading pods: 1,000 objects" in stream.getvalue()
    quiet = io.StringIO()
    Progress(quiet, delay=0).update("pods", 1)
    assert quiet.getvalue() == ""


def _cluster_serving(resources: list[str]) -> fake_apiserver.Cluster:
    """The test API server's cluster, serving exactly ``resources``."""
    return fake_apiserver.Cluster(
        objects={r: {} for r in resources},
        log={r: [] for r in resources},
        floor={r: 0 for r in resources},
        faults={r: [] for r in resources},
    )


def _live_audit_json(cluster: fake_apiserver.Cluster, tmp_path):
    """``admit-guard audit --kubeconfig ... -o json`` against ``cluster`` served on loopback."""
    server = fake_apiserver.FakeApiServer(cluster)
    try:
        return run_audit("--kubeconfig", server.kubeconfig(tmp_path / "kubeconfig"), "-o", "json")
    finally:
        server.close()


def test_audit_kubeconfig_lists_every_kind_from_a_live_api_server(tmp_path, monkeypatch):
    from webhook.state.apiserver import RESOURCES
    from webhook.state.inventory import LIVE_RESOURCES

    for resource, kind, _ in LIVE_RESOURCES:
        monkeypatch.setitem(fake_apiserver.PATHS, RESOURCES[resource], resource)
        monkeypatch.setitem(fake_apiserver.LIST_KINDS, resource, f"{kind}List")
    resources = [r for r, _, _ in LIVE_RESOURCES]
    cluster = _cluster_serving(resources)
    objects = storm(25)
    cluster.load("deployments", [bare(objects[0])])
    cluster.load("replicasets", [bare(objects[1])])
    cluster.load("pods", [bare(p) for p in objects[2:]])
    result = _live_audit_json(cluster, tmp_path)
    assert result.exit_code == 1, result.output
    [finding] = json.loads(result.stdout)["findings"]
    assert (finding["type"], finding["kind"], finding["name"], finding["count"]) == (
        STORM,
        "Deployment",
        "web",
        25,
    )
    assert {r.split()[0] for r in cluster.requests} == set(resources)


def test_a_live_read_that_fails_exits_2_with_the_api_error(tmp_path):
    from tests.helpers.fake_apiserver import Cluster, FakeApiServer

    server = FakeApiServer(Cluster())  # serves nodes and pods only: deployments answer 404
    try:
        result = run_audit("--kubeconfig", server.kubeconfig(tmp_path / "kubeconfig"))
    finally:
        server.close()
    assert result.exit_code == 2
    assert "cannot list the cluster's objects: 404: deployments" in result.output


# -- grouping, for any ownership forest ---------------------------------------------------


@st.composite
def forests(draw):
    """parents[i] < i (or -1: no owner), so chains are acyclic; pods owned by any workload or none."""
    size = draw(st.integers(min_value=1, max_value=12))
    parents = [draw(st.integers(min_value=-1, max_value=i - 1)) for i in range(size)]
    pod_owners = draw(st.lists(st.integers(min_value=-1, max_value=size - 1), max_size=60))
    return parents, pod_owners


def workload_chain(parents):
    workloads = []
    for i, parent in enumerate(parents):
        rs = with_uid(replica_set(f"w{i}", f"w{i}", "-", "-"), f"w{i}")
        rs["metadata"].pop("ownerReferences")
        if parent >= 0:
            owned(rs, "ReplicaSet", f"w{parent}", f"w{parent}")
        workloads.append(rs)
    return workloads


@given(forests())
def test_every_rejected_pod_lands_in_one_group_under_the_root_of_its_chain(forest):
    parents, pod_owners = forest
    pods = [
        rejected(f"p{j}", ("ReplicaSet", f"w{o}", f"w{o}") if o >= 0 else None)
        for j, o in enumerate(pod_owners)
    ]
    groups = storms.storm_groups(inventory(*workload_chain(parents), *pods))
    placed = {p.name: (g.owner.uid if g.owner else None) for g in groups for p in g.pods}
    assert sum(g.count for g in groups) == len(pods)

    def root(i):
        while parents[i] >= 0:
            i = parents[i]
        return f"w{i}"

    assert placed == {f"p{j}": (root(o) if o >= 0 else None) for j, o in enumerate(pod_owners)}


def test_an_ownership_loop_ends_the_walk_instead_of_hanging():
    a, b = workload_chain([-1, 0])
    owned(a, "ReplicaSet", "w1", "w1")  # w0 -> w1 -> w0
    pods = [rejected(f"p{i}", ("ReplicaSet", "w0", "w0")) for i in range(3)]
    [group] = storms.storm_groups(inventory(a, b, *pods))
    assert group.owner.uid in {"w0", "w1"} and group.count == 3


def test_a_live_audit_lists_the_custom_resources_the_cluster_serves_and_skips_the_others(
    tmp_path, monkeypatch
):
    from webhook.state.apiserver import RESOURCES
    from webhook.state.inventory import LIVE_RESOURCES

    volcano_jobs = "/apis/batch.volcano.sh/v1alpha1/jobs"
    for resource, kind, _ in LIVE_RESOURCES:
        monkeypatch.setitem(fake_apiserver.PATHS, RESOURCES[resource], resource)
        monkeypatch.setitem(fake_apiserver.LIST_KINDS, resource, f"{kind}List")
    monkeypatch.setitem(fake_apiserver.PATHS, volcano_jobs, "volcano-jobs")
    monkeypatch.setitem(fake_apiserver.LIST_KINDS, "volcano-jobs", "JobList")
    # Volcano is installed; JobSet, Kubeflow, KubeRay, LWS and Trainer are not.
    monkeypatch.setitem(
        fake_apiserver.API_GROUPS, "batch.volcano.sh", ("batch.volcano.sh/v1alpha1", [("jobs", "Job")])
    )
    resources = [*(r for r, _, _ in LIVE_RESOURCES), "volcano-jobs"]
    cluster = _cluster_serving(resources)
    cluster.load("nodes", [bare(node("gpu-1", pods="1"))])
    cluster.load("pods", [bare(pod("busy", node_name="gpu-1"))])
    task = {
        "replicas": 2,
        "template": {"spec": {"nodeName": "gpu-1", "containers": [{"name": "c", "image": "i"}]}},
    }
    job = {
        "metadata": {"name": "train", "namespace": "ml", "uid": "vj-1"},
        "spec": {"tasks": [{"template": {"spec": {"containers": []}}}, task]},
    }
    cluster.load("volcano-jobs", [job])
    result = _live_audit_json(cluster, tmp_path)
    assert result.exit_code == 1, result.output
    [finding] = json.loads(result.stdout)["findings"]
    assert (finding["type"], finding["kind"], finding["name"], finding["node"], finding["count"]) == (
        PINNED,
        "Job",
        "train",
        "gpu-1",
        2,
    )
    assert (
        "Job ml/train (template spec.tasks[1].template) sets spec.tasks[1].template.spec.nodeName"
        in finding["message"]
    )
    assert "volcano-jobs list" in cluster.requests


def test_a_snapshot_audit_judges_every_pinned_template_of_a_custom_resource(tmp_path):
    job = yaml.safe_load((FIXTURES / "workloads" / "volcano-job.yaml").read_text())
    job["metadata"]["namespace"] = "ml"
    job["spec"]["tasks"][0]["template"]["spec"]["nodeName"] = "gpu-1"
    result = run_audit(
        "--cluster", write_snapshot(tmp_path, node("gpu-1", extra={"nvidia.com/gpu": "8"}), job), "-o", "json"
    )
    pinned = [f for f in json.loads(result.stdout)["findings"] if f["type"] == PINNED]
    assert sorted((f["kind"], f["name"], f["count"]) for f in pinned) == [
        ("Job", "test-job", 1),
        ("Job", "test-job", 6),
    ]
    assert all("(template spec.tasks[" in f["message"] for f in pinned)
