"""One verdict on every face (issue 29), through the installed console script: what ``check``,
``explain``, ``audit`` and ``test`` say agrees with what the server decides."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
import yaml

from tests.helpers.console import ENV, GOOD, NEXT_POD, NODE, STORM_POD, cli, on_a_terminal, write
from tests.helpers.dra_builders import claim, gpus, resource_slice, result
from tests.helpers.paths import ROOT

# -- 3. operators' kinds get NoClusterState like built-in controllers --------------------------

GPU_CONTAINERS = "[{name: t, image: t, resources: {limits: {nvidia.com/gpu: 1}}}]"
OPERATOR_GPU_WORKLOADS = {
    "PyTorchJob": f"""\
apiVersion: kubeflow.org/v1
kind: PyTorchJob
metadata: {{name: train, namespace: ml}}
spec:
  pytorchReplicaSpecs:
    Worker: {{replicas: 2, template: {{spec: {{containers: {GPU_CONTAINERS}}}}}}}
""",
    "VolcanoJob": f"""\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {{name: train, namespace: ml}}
spec:
  tasks: [{{name: w, replicas: 2, template: {{spec: {{containers: {GPU_CONTAINERS}}}}}}}]
""",
    "RayCluster": f"""\
apiVersion: ray.io/v1
kind: RayCluster
metadata: {{name: train, namespace: ml}}
spec:
  headGroupSpec: {{template: {{spec: {{containers: [{{name: h, image: h}}]}}}}}}
  workerGroupSpecs: [{{groupName: g, template: {{spec: {{containers: {GPU_CONTAINERS}}}}}}}]
""",
}


@pytest.mark.parametrize("kind", sorted(OPERATOR_GPU_WORKLOADS))
def test_without_a_cluster_an_operators_gpu_workload_warns_that_device_ownership_was_not_checked(kind):
    manifest = OPERATOR_GPU_WORKLOADS[kind]
    result = cli("check", "-f", "-", stdin=manifest)
    assert result.returncode == 0, result.stderr
    assert "[deviceScheduler] NoClusterState:" in result.stdout, result.stdout
    assert "device ownership was not checked" in result.stdout
    assert cli("check", "-f", "-", "--warnings-as-errors", stdin=manifest).returncode == 1


# -- 5. --now: what had not happened yet opens nothing; RFC 3339 means a time ------------------


def storm_snapshot(tmp_path) -> str:
    """A node and 25 pods of one ReplicaSet the kubelet rejected, 10:00:00-10:00:24 on 2026-01-01."""
    return write(tmp_path, "cluster.yaml", NODE + "".join("---\n" + STORM_POD.format(i=i) for i in range(25)))


def test_now_before_the_kubelets_rejections_opens_no_storm_breaker(tmp_path):
    snapshot = storm_snapshot(tmp_path)
    before = cli("check", "-f", "-", "--cluster", snapshot, "--now", "2026-01-01T09:00:00Z", stdin=NEXT_POD)
    assert before.returncode == 0, before.stdout
    assert "AdmissionStorm" not in before.stdout
    during = cli("check", "-f", "-", "--cluster", snapshot, "--now", "2026-01-01T10:00:30Z", stdin=NEXT_POD)
    assert during.returncode == 1 and "AdmissionStorm" in during.stdout


def test_the_audit_at_a_time_before_the_rejections_reports_no_storm(tmp_path):
    snapshot = storm_snapshot(tmp_path)
    result = cli("audit", "--cluster", snapshot, "--now", "2026-01-01T09:00:00Z", "-o", "json")
    body = json.loads(result.stdout)
    assert [f for f in body["findings"] if f["type"] == "AdmissionStorm"] == []


@pytest.mark.parametrize("value", ["2025-11-20", "2025-11-20T10:00:00", "2025-11-20 10:00"])
def test_now_that_is_not_an_rfc3339_date_time_with_offset_is_a_usage_error(tmp_path, value):
    for command in ("check", "audit"):
        args = ("-f", "-") if command == "check" else ()
        result = cli(command, *args, "--cluster", storm_snapshot(tmp_path), "--now", value, stdin=NEXT_POD)
        assert result.returncode == 2, (command, value, result.stdout)
        assert "not an RFC 3339 time" in result.stderr


# -- 7. an apiVersion the operator does not serve is an input error ---------------------------

VOLCANO_V1_JOB = """\
apiVersion: batch.volcano.sh/v1
kind: Job
metadata: {name: pinned, namespace: ml}
spec:
  tasks: [{name: w, replicas: 1, template: {spec: {nodeName: gpu-1, containers: [{name: c, image: c}]}}}]
"""


@pytest.mark.parametrize("command", ["check", "explain"])
def test_a_volcano_job_in_a_version_volcano_does_not_serve_is_an_input_error_naming_the_served_one(
    tmp_path, command
):
    path = write(tmp_path, "job.yaml", VOLCANO_V1_JOB)
    cluster = ("--cluster", write(tmp_path, "cluster.yaml", NODE)) if command == "explain" else ()
    result = cli(command, "-f", path, *cluster)
    assert result.returncode == 2, result.stdout
    [error] = [e for e in result.stderr.splitlines() if e.startswith("ERROR ")]
    assert error.startswith(f"ERROR {path}: document 1: Job: field apiVersion: ")
    assert "does not serve Job in batch.volcano.sh/v1" in error
    assert "use apiVersion: batch.volcano.sh/v1alpha1" in error


# -- 8. RayCronJob, DisaggregatedSet and Volcano's JobTemplate hold pod templates ---------------

PINNED_SPEC = "{nodeName: gpu-1, containers: [{name: c, image: c}]}"
FREE_SPEC = "{containers: [{name: c, image: c}]}"
NEW_WORKLOADS = {
    "RayCronJob": f"""\
apiVersion: ray.io/v1
kind: RayCronJob
metadata: {{name: nightly, namespace: ml}}
spec:
  schedule: "0 2 * * *"
  jobTemplate:
    entrypoint: python train.py
    rayClusterSpec:
      headGroupSpec: {{rayStartParams: {{}}, template: {{spec: {{containers: [{{name: h, image: h}}]}}}}}}
      workerGroupSpecs: [{{groupName: g, template: {{spec: {PINNED_SPEC}}}}}]
""",
    "DisaggregatedSet": f"""\
apiVersion: disaggregatedset.x-k8s.io/v1
kind: DisaggregatedSet
metadata: {{name: serve, namespace: ml}}
spec:
  roles:
    - name: prefill
      spec: {{leaderWorkerTemplate: {{size: 1, workerTemplate: {{spec: {FREE_SPEC}}}}}}}
    - name: decode
      spec: {{leaderWorkerTemplate: {{size: 1, workerTemplate: {{spec: {PINNED_SPEC}}}}}}}
""",
    "JobTemplate": f"""\
apiVersion: flow.volcano.sh/v1alpha1
kind: JobTemplate
metadata: {{name: step, namespace: ml}}
spec:
  tasks: [{{name: w, replicas: 1, template: {{spec: {PINNED_SPEC}}}}}]
""",
}
PINNED_AT = {
    "RayCronJob": "spec.jobTemplate.rayClusterSpec.workerGroupSpecs[0].template",
    "DisaggregatedSet": "spec.roles[1].spec.leaderWorkerTemplate.workerTemplate",
    "JobTemplate": "spec.tasks[0].template",
}


@pytest.mark.parametrize("kind", sorted(NEW_WORKLOADS))
def test_a_pinned_template_in_an_operators_newer_kind_is_denied_not_skipped(tmp_path, kind):
    result = cli(
        "check", "-f", "-", "--cluster", write(tmp_path, "cluster.yaml", NODE), stdin=NEW_WORKLOADS[kind]
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.startswith(f"DENY  {kind} ml/")
    assert "PinnedNodeName" in result.stdout and f"(template {PINNED_AT[kind]})" in result.stdout


# -- 1. the audit reads ResourceSlices and ResourceClaims from a snapshot ----------------------


def dra_snapshot(tmp_path, *claims: dict) -> str:
    """Node node-1 with one DRA GPU (gpu-0) in a ResourceSlice, and ``claims``."""
    node = NODE.replace("gpu-1", "node-1")
    objects = [resource_slice(devices=gpus("gpu-0")), *claims]
    return write(tmp_path, "dra.yaml", node + "".join("---\n" + yaml.safe_dump(o) for o in objects))


def test_the_audit_of_a_snapshot_finds_two_claims_holding_the_same_dra_device(tmp_path):
    twice = [claim(name, results=[result("gpu-0")], reserved_for=[f"{name}-pod"]) for name in ("a", "b")]
    snapshot = dra_snapshot(tmp_path, *twice)
    junit = tmp_path / "audit.xml"
    result_ = cli("audit", "--cluster", snapshot, "-o", "json", "--junit", str(junit))
    assert result_.returncode == 1, result_.stderr
    findings = [f for f in json.loads(result_.stdout)["findings"] if f["type"] == "DeviceAlreadyAllocated"]
    assert (
        len(findings) == 1 and "default/a" in findings[0]["message"] and "default/b" in findings[0]["message"]
    )
    [suite] = [s for s in ET.parse(junit).getroot() if s.get("name") == "DeviceAlreadyAllocated"]
    assert suite.get("failures") == "1"


def test_the_audit_of_a_snapshot_without_resource_claims_says_device_findings_were_not_judged(tmp_path):
    result_ = cli("audit", "--cluster", dra_snapshot(tmp_path), "-o", "json")
    not_judged = json.loads(result_.stdout)["summary"]["notJudged"]
    assert "DeviceAlreadyAllocated" in not_judged and "ResourceClaims" in not_judged["DeviceAlreadyAllocated"]


# -- 2. explain honours DRA claims (kube-scheduler's DynamicResources filter) ------------------

DRA_POD = """\
apiVersion: v1
kind: Pod
metadata: {name: infer, namespace: default}
spec:
  resourceClaims: [{name: gpu, resourceClaimTemplateName: one-gpu}]
  containers: [{name: c, image: c, resources: {claims: [{name: gpu}]}}]
"""


def two_node_dra_snapshot(tmp_path) -> str:
    """node-1 with a free DRA GPU in a ResourceSlice, node-2 without any."""
    nodes = NODE.replace("gpu-1", "node-1") + "---\n" + NODE.replace("gpu-1", "node-2")
    objects = [resource_slice(devices=gpus("gpu-0"))]
    return write(tmp_path, "dra.yaml", nodes + "".join("---\n" + yaml.safe_dump(o) for o in objects))


def test_explain_says_a_dra_pod_fits_no_node_without_devices_for_its_claims(tmp_path):
    result_ = cli(
        "explain", "-f", "-", "--cluster", two_node_dra_snapshot(tmp_path), "-o", "json", stdin=DRA_POD
    )
    assert result_.returncode == 0, result_.stderr
    [explained] = json.loads(result_.stdout)["results"]
    nodes = {n["node"]: n for n in explained["nodes"]}
    assert nodes["node-1"]["fits"]
    assert not nodes["node-2"]["fits"] and nodes["node-2"]["scheduler"] == ["cannot allocate all claims"]


def test_explain_says_a_pod_reusing_an_allocated_claim_fits_only_the_claims_node(tmp_path):
    snapshot = dra_snapshot(tmp_path, claim("shared", results=[result("gpu-0")], reserved_for=["other"]))
    snapshot_2 = write(tmp_path, "node-2.yaml", NODE.replace("gpu-1", "node-2"))
    pod = DRA_POD.replace("resourceClaimTemplateName: one-gpu", "resourceClaimName: shared")
    result_ = cli(
        "explain", "-f", "-", "--cluster", snapshot, "--cluster", snapshot_2, "-o", "json", stdin=pod
    )
    nodes = {n["node"]: n for n in json.loads(result_.stdout)["results"][0]["nodes"]}
    assert nodes["node-1"]["fits"]
    assert nodes["node-2"]["scheduler"] == ["resourceclaim not available on the node"]


# -- 4. "fits on now" honours device ownership and DRA -----------------------------------------

POOLS = """\
policies:
  deviceScheduler:
    owners:
      - {resource: nvidia.com/gpu, scheduler: volcano, nodeSelector: {matchLabels: {pool: batch}}}
      - {resource: nvidia.com/gpu, scheduler: default-scheduler, nodeSelector: {matchLabels: {pool: serve}}}
"""


def gpu_node(name: str, pool: str, gpus_: int) -> str:
    return (
        f"apiVersion: v1\nkind: Node\nmetadata: {{name: {name}, labels: {{pool: {pool}}}}}\n"
        f"status: {{allocatable: {{cpu: '8', memory: 64Gi, pods: '110', nvidia.com/gpu: '{gpus_}'}}}}\n"
    )


def test_fits_on_now_never_suggests_a_node_another_scheduler_owns(tmp_path):
    nodes = "---\n".join(
        [gpu_node("batch-1", "batch", 8), gpu_node("serve-full", "serve", 0), gpu_node("serve-2", "serve", 8)]
    )
    snapshot = write(tmp_path, "pools.yaml", nodes)
    config = write(tmp_path, "guard.yaml", POOLS)
    pinned = (
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: ml}\nspec:\n  template:\n"
        "    spec:\n      nodeName: serve-full\n"
        "      containers: [{name: c, image: c, resources: {limits: {nvidia.com/gpu: 1}}}]\n"
    )
    result_ = cli("check", "-f", "-", "--cluster", snapshot, "--config", config, stdin=pinned)
    assert "Nodes it fits on now: serve-2." in result_.stdout, result_.stdout


def test_fits_on_now_never_suggests_a_node_without_devices_for_a_dra_pods_claims(tmp_path):
    full = NODE.replace("gpu-1", "node-3").replace("pods: '110'", "pods: '0'")
    snapshot = two_node_dra_snapshot(tmp_path)
    extra = write(tmp_path, "node-3.yaml", full)
    deployment = (
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: infer, namespace: default}\nspec:\n"
        "  template:\n    spec:\n      nodeName: node-3\n"
        "      resourceClaims: [{name: gpu, resourceClaimTemplateName: one-gpu}]\n"
        "      containers: [{name: c, image: c, resources: {claims: [{name: gpu}]}}]\n"
    )
    result_ = cli("check", "-f", "-", "--cluster", snapshot, "--cluster", extra, stdin=deployment)
    assert "Node node-3 would reject it" in result_.stdout, result_.stdout
    assert "Nodes it fits on now: node-1." in result_.stdout


def pools_snapshot(tmp_path) -> str:
    nodes = [
        gpu_node("batch-1", "batch", 8),
        gpu_node("serve-full", "serve", 0),
        gpu_node("serve-2", "serve", 8),
    ]
    return write(tmp_path, "pools.yaml", "---\n".join(nodes))


GPU_WEB = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: ml, uid: d-1}
spec:
  template:
    spec:
      nodeName: serve-full
      containers: [{name: c, image: c, resources: {limits: {nvidia.com/gpu: 1}}}]
"""


def test_explain_never_says_a_pod_fits_a_node_another_scheduler_owns(tmp_path):
    config = write(tmp_path, "guard.yaml", POOLS)
    result_ = cli(
        "explain", "-f", "-", "--cluster", pools_snapshot(tmp_path), "--config", config, stdin=GPU_WEB
    )
    assert "1/3 nodes fit" in result_.stdout, result_.stdout
    [batch] = [line for line in result_.stdout.splitlines() if line.strip().startswith("batch-1")]
    assert "MixedDeviceScheduler: nvidia.com/gpu on batch-1 is handed out by volcano" in batch


def test_the_audits_fits_on_now_never_suggests_a_node_another_scheduler_owns(tmp_path):
    workload = write(tmp_path, "web.yaml", GPU_WEB)
    snapshot = pools_snapshot(tmp_path)
    config = write(tmp_path, "guard.yaml", POOLS)
    result_ = cli("audit", "--cluster", snapshot, "--cluster", workload, "--config", config, "-o", "json")
    [pinned] = [f for f in json.loads(result_.stdout)["findings"] if f["type"] == "PinnedNodeName"]
    assert "Nodes it fits on now: serve-2." in pinned["message"]


# -- 6. a pinned pod reusing a claim allocated on another node -------------------------------


def test_a_pinned_pod_reusing_a_claim_allocated_elsewhere_is_told_the_claims_node_or_a_new_claim(tmp_path):
    snapshot = dra_snapshot(tmp_path, claim("shared", results=[result("gpu-0")], reserved_for=["other"]))
    node_2 = write(tmp_path, "node-2.yaml", NODE.replace("gpu-1", "node-2"))
    pod = DRA_POD.replace("resourceClaimTemplateName: one-gpu", "resourceClaimName: shared").replace(
        "spec:\n", "spec:\n  nodeName: node-2\n", 1
    )
    result_ = cli("check", "-f", "-", "--cluster", snapshot, "--cluster", node_2, stdin=pod)
    assert result_.returncode == 1 and "FailedPrepareDynamicResources" in result_.stdout, result_.stdout
    assert "metadata.name=node-2" not in result_.stdout
    assert "allocated on node-1" in result_.stdout and "a new claim" in result_.stdout


# -- smaller things ---------------------------------------------------------------------------


def test_test_run_that_selects_no_case_exits_2_saying_so():
    suite = str(ROOT / "examples" / "policy-test")
    result_ = cli("test", suite, "--run", "nomatch")
    assert result_.returncode == 2, result_.stdout + result_.stderr
    assert "--run 'nomatch' selects none of the" in result_.stdout + result_.stderr
    assert cli("test", suite).returncode == 0


def test_a_snapshot_with_a_storm_leaves_no_log_line_on_stderr(tmp_path):
    result_ = cli("check", "-f", "-", "--cluster", storm_snapshot(tmp_path), stdin=pod_of_another_owner())
    assert result_.returncode == 0, result_.stdout
    assert "storm breaker" not in result_.stderr, result_.stderr


def pod_of_another_owner() -> str:
    return (
        "apiVersion: v1\nkind: Pod\nmetadata: {name: other, namespace: ml}\n"
        "spec: {containers: [{name: c, image: c}]}\n"
    )


def test_a_misspelt_config_field_suggests_the_right_spelling(tmp_path):
    config = write(tmp_path, "guard.yaml", "policies:\n  stormbreaker: {mode: warn}\n")
    result_ = cli("check", "-f", "-", "--config", config, stdin=pod_of_another_owner())
    assert result_.returncode == 2
    assert "policies.stormbreaker: unknown field: did you mean stormBreaker?" in result_.stderr, (
        result_.stderr
    )


def test_make_deploy_render_writes_only_yaml_on_stdout(tmp_path):
    """``make deploy-render > out.yaml`` must be applyable: make's echo and the certificate
    step's chatter go elsewhere. Run on a copy, so the repository's certs are left alone."""
    shutil.copytree(ROOT / "deploy", tmp_path / "deploy", ignore=shutil.ignore_patterns("certs"))
    shutil.copy(ROOT / "Makefile", tmp_path)
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    stamp = tmp_path / "installed"
    stamp.touch()
    venv = Path(sys.executable).parent.parent
    rendered = subprocess.run(
        [
            "make",
            "-C",
            str(tmp_path),
            "--no-print-directory",
            f"VENV={venv}",
            f"STAMP={stamp}",
            "deploy-render",
        ],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
        check=False,
    )
    assert rendered.returncode == 0, rendered.stderr
    kinds = {d["kind"] for d in yaml.safe_load_all(rendered.stdout) if d}
    assert {"Deployment", "ValidatingWebhookConfiguration"} <= kinds


@pytest.mark.parametrize("option", ["--workers", "--threads", "--max-body-bytes", "--log-level"])
def test_every_serve_option_says_what_it_does(option):
    helptext = cli("serve", "--help").stdout
    entry = re.search(rf"^  {option} .*?(?=^  -)", helptext, re.S | re.M).group()
    words = re.sub(r"\[[^]]*\]|\{[^}]*\}|INTEGER RANGE|" + option, "", entry).split()
    assert len(words) >= 3, entry


def test_the_judged_at_line_fits_an_80_column_terminal():
    lines = on_a_terminal(
        "check", "-f", GOOD, "--cluster", str(ROOT / "examples" / "cluster"), stream="stderr"
    ).splitlines()
    judged = [line for line in lines if line.startswith("judged at")]
    assert judged and all(len(line) <= 80 for line in lines), lines


def test_a_pod_that_fits_no_gpu_node_is_told_how_many_nodes_offer_gpus():
    pinned = str(ROOT / "examples" / "workloads" / "pod-pinned-to-full-gpu-node.yaml")
    result_ = cli("check", "-f", pinned, "--cluster", str(ROOT / "examples" / "cluster"))
    assert "It fits on none of the 2 nodes with nvidia.com/gpu now." in result_.stdout, result_.stdout
    assert "first 2 of 7" not in result_.stdout


def test_a_raycluster_is_told_the_template_field_that_holds_its_scheduler_name(tmp_path):
    config = write(
        tmp_path, "guard.yaml", POOLS.split("      - {resource: nvidia.com/gpu, scheduler: default")[0]
    )
    result_ = cli("check", "-f", "-", "--config", config, stdin=OPERATOR_GPU_WORKLOADS["RayCluster"])
    assert result_.returncode == 1, result_.stdout + result_.stderr
    assert "Set spec.workerGroupSpecs[0].template.spec.schedulerName: volcano." in result_.stdout, (
        result_.stdout
    )
    assert "Set spec.schedulerName" not in result_.stdout


def test_concatenated_yaml_without_a_separator_is_told_of_the_missing_dashes(tmp_path):
    joined = pod_of_another_owner() + pod_of_another_owner().replace("other", "second")
    result_ = cli("check", "-f", write(tmp_path, "joined.yaml", joined))
    assert result_.returncode == 2
    assert "duplicate key 'apiVersion'" in result_.stderr
    assert "a second object with no '---' line before it" in result_.stderr, result_.stderr


def test_a_pinned_template_of_an_operators_kind_names_its_nodename_field_as_people_write_it(tmp_path):
    result_ = cli(
        "check",
        "-f",
        "-",
        "--cluster",
        write(tmp_path, "cluster.yaml", NODE),
        stdin=NEW_WORKLOADS["JobTemplate"],
    )
    assert "sets spec.tasks[0].template.spec.nodeName to 'gpu-1'" in result_.stdout, result_.stdout


def test_the_warn_mode_rollout_config_warns_for_every_policy(tmp_path):
    """deploy/base/config.yaml is "roll out in warn mode": a storm is a warning, not a denial."""
    from webhook.config import load_config
    from webhook.policies.registry import POLICIES

    shipped = load_config(str(ROOT / "deploy" / "base" / "config.yaml"))
    assert {p.NAME: shipped.policy(p.NAME).mode for p in POLICIES} == {p.NAME: "warn" for p in POLICIES}
    config = str(ROOT / "deploy" / "base" / "config.yaml")
    storm = cli("check", "-f", "-", "--cluster", storm_snapshot(tmp_path), "--config", config, stdin=NEXT_POD)
    assert storm.returncode == 0 and "AdmissionStorm" in storm.stdout, storm.stdout + storm.stderr


def test_a_pinned_pod_of_the_owning_scheduler_is_told_to_drop_the_pin_not_to_set_its_own_scheduler(tmp_path):
    config = write(tmp_path, "guard.yaml", POOLS)
    pinned = GPU_WEB.replace("nodeName: serve-full", "nodeName: batch-1\n      schedulerName: volcano")
    result_ = cli("check", "-f", "-", "--cluster", pools_snapshot(tmp_path), "--config", config, stdin=pinned)
    assert "bypassing every scheduler" in result_.stdout, result_.stdout
    assert "set spec.schedulerName: volcano" not in result_.stdout
    assert "Drop spec.template.spec.nodeName: volcano, its scheduler, places it" in result_.stdout
