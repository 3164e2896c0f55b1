"""``admit-guard check``: outputs, exit codes, and input errors that name file, document and field."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from webhook.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def run(*args, stdin=None):
    return CliRunner().invoke(main, ["check", *args], input=stdin)


def test_examples_reproduce_both_incidents_and_exit_1():
    result = run("-f", str(EXAMPLES / "workloads"), "--cluster", str(EXAMPLES / "cluster"), "-o", "json")
    assert result.exit_code == 1
    by_name = {r["name"]: r for r in json.loads(result.stdout)["results"]}
    assert [v["reason"] for v in by_name["sensor-ingest"]["violations"]] == ["PinnedNodeName"]
    assert [v["reason"] for v in by_name["embeddings-backfill"]["violations"]] == ["MixedDeviceScheduler"]
    assert [v["reason"] for v in by_name["debug-cuda"]["violations"]] == [
        "MixedDeviceScheduler",
        "OutOfnvidia.com/gpu",
    ]
    assert [v["reason"] for v in by_name["metrics-probe"]["violations"]] == ["NodePorts"]
    for good in ("storefront", "embeddings-backfill-volcano", "disk-check"):
        assert by_name[good]["allowed"], good


def test_json_output_follows_the_contract():
    result = run("-f", str(EXAMPLES / "workloads" / "incident-1-pinned-deployment.yaml"), "-o", "json")
    [entry] = json.loads(result.stdout)["results"]
    assert set(entry) == {"file", "kind", "namespace", "name", "allowed", "violations", "warnings", "patch"}
    assert set(entry["violations"][0]) == {"policy", "reason", "message", "node"}
    assert entry["violations"][0]["node"] == "edge-1"


def test_all_allowed_exits_0_and_reads_stdin():
    manifest = (
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\n"
        + (EXAMPLES / "workloads" / "good-deployment.yaml").read_text()
    )
    result = run("-f", "-", stdin=manifest)
    assert result.exit_code == 0, result.output
    assert "ALLOW Deployment web/storefront" in result.stdout


def test_fix_mode_prints_the_patch(tmp_path):
    config = tmp_path / "guard.yaml"
    config.write_text("policies:\n  pinnedNodeName: {mode: fix}\n")
    result = run(
        "-f",
        str(EXAMPLES / "workloads" / "incident-1-pinned-deployment.yaml"),
        "--config",
        str(config),
        "-o",
        "json",
    )
    assert result.exit_code == 0
    [entry] = json.loads(result.stdout)["results"]
    assert entry["patch"][0] == {"op": "remove", "path": "/spec/template/spec/nodeName"}


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("kind: Pod\nmetadata: {name: a}\n", "document 1: field apiVersion: missing"),
        ("apiVersion: v1\nkind: Pod\n---\n- a list\n", "document 2: expected a Kubernetes object"),
        (
            "apiVersion: v1\nkind: Pod\nspec: {containers: [{name: a, resources: {requests: {cpu: x}}}]}\n",
            "document 1: Pod: field spec.containers[0].resources.requests.cpu: 'x' is not a quantity",
        ),
        ("apiVersion: v1\nkind: Pod\nmetadata: {name: [\n", "document 1: invalid YAML"),
        ("apiVersion: v1\nkind: List\nitems: [{kind: Pod}]\n", "document 1, item 1: field apiVersion"),
        (
            "apiVersion: v1\nkind: Pod\nspec: {tolerations: oops}\n",
            "document 1: Pod: field spec.tolerations: must be",
        ),
        (
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: 5\nspec: {template: {spec: {}}}\n",
            "document 1: Deployment: field metadata: must be a mapping",
        ),
        (
            '{"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"template": {"spec": '
            '{"nodeName": "n1", "x": ' + '{"a": ' * 1000 + "1" + "}" * 1000 + "}}}}",
            "document 1: Deployment: field spec: nested too deeply to read",
        ),
    ],
)
def test_bad_input_exits_2_naming_file_document_and_field(tmp_path, content, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    config = tmp_path / "fix.yaml"
    config.write_text("policies: {pinnedNodeName: {mode: fix}}\n")
    result = run("-f", str(path), "--config", str(config))
    assert result.exit_code == 2
    assert f"{path}: {expected}" in result.stderr


def test_unreadable_file_and_bad_config_exit_2(tmp_path):
    assert run("-f", str(tmp_path / "missing.yaml")).exit_code == 2
    config = tmp_path / "guard.yaml"
    config.write_text("policies: {pinnedNodeName: {mode: loud}}\n")
    result = run("-f", str(EXAMPLES / "workloads"), "--config", str(config))
    assert result.exit_code == 2
    assert "policies.pinnedNodeName.mode" in result.stderr


def test_bad_cluster_snapshot_names_the_field(tmp_path):
    snapshot = tmp_path / "nodes.yaml"
    snapshot.write_text("apiVersion: v1\nkind: Node\nmetadata: {name: n}\nstatus: {allocatable: {cpu: x}}\n")
    result = run("-f", str(EXAMPLES / "workloads"), "--cluster", str(snapshot))
    assert result.exit_code == 2
    assert "document 1: Node: field status.allocatable.cpu" in result.stderr


def test_as_user_applies_exemptions(tmp_path):
    config = tmp_path / "guard.yaml"
    config.write_text("exemptions: [{users: ['system:serviceaccount:edge:*']}]\n")
    target = str(EXAMPLES / "workloads" / "incident-1-pinned-deployment.yaml")
    assert run("-f", target, "--config", str(config)).exit_code == 1
    assert (
        run("-f", target, "--config", str(config), "--as", "system:serviceaccount:edge:deployer").exit_code
        == 0
    )
