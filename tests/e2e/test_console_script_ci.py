"""The CLI on a real repository and a real snapshot (issue 22), through the installed console
script: it says what it did not check, and it fits into CI."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
from xml.etree import ElementTree as ET

import pytest

from tests.helpers.console import ENV, GOOD, NEXT_POD, NODE, SCRIPT, STORM_POD, cli, on_a_terminal, write
from tests.helpers.paths import EXAMPLES, ROOT

CLUSTER = str(EXAMPLES / "cluster")
GPU_DEPLOYMENT = """\
apiVersion: apps/v1
kind: Deployment
metadata: {name: train, namespace: ml}
spec:
  template:
    spec:
      containers: [{name: t, image: t, resources: {limits: {nvidia.com/gpu: 1}}}]
"""


def pod(name: str, extra: str = "", namespace: str = "ml") -> str:
    return (
        f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {namespace}}}\n"
        f"spec: {{containers: [{{name: c, image: c{extra}}}]}}\n"
    )


# -- 1. snapshots are validated ---------------------------------------------------------------


def test_a_manifest_given_as_the_snapshot_is_an_input_error_naming_what_it_holds():
    result = cli("check", "-f", GOOD, "--cluster", GOOD)
    assert result.returncode == 2
    assert "holds no Node (only 1 Deployment)" in result.stderr
    assert "kubectl get nodes,pods -A -o yaml" in result.stderr
    audit = cli("audit", "--cluster", GOOD)
    assert audit.returncode == 2 and "holds no Node" in audit.stderr


def test_a_snapshot_with_nodes_but_no_pods_is_a_warning_that_fails_with_warnings_as_errors(tmp_path):
    nodes = write(tmp_path, "nodes.yaml", NODE)
    result = cli("check", "-f", GOOD, "--cluster", nodes)
    assert result.returncode == 0, result.stderr
    assert "WARNING the cluster snapshot has 1 nodes but no pods" in result.stderr
    assert "kubectl get nodes,pods -A -o yaml" in result.stderr
    assert cli("check", "-f", GOOD, "--cluster", nodes, "--warnings-as-errors").returncode == 1


def test_pods_on_nodes_the_snapshot_lacks_are_a_warning_naming_them(tmp_path):
    bound = pod("p").replace("spec: {", "spec: {nodeName: gpu-9, ")
    snapshot = write(tmp_path, "cluster.yaml", NODE + "---\n" + bound)
    result = cli("check", "-f", GOOD, "--cluster", snapshot, "-o", "json")
    [warning] = json.loads(result.stdout)["cluster"]["warnings"]
    assert "1 pods in the cluster snapshot are bound to 1 nodes it lacks (gpu-9)" in warning


def test_a_kubectl_get_table_is_refused_with_the_output_flag_to_use(tmp_path):
    table = write(
        tmp_path,
        "nodes.txt",
        "NAME    STATUS   ROLES    AGE   VERSION\ngpu-1   Ready    <none>   5d    v1.35.0\n",
    )
    result = cli("check", "-f", GOOD, "--cluster", table)
    assert result.returncode == 2
    assert "a 'kubectl get' table, not objects: take it with -o yaml or -o json" in result.stderr


def test_the_audit_says_what_it_scanned_and_which_finding_types_it_could_not_judge():
    result = cli("audit", "--cluster", CLUSTER)
    assert "scanned 7 nodes, 35 pods (0 rejected by the kubelet), 0 workloads; judged at " in result.stderr
    assert "not judged: PinnedNodeName: no workloads were read" in result.stderr
    assert "not judged: AdmissionStorm, TopologyRejectedPods: no Failed pods were read" in result.stderr
    summary = json.loads(cli("audit", "--cluster", CLUSTER, "-o", "json").stdout)["summary"]
    failed_pods = {"AdmissionStorm", "TopologyRejectedPods"}
    assert set(summary["notJudged"]) == {"PinnedNodeName", *failed_pods}  # it has DRA claims
    without_dra = [arg for name in ("nodes.yaml", "pods.yaml") for arg in ("--cluster", f"{CLUSTER}/{name}")]
    summary = json.loads(cli("audit", *without_dra, "-o", "json").stdout)["summary"]
    devices = {"DeviceAlreadyAllocated", "DeviceCapacityExceeded", "DeviceCountersExceeded"}
    assert set(summary["notJudged"]) == {"PinnedNodeName", *failed_pods, *devices}
    stderr = cli("audit", *without_dra).stderr
    assert f"not judged: {', '.join(sorted(devices))}: no ResourceClaims were read" in stderr


# -- 2. a check skipped for lack of state is a warning naming it ------------------------------


def test_without_a_cluster_a_gpu_deployment_warns_that_device_ownership_was_not_checked():
    result = cli("check", "-f", "-", stdin=GPU_DEPLOYMENT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("WARN  Deployment ml/train")
    assert "[deviceScheduler] NoClusterState:" in result.stdout
    assert "device ownership was not checked" in result.stdout
    assert cli("check", "-f", "-", "--warnings-as-errors", stdin=GPU_DEPLOYMENT).returncode == 1


def test_without_a_cluster_template_sysctls_and_storm_owners_warn_naming_their_check():
    sysctls = (
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: tuned, namespace: web}\nspec:\n"
        "  template:\n    spec:\n"
        "      securityContext: {sysctls: [{name: net.core.somaxconn, value: '1024'}]}\n"
        "      containers: [{name: c, image: c}]\n"
    )
    owned = pod("trainer-x").replace(
        "namespace: ml}",
        "namespace: ml, ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, "
        "name: trainer, uid: rs-1, controller: true}]}",
    )
    result = cli("check", "-f", "-", stdin=sysctls + "---\n" + owned)
    assert "[nodeAdmission] NoClusterState:" in result.stdout and "sysctl allowlists" in result.stdout
    assert "[stormBreaker] NoClusterState:" in result.stdout and "admission storms" in result.stdout


# -- 3. exemptions show -----------------------------------------------------------------------


def test_exempted_and_excluded_objects_are_exempt_in_text_and_name_the_rule_in_json(tmp_path):
    config = write(
        tmp_path, "guard.yaml", "excludedNamespaces: [kube-system]\nexemptions: [{namespaces: [ml]}]\n"
    )
    manifest = pod("a") + "---\n" + pod("b", namespace="kube-system") + "---\n" + pod("c", namespace="web")
    result = cli("check", "-f", "-", "--config", config, stdin=manifest)
    lines = result.stdout.splitlines()
    assert lines[0].startswith("EXEMPT Pod ml/a") and "exemptions[0]" in lines[1]
    assert lines[2].startswith("EXEMPT Pod kube-system/b") and "by excludedNamespaces" in lines[3]
    assert lines[4].startswith("ALLOW Pod web/c")
    body = json.loads(cli("check", "-f", "-", "--config", config, "-o", "json", stdin=manifest).stdout)
    assert [r["exempted"] and r["exempted"]["by"] for r in body["results"]] == [
        "exemptions[0]", "excludedNamespaces", None,
    ]  # fmt: skip
    assert body["summary"]["exempted"] == 2


# -- 4. what the API server does not serve or refuses ------------------------------------------


@pytest.mark.parametrize(
    ("api_version", "kind", "names"),
    [
        ("extensions/v1beta1", "Deployment", ["removed in Kubernetes 1.16", "use apiVersion: apps/v1"]),
        ("apps/v1beta9", "Deployment", ["does not serve Deployment in apps/v1beta9", "apps/v1"]),
        ("apps/v1", "deployment", ["kinds are case-sensitive", "did you mean Deployment"]),
    ],
)
def test_unserved_versions_and_lower_case_kinds_are_input_errors_naming_the_right_one(
    api_version, kind, names
):
    manifest = GPU_DEPLOYMENT.replace("apps/v1", api_version, 1).replace("kind: Deployment", f"kind: {kind}")
    result = cli("check", "-f", "-", stdin=manifest)
    assert result.returncode == 2
    assert all(name in result.stderr for name in names), result.stderr


def test_unknown_kinds_stay_skipped():
    result = cli(
        "check", "-f", "-", "-v", stdin="apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n"
    )
    assert result.returncode == 0 and result.stdout.startswith("SKIP  Widget w")


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        (
            "{limits: {nvidia.com/gpu: 0.5}}",
            "limits[nvidia.com/gpu]: Invalid value: '0.5': must be an integer",
        ),
        (
            "{requests: {nvidia.com/gpu: 1}, limits: {nvidia.com/gpu: 2}}",
            "requests: Invalid value: '1': must be equal to nvidia.com/gpu limit of 2",
        ),
        (
            "{requests: {nvidia.com/gpu: 1}}",
            "limits: Required value: Limit must be set for non overcommitable",
        ),
    ],
)
def test_extended_resources_the_api_server_refuses_are_input_errors(resources, message):
    result = cli("check", "-f", "-", stdin=pod("gpu", f", resources: {resources}"))
    assert result.returncode == 2
    assert f"field spec.containers[0].resources.{message}" in result.stderr


# -- 5. templates left unrendered ---------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ['"{{ .Release.Name }}-web"', "{{ .Release.Name }}"], ids=["quoted", "unquoted"]
)
def test_an_unrendered_helm_template_is_an_input_error_saying_to_run_helm_template(name):
    result = cli("check", "-f", "-", stdin=pod("x").replace("name: x", f"name: {name}"))
    assert result.returncode == 2
    assert "'{{ .Release.Name }}" in result.stderr and "helm template" in result.stderr
    assert "ALLOW" not in result.stdout


# -- 6. --now ----------------------------------------------------------------------------------


def test_now_pins_the_storm_verdict_which_defaults_to_the_snapshot_time(tmp_path):
    snapshot = write(
        tmp_path, "cluster.yaml", NODE + "".join("---\n" + STORM_POD.format(i=i) for i in range(25))
    )
    during = cli("check", "-f", "-", "--cluster", snapshot, stdin=NEXT_POD)
    assert during.returncode == 1 and "AdmissionStorm" in during.stdout
    assert "judged at 2026-01-01T10:00:24Z (the snapshot's newest timestamp" in during.stderr
    later = cli(
        "check",
        "-f",
        "-",
        "--cluster",
        snapshot,
        "--now",
        "2026-01-02T00:00:00Z",
        "-o",
        "json",
        stdin=NEXT_POD,
    )
    body = json.loads(later.stdout)
    assert later.returncode == 0 and body["cluster"]["judgedAt"] == "2026-01-02T00:00:00Z"
    severities = {
        now: json.loads(cli("audit", "--cluster", snapshot, "--now", now, "-o", "json").stdout)["findings"][
            0
        ]["severity"]
        for now in ("2026-01-01T10:01:00Z", "2026-01-02T00:00:00Z")
    }
    assert severities == {"2026-01-01T10:01:00Z": "high", "2026-01-02T00:00:00Z": "medium"}
    assert "not an RFC 3339 time" in cli("audit", "--cluster", snapshot, "--now", "yesterday").stderr


# -- 7. fits into CI ---------------------------------------------------------------------------


def test_namespace_flag_places_objects_that_name_none_and_refuses_others():
    bare = pod("p").replace(", namespace: ml", "")
    assert cli("check", "-f", "-", stdin=bare).stdout.startswith("ALLOW Pod default/p")
    assert cli("check", "-f", "-", "-n", "team", stdin=bare).stdout.startswith("ALLOW Pod team/p")
    other = cli("check", "-f", "-", "-n", "team", stdin=pod("q"))
    assert other.returncode == 2 and "'ml' does not match the namespace 'team' given with -n" in other.stderr


def test_exclude_leaves_out_files_under_a_directory(tmp_path):
    (tmp_path / "charts").mkdir()
    write(tmp_path, "app.yaml", pod("app"))
    write(tmp_path / "charts", "broken.yaml", "{{ .Values }}: [\n")
    write(tmp_path, "x.test.yaml", "kind: PolicyTest\n")
    result = cli("check", "-f", str(tmp_path), "--exclude", "charts", "--exclude", "*.test.yaml")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ALLOW Pod ml/app") and "1 objects" in result.stderr


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl renders -k")
def test_kustomize_renders_a_kustomization_through_kubectl():
    result = cli("check", "-k", str(ROOT / "deploy" / "base"), "-v")
    assert result.returncode == 0, result.stderr
    assert (
        "ALLOW Deployment admit-guard/admit-guard  (deploy/base (kubectl kustomize): document"
        in result.stdout.replace(str(ROOT) + "/", "")
    )


def test_kustomize_without_kubectl_is_an_input_error_that_says_so(tmp_path):
    env = {**ENV, "PATH": str(tmp_path)}  # no kubectl here
    result = subprocess.run(
        [str(SCRIPT), "check", "-k", str(ROOT / "deploy" / "base")],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert result.returncode == 2
    assert "-k needs kubectl on PATH" in result.stderr and "kustomize build" in result.stderr


def test_junit_has_one_case_per_object_and_per_finding(tmp_path):
    report = tmp_path / "check.xml"
    manifest = pod("ok") + "---\n" + pod("pinned").replace("spec: {", "spec: {nodeName: nowhere, ")
    result = cli(
        "check", "-f", "-", "--cluster", CLUSTER, "--junit", str(report), stdin=manifest + "---\nkind: x\n"
    )
    assert result.returncode == 2
    root = ET.parse(report).getroot()
    assert (root.tag, root.get("tests"), root.get("failures"), root.get("errors")) == (
        "testsuites",
        "3",
        "1",
        "1",
    )
    cases = root.findall("./testsuite/testcase")
    assert [c.find("failure") is not None for c in cases] == [False, True, False]
    assert "UnknownNode" in cases[1].find("failure").text
    audit = tmp_path / "audit.xml"
    assert cli("audit", "--cluster", CLUSTER, "--junit", str(audit)).returncode == 1
    suites = {s.get("name"): s for s in ET.parse(audit).getroot()}
    assert suites["MixedDeviceScheduler"].get("failures") == "1"
    assert suites["PinnedNodeName"].find("testcase/skipped") is not None  # not judged: no workloads


def test_skip_lines_are_collapsed_into_the_summary_unless_verbose():
    manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\n" + pod("p")
    quiet = cli("check", "-f", "-", stdin=manifest)
    assert "SKIP" not in quiet.stdout
    assert "(skipped: ConfigMap 1; -v lists them)" in quiet.stderr
    assert "SKIP  ConfigMap default/c" in cli("check", "-f", "-", "-v", stdin=manifest).stdout


def test_messages_are_wrapped_on_a_terminal_and_whole_in_json():
    pinned = str(EXAMPLES / "workloads" / "incident-1-pinned-deployment.yaml")
    text = on_a_terminal("check", "-f", pinned, "--cluster", CLUSTER, columns=60)
    message_lines = [line for line in text.splitlines() if line.startswith("  ")]
    assert len(message_lines) > 3 and all(len(line) <= 60 for line in message_lines)
    [result] = json.loads(cli("check", "-f", pinned, "--cluster", CLUSTER, "-o", "json").stdout)["results"]
    message = result["violations"][0]["message"]
    assert "\n" not in message and len(message) > 200


# -- 8. YAML snapshots as fast as JSON ----------------------------------------------------------


# Measured from a small intermediate process: a child forked from pytest counts pytest's pages
# in its peak RSS until it execs.
_MEASURE = (
    "import os, subprocess, sys\n"
    "child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "_, status, usage = os.wait4(child.pid, 0)\n"
    "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss)\n"
)


def peak_rss(*args: str) -> int:
    """Peak RSS (KiB) of ``admit-guard ARGS``."""
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )
    code, rss = map(int, done.stdout.split())
    assert code in (0, 1), done.stderr
    return rss


def test_a_yaml_snapshot_is_read_item_by_item_in_no_more_memory_than_its_json_twin(tmp_path):
    sys.path.insert(0, str(ROOT / "bench"))
    from snapshot_bench import write_snapshot

    json_path, yaml_path = tmp_path / "cluster.json", tmp_path / "cluster.yaml"
    write_snapshot(json_path, 100, 4000)
    write_snapshot(yaml_path, 100, 4000)
    verdicts = [
        cli("check", "-f", str(EXAMPLES / "workloads"), "--cluster", str(p), "-o", "json")
        for p in (json_path, yaml_path)
    ]
    assert json.loads(verdicts[0].stdout)["results"] == [
        {**r, "file": r["file"]} for r in json.loads(verdicts[1].stdout)["results"]
    ]
    args = ("check", "-f", GOOD, "-o", "json", "--cluster")
    # Read whole, the YAML document's nodes and objects took ~20 KB a pod (80 MB more here).
    assert peak_rss(*args, str(yaml_path)) < 1.5 * peak_rss(*args, str(json_path))


# -- 9. the rest ----------------------------------------------------------------------------------


def test_the_docs_sample_policy_test_is_shipped_with_what_it_points_to_and_passes():
    readme = (ROOT / "docs" / "cli.md").read_text()
    sample = (EXAMPLES / "policy-test" / "gpu.test.yaml").read_text()
    assert f"```yaml\n{sample}```" in readme
    result = cli("test", str(EXAMPLES / "policy-test"))
    assert result.returncode == 0, result.stdout
    assert "3 passed, 0 failed" in result.stdout


def test_a_case_on_a_multi_document_file_must_say_which_document(tmp_path):
    shutil.copy(EXAMPLES / "policy-test" / "gpu-jobs.yaml", tmp_path)
    case = "apiVersion: admit-guard.io/v1alpha1\nkind: PolicyTest\ncases:\n- name: c\n"
    case += "  objectPath: gpu-jobs.yaml\n"
    path = write(tmp_path, "a.test.yaml", case + "  expect: {allowed: true}\n")
    result = cli("test", path)
    assert result.returncode == 2
    assert "cases[0].objectPath" in result.stderr and "name one with document: N (1 to 2)" in result.stderr


def test_policy_test_errors_name_patched_path_and_a_tab_as_the_cause(tmp_path):
    case = (
        "apiVersion: admit-guard.io/v1alpha1\nkind: PolicyTest\ncases:\n- name: c\n"
        f"  objectPath: {GOOD}\n  expect: {{patchedPath: missing.yaml}}\n"
    )
    result = cli("test", write(tmp_path, "p.test.yaml", case))
    assert (
        "cases[0].expect.patchedPath" in result.stderr
        and "objectPath" not in result.stderr.split("cannot read")[0][-40:]
    )
    tabbed = cli("test", write(tmp_path, "t.test.yaml", "apiVersion: v1\ncases:\n\t- name: c\n"))
    assert tabbed.returncode == 2 and "a tab character; YAML indents with spaces only" in tabbed.stderr
    assert "a tab character" in cli("check", "-f", "-", stdin="kind: Pod\nmetadata:\n\tname: x\n").stderr


def test_serve_on_a_busy_port_says_so_in_one_line(tmp_path):
    certs = tmp_path / "certs"
    assert cli("certs", "--out", str(certs)).returncode == 0
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = cli("serve", "--cluster", CLUSTER, "--cert-dir", str(certs), "--bind", f"127.0.0.1:{port}")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"Error: --bind 127.0.0.1:{port}: address already in use (another server listens there); "
        "stop it or choose another --bind"
    )


def test_kubeconfig_errors_name_the_file(tmp_path):
    missing = cli("check", "-f", GOOD, "--kubeconfig", str(tmp_path / "nope"))
    assert missing.returncode == 2 and f"--kubeconfig {tmp_path / 'nope'}: no such file" in missing.stderr
    broken = write(tmp_path, "kubeconfig", "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    result = cli("audit", "--kubeconfig", broken)
    assert result.returncode == 2 and f"cannot use the cluster credentials of {broken}" in result.stderr
    assert re.search(r"Traceback", result.stderr) is None and sys.executable
