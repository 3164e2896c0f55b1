"""The CLI contracts of issue 13 (and the audit's of issue 12), through the installed console
script in a subprocess: the real entry point, exit codes, stdout and stderr kept apart, stdin a
pipe. ``tests/unit/cli/test_cli.py`` covers the details in-process; this checks the wiring end to end."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.helpers.console import CLUSTER, GOOD, PINNED, SCRIPT, WORKLOADS, cli, write

SUMMARY = "objects: {} allowed, {} denied, {} warned, {} skipped, {} input errors"


def test_the_console_script_is_installed():
    assert SCRIPT.is_file() and os.access(SCRIPT, os.X_OK), SCRIPT


# -- strict input: exit 2, the error names file, document and line ------------------------

POD = "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"


# file name: (content, the error after "document 1: ", the line it names)
BAD_INPUT = {
    "dup.yaml": (POD + "spec: {}\nspec: {nodeName: a}\n", "invalid YAML: duplicate key 'spec'", 5),
    "dup.json": (
        '{"apiVersion": "v1", "kind": "Pod",\n "kind": "Pod"}',
        "invalid JSON: duplicate key 'kind'",
        2,
    ),
    "comma.json": ('{"apiVersion": "v1",\n "kind": "Pod",}', "invalid JSON: Expecting property name", 2),
}


@pytest.mark.parametrize("name", sorted(BAD_INPUT))
def test_unusable_input_exits_2_naming_file_document_and_line(tmp_path, name):
    content, message, line = BAD_INPUT[name]
    path = write(tmp_path, name, content)
    result = cli("check", "-f", path)
    assert result.returncode == 2, result.stderr
    [error] = [e for e in result.stderr.splitlines() if e.startswith("ERROR ")]
    assert error.startswith(f"ERROR {path}: document 1: {message}")
    assert f"(line {line}" in error
    assert SUMMARY.format(0, 0, 0, 0, 1) in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("content", ["", "---\n---\n"])
def test_no_objects_at_all_exits_2(tmp_path, content):
    path = write(tmp_path, "empty.yaml", content)
    result = cli("check", "-f", path)
    assert result.returncode == 2 and f"ERROR {path}: no objects" in result.stderr


def test_empty_stdin_exits_2():
    result = cli("check", "-f", "-", stdin=subprocess.DEVNULL)
    assert result.returncode == 2 and "ERROR <stdin>: no objects" in result.stderr


def test_cat_of_files_without_separators_on_stdin_exits_2_instead_of_checking_one_object():
    with subprocess.Popen(["cat", GOOD, PINNED], stdout=subprocess.PIPE) as cat:
        result = cli("check", "-f", "-", stdin=cat.stdout.fileno())
    assert result.returncode == 2, result.stdout + result.stderr
    assert "ERROR <stdin>: document 1: invalid YAML: duplicate key 'apiVersion' (line " in result.stderr
    assert "ALLOW" not in result.stdout


# -- an honest summary --------------------------------------------------------------------

MIXED = (
    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: web}\n---\n"
    "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: reader}\n---\n"
    "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n---\n" + Path(GOOD).read_text()
)


def test_objects_that_create_no_pods_are_skipped_and_counted_in_the_summary_line():
    result = cli("check", "-f", "-", "-v", stdin=MIXED)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == ["SKIP", "SKIP", "SKIP", "ALLOW"]
    assert "SKIP  ClusterRole reader  (" in result.stdout  # cluster-scoped: no default/
    assert "default/" not in result.stdout
    assert result.stderr.strip() == "4 " + SUMMARY.format(1, 0, 0, 3, 0)


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_json_and_yaml_output_carry_document_index_skipped_and_no_namespace_when_cluster_scoped(output):
    result = cli("check", "-f", "-", "-o", output, stdin=MIXED)
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout) if output == "json" else yaml.safe_load(result.stdout)
    assert set(body) == {"results", "errors", "summary", "cluster"}
    results = body["results"]
    assert [(r["document"], r["item"], r["kind"], r["skipped"]) for r in results] == [
        (1, None, "ConfigMap", True),
        (2, None, "ClusterRole", True),
        (3, None, "Widget", True),
        (4, None, "Deployment", False),
    ]
    assert [r["namespace"] for r in results] == ["web", None, None, "web"]
    assert body["summary"] == {
        "allowed": 1,
        "denied": 0,
        "warned": 0,
        "exempted": 0,
        "skipped": 3,
        "errors": 0,
    }
    assert body["cluster"] is None  # no cluster state given


def test_list_items_carry_their_item_index():
    manifest = "apiVersion: v1\nkind: List\nitems:\n" + "".join(
        f"- {{apiVersion: v1, kind: ConfigMap, metadata: {{name: c{i}}}}}\n" for i in range(2)
    )
    body = json.loads(cli("check", "-f", "-", "-o", "json", stdin=manifest).stdout)
    assert [(r["document"], r["item"]) for r in body["results"]] == [(1, 1), (1, 2)]


def test_yaml_and_json_output_are_the_same_contract():
    as_json = json.loads(cli("check", "-f", PINNED, "-o", "json").stdout)
    assert yaml.safe_load(cli("check", "-f", PINNED, "-o", "yaml").stdout) == as_json


@pytest.mark.parametrize(("flags", "code"), [((), 0), (("--warnings-as-errors",), 1)])
def test_warnings_exit_1_only_with_warnings_as_errors(tmp_path, flags, code):
    config = write(tmp_path, "warn.yaml", "policies: {pinnedNodeName: {mode: warn}}\n")
    result = cli("check", "-f", PINNED, "--config", config, *flags)
    assert result.returncode == code, result.stderr
    assert result.stdout.startswith("WARN  Deployment edge/sensor-ingest")
    assert result.stderr.strip() == "1 " + SUMMARY.format(0, 0, 1, 0, 0)


def test_a_denial_exits_1():
    result = cli("check", "-f", PINNED)
    assert result.returncode == 1
    assert result.stdout.startswith("DENY  Deployment edge/sensor-ingest")


@pytest.mark.parametrize("flag", ["-q", "--fail-only"])
def test_fail_only_prints_only_denials_warnings_and_errors(tmp_path, flag):
    bad = write(tmp_path, "bad.yaml", "kind: Pod\n")
    result = cli("check", "-f", WORKLOADS, "-f", bad, "--cluster", CLUSTER, flag)
    assert result.returncode == 2
    verdicts = {line.split()[0] for line in result.stdout.splitlines() if not line.startswith(" ")}
    assert verdicts == {"DENY"}
    assert f"ERROR {bad}: document 1: field apiVersion" in result.stderr
    assert "1 input errors" in result.stderr


def test_no_progress_line_on_a_pipe():
    result = cli("check", "-f", WORKLOADS, "--cluster", CLUSTER)
    assert "\r" not in result.stderr and "checked" not in result.stderr


# -- explain, version ---------------------------------------------------------------------


def test_explain_json_follows_the_contract():
    result = cli("explain", "-f", PINNED, "--cluster", CLUSTER, "-o", "json")
    assert result.returncode == 0, result.stderr
    [entry] = json.loads(result.stdout)["results"]
    assert set(entry) == {"kind", "namespace", "name", "template", "fit", "total", "nodes", "summary"}
    assert (entry["kind"], entry["namespace"], entry["name"]) == ("Deployment", "edge", "sensor-ingest")
    assert all(set(n) == {"node", "fits", "admit", "reasons", "scheduler"} for n in entry["nodes"])
    nodes = {n["node"] for n in entry["nodes"]}
    assert "edge-1" in nodes and len(nodes) == len(entry["nodes"])
    assert " nodes fit" in entry["summary"]


def test_explain_without_cluster_state_exits_2():
    result = cli("explain", "-f", PINNED)
    assert result.returncode == 2 and "needs cluster state" in result.stderr


@pytest.mark.parametrize("args", [("version",), ("--version",)])
def test_version_names_the_package_and_the_kubernetes_rules(args):
    result = cli(*args)
    assert result.returncode == 0
    assert result.stdout.startswith("admit-guard 0.1.0 ") and "Kubernetes v1." in result.stdout


# -- audit ----------------------------------------------------------------------------------


def test_audit_of_the_example_cluster_exits_1_with_the_json_contract():
    result = cli("audit", "--cluster", CLUSTER, "-o", "json")
    assert result.returncode == 1, result.stderr
    body = json.loads(result.stdout)
    assert set(body) == {"findings", "summary"}
    [finding] = body["findings"]
    assert set(finding) == {
        "type", "severity", "namespace", "kind", "name", "node", "resource", "count", "message",
    }  # fmt: skip
    assert (finding["type"], finding["kind"], finding["name"]) == ("MixedDeviceScheduler", "Node", "gpu-2")
    assert body["summary"]["findings"] == 1


def test_audit_of_a_clean_cluster_exits_0_and_prints_an_empty_cluster_policy_report(tmp_path):
    nodes = write(tmp_path, "nodes.yaml", "apiVersion: v1\nkind: Node\nmetadata: {name: n}\n")
    text = cli("audit", "--cluster", nodes)
    assert (text.returncode, text.stdout) == (0, "no findings\n")
    report = cli("audit", "--cluster", nodes, "-o", "policyreport")
    assert report.returncode == 0, report.stderr
    [cleared] = list(yaml.safe_load_all(report.stdout))
    assert (cleared["kind"], cleared["results"]) == ("ClusterPolicyReport", [])


def test_audit_without_a_cluster_exits_2():
    result = cli("audit")
    assert result.returncode == 2 and "no cluster to audit" in result.stderr


# -- certs ----------------------------------------------------------------------------------


def test_certs_refuses_to_replace_an_existing_ca(tmp_path):
    out = tmp_path / "certs"
    first = cli("certs", "--out", str(out))
    assert first.returncode == 0, first.stderr
    ca = (out / "ca.crt").read_bytes()
    again = cli("certs", "--out", str(out))
    assert again.returncode == 2
    assert "holds a CA" in again.stderr and "--force" in again.stderr and "--renew" in again.stderr
    assert again.stdout == ""
    assert (out / "ca.crt").read_bytes() == ca
