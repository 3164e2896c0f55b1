"""``admit-guard check``: outputs, exit codes, and input errors that name file, document and field."""

import json

import pytest
import yaml
from click.testing import CliRunner

from tests.helpers.paths import EXAMPLES
from webhook.cli import main


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
    assert set(entry) == {
        "file", "document", "item", "kind", "namespace", "name", "allowed", "skipped", "exempted",
        "violations", "warnings", "patch",
    }  # fmt: skip
    assert (entry["document"], entry["item"], entry["skipped"]) == (1, None, False)
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
            # deeper than any recursion limit a test process runs with (celpy raises it to 2,500)
            '{"nodeName": "n1", "x": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + "}}}}",
            "document 1: invalid JSON: nested too deeply",
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


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


GOOD = (EXAMPLES / "workloads" / "good-deployment.yaml").read_text()
PINNED = EXAMPLES / "workloads" / "incident-1-pinned-deployment.yaml"


def test_a_duplicate_key_is_an_input_error_naming_the_key_and_line(tmp_path):
    path = write(tmp_path, "dup.yaml", "apiVersion: v1\nkind: Pod\nspec: {}\nspec: {nodeName: a}\n")
    result = run("-f", path)
    assert result.exit_code == 2
    assert f"{path}: document 1: invalid YAML: duplicate key 'spec' (line 4" in result.stderr


def test_concatenated_files_without_separators_are_not_silently_one_object():
    result = run("-f", "-", stdin=GOOD + PINNED.read_text())
    assert result.exit_code == 2
    assert "duplicate key 'apiVersion'" in result.stderr


def test_duplicate_keys_in_json_are_an_input_error(tmp_path):
    path = write(tmp_path, "dup.json", '{"apiVersion": "v1", "kind": "Pod",\n "kind": "Pod"}')
    result = run("-f", path)
    assert result.exit_code == 2 and "invalid JSON: duplicate key 'kind' (line 2)" in result.stderr


def test_json_is_parsed_as_json_so_a_trailing_comma_is_an_error(tmp_path):
    path = write(tmp_path, "comma.json", '{"apiVersion": "v1", "kind": "Pod",}')
    result = run("-f", path)
    assert result.exit_code == 2 and f"{path}: document 1: invalid JSON" in result.stderr


@pytest.mark.parametrize("content", ["", "---\n", "---\n---\n", "# only a comment\n"])
def test_no_objects_at_all_is_an_input_error(tmp_path, content):
    path = write(tmp_path, "empty.yaml", content)
    result = run("-f", path)
    assert result.exit_code == 2 and f"{path}: no objects" in result.stderr


def test_empty_stdin_is_an_input_error():
    result = run("-f", "-", stdin="")
    assert result.exit_code == 2 and "<stdin>: no objects" in result.stderr


def test_objects_that_create_no_pods_are_skipped_and_counted(tmp_path):
    manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: web}\n---\n"
    manifest += "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: r}\n---\n"
    manifest += "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n---\n" + GOOD
    text = run("-f", "-", "-v", stdin=manifest)
    assert text.exit_code == 0
    assert "SKIP  ConfigMap web/c" in text.stdout and "SKIP  ClusterRole r  (" in text.stdout
    assert "4 objects: 1 allowed, 0 denied, 0 warned, 3 skipped, 0 input errors" in text.stderr
    data = json.loads(run("-f", "-", "-o", "json", stdin=manifest).stdout)
    assert [r["skipped"] for r in data["results"]] == [True, True, True, False]
    assert data["results"][1]["namespace"] is None  # cluster-scoped: no default/
    assert data["summary"] == {
        "allowed": 1,
        "denied": 0,
        "warned": 0,
        "exempted": 0,
        "skipped": 3,
        "errors": 0,
    }


def test_list_items_carry_their_document_and_item_index(tmp_path):
    path = write(
        tmp_path,
        "list.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n---\napiVersion: v1\nkind: List\nitems:\n"
        "- {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n"
        "- {apiVersion: v1, kind: ConfigMap, metadata: {name: b}}\n",
    )
    data = json.loads(run("-f", path, "-o", "json").stdout)
    assert [(r["document"], r["item"]) for r in data["results"]] == [(1, None), (2, 1), (2, 2)]


def _warn_config(tmp_path) -> str:
    return write(tmp_path, "warn.yaml", "policies: {pinnedNodeName: {mode: warn}}\n")


def test_warnings_pass_unless_warnings_are_errors(tmp_path):
    config = _warn_config(tmp_path)
    assert run("-f", str(PINNED), "--config", config).exit_code == 0
    result = run("-f", str(PINNED), "--config", config, "--warnings-as-errors")
    assert result.exit_code == 1
    assert "WARN  Deployment edge/sensor-ingest" in result.stdout
    assert "0 allowed, 0 denied, 1 warned" in result.stderr


def test_yaml_output_has_the_json_contract(tmp_path):
    as_json = json.loads(run("-f", str(PINNED), "-o", "json").stdout)
    as_yaml = yaml.safe_load(run("-f", str(PINNED), "-o", "yaml").stdout)
    assert as_yaml == as_json


def test_fail_only_prints_only_denials_warnings_and_errors(tmp_path):
    bad = write(tmp_path, "bad.yaml", "kind: Pod\n")
    result = run("-f", str(EXAMPLES / "workloads"), "-f", bad, "--cluster", str(EXAMPLES / "cluster"), "-q")
    assert result.exit_code == 2
    assert "DENY " in result.stdout and "ALLOW" not in result.stdout and "SKIP" not in result.stdout
    assert "ERROR" in result.stderr and "input errors" in result.stderr
    workloads, cluster = str(EXAMPLES / "workloads"), str(EXAMPLES / "cluster")
    data = json.loads(run("-f", workloads, "--cluster", cluster, "--fail-only", "-o", "json").stdout)
    assert data["results"] and all(not r["allowed"] or r["warnings"] for r in data["results"])


def test_fix_mode_shows_the_patch_as_yaml_in_text(tmp_path):
    config = write(tmp_path, "fix.yaml", "policies: {pinnedNodeName: {mode: fix}}\n")
    result = run("-f", str(PINNED), "--config", config)
    assert "PATCH Deployment edge/sensor-ingest" in result.stdout
    assert "  patch:\n    - op: remove\n      path: /spec/template/spec/nodeName" in result.stdout


def test_no_progress_line_on_a_pipe():
    result = run("-f", str(EXAMPLES / "workloads"))
    assert "checked" not in result.stderr


def test_the_progress_line_shows_on_a_terminal_after_a_second():
    import io

    from webhook.cli.render import Progress

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    now = [0.0]
    stream = Terminal()
    progress = Progress(stream, clock=lambda: now[0])
    progress.tick(10)
    assert stream.getvalue() == ""  # under a second: nothing
    now[0] = 1.5
    progress.tick(2000)
    progress.done()
    assert "checked 2000 objects..." in stream.getvalue() and stream.getvalue().endswith("\033[K")


def test_version_names_the_package_and_the_kubernetes_rules():
    for args in (["version"], ["--version"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0
        assert "admit-guard 0.1.0" in result.stdout and "Kubernetes v1.35" in result.stdout
