"""``admit-guard test``: the project's own suite passes; failures, invalid files and JUnit work."""

import xml.etree.ElementTree as ET

from click.testing import CliRunner

from tests.helpers.paths import TESTS
from webhook.cli import main

POLICY = TESTS / "policy"


def run(*args):
    return CliRunner().invoke(main, ["test", *args])


def test_the_projects_policy_suite_passes():
    result = run(str(POLICY))
    assert result.exit_code == 0, result.output
    assert "59 passed, 0 failed" in result.stdout


def test_run_selects_cases_by_name():
    result = run(str(POLICY), "--run", "^incident [12] -")
    assert result.exit_code == 0
    assert "2 passed, 0 failed" in result.stdout


FAILING = """
apiVersion: admit-guard.io/v1alpha1
kind: PolicyTest
cases:
  - name: expects the wrong verdict
    object: {apiVersion: apps/v1, kind: Deployment, metadata: {name: d},
             spec: {template: {spec: {nodeName: n1, containers: [{name: a, image: a}]}}}}
    expect: {allowed: true, reasons: []}
  - name: expects the wrong patch
    config: {inline: {policies: {pinnedNodeName: {mode: fix}}}}
    object: {apiVersion: apps/v1, kind: Deployment, metadata: {name: d},
             spec: {template: {spec: {nodeName: n1, containers: [{name: a, image: a}]}}}}
    expect:
      patched: {apiVersion: apps/v1, kind: Deployment, metadata: {name: d},
                spec: {template: {spec: {nodeName: n1, containers: [{name: a, image: a}]}}}}
"""


def test_failures_show_expected_against_actual_and_exit_1(tmp_path):
    (tmp_path / "wrong.test.yaml").write_text(FAILING)
    junit = tmp_path / "junit.xml"
    result = run(str(tmp_path), "-o", "junit", str(junit))
    assert result.exit_code == 1
    assert "allowed: expected True, got False" in result.stdout
    assert "reasons: expected [], got ['PinnedNodeName']" in result.stdout
    assert "      -      nodeName: n1" in result.stdout  # the unified diff of the patched object
    assert "0 passed, 2 failed" in result.stdout
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == "2" and suite.get("failures") == "2"


def test_invalid_test_files_exit_2_naming_file_and_field(tmp_path):
    bad = tmp_path / "bad.test.yaml"
    bad.write_text(
        "apiVersion: admit-guard.io/v1alpha1\nkind: PolicyTest\ncases:\n"
        "  - name: x\n    objectPath: missing.yaml\n    expect: {allowed: true}\n"
    )
    result = run(str(bad))
    assert result.exit_code == 2
    assert f"{bad}: cases[0].objectPath: cannot read" in result.stderr
    bad.write_text(
        "apiVersion: admit-guard.io/v1alpha1\nkind: PolicyTest\ncases:\n"
        "  - name: x\n    object: {kind: Pod}\n    expect: {allowd: true}\n"
    )
    assert "cases[0].expect.allowd: unknown field" in run(str(bad)).stderr


def test_a_failed_expectation_prints_the_violations_that_made_it_fail(tmp_path):
    (tmp_path / "wrong.test.yaml").write_text(FAILING)
    result = run(str(tmp_path))
    assert "denied by PinnedNodeName: Deployment default/d sets spec.template.spec.nodeName" in result.stdout


def test_junit_flag_writes_the_same_report(tmp_path):
    (tmp_path / "wrong.test.yaml").write_text(FAILING)
    result = run(str(tmp_path), "--junit", str(tmp_path / "junit.xml"))
    assert result.exit_code == 1
    assert ET.parse(tmp_path / "junit.xml").getroot().get("failures") == "2"


def test_an_invalid_test_file_lists_every_problem(tmp_path):
    bad = tmp_path / "bad.test.yaml"
    bad.write_text(
        "apiVersion: admit-guard.io/v1alpha1\nkind: PolicyTest\ncases:\n"
        "  - name: x\n    object: {kind: Pod}\n    expect: {allowd: true}\n"
        "  - name: y\n    object: {kind: Pod}\n    operation: PATCH\n    expect: {allowed: true}\n"
        "  - name: z\n    expect: {allowed: true}\n"
    )
    result = run(str(bad))
    assert result.exit_code == 2
    for problem in ("cases[0].expect.allowd", "cases[1].operation", "cases[2]: needs object"):
        assert f"{bad}: {problem}" in result.stderr


EVERY_PROBLEM = """
apiVersion: admit-guard.io/v1alpha1
kind: PolicyTest
typo: 1
config: {inline: {failOpen: sometimes}}
cluster: {nodes: [5]}
cases:
  - name: no object
    expect: {allowed: maybe, reasons: PinnedNodeName}
  - name: object is a number
    object: 5
    operation: PATCH
    expect: {allowed: true}
  - name: bad case config
    object: {kind: Pod}
    config: {inline: {policies: {pinnedNodeName: {mode: loud}}}}
    now: yesterday
    expect: {}
  - 7
"""


def test_an_invalid_test_file_lists_every_problem_of_every_case(tmp_path):
    bad = tmp_path / "bad.test.yaml"
    bad.write_text(EVERY_PROBLEM)
    result = run(str(bad))
    assert result.exit_code == 2
    for problem in (
        "typo: unknown field",
        "config: failOpen: must be true or false",
        "cluster.nodes[0]: must be a mapping",
        "cases[0]: needs object or objectPath",
        "cases[0].expect.allowed: must be true or false",
        "cases[0].expect.reasons: must be a list of strings",
        "cases[1].object: must be a mapping",
        "cases[1].operation: must be CREATE or UPDATE",
        "cases[2].config: policies.pinnedNodeName.mode: 'loud' is not one of",
        "cases[2].now: 'yesterday' is not an RFC 3339 time",
        "cases[2].expect: must state at least one expectation",
        "cases[3]: must be a mapping",
    ):
        assert f"{bad}: {problem}" in result.stderr, problem
    assert isinstance(result.exception, SystemExit)  # no traceback


def test_groups_must_be_strings_and_bind_to_must_bind_a_pod(tmp_path):
    bad = tmp_path / "bad.test.yaml"
    bad.write_text(
        """
apiVersion: admit-guard.io/v1alpha1
kind: PolicyTest
config: {inline: {exemptions: [{groups: [admins]}]}}
cases:
  - name: a group that is a number
    groups: [1]
    object: {apiVersion: v1, kind: Pod, metadata: {name: p}, spec: {containers: [{name: a, image: a}]}}
    expect: {allowed: true}
"""
    )
    result = run(str(bad))
    assert result.exit_code == 2 and f"{bad}: cases[0].groups: must be a list of strings" in result.stderr
    bind = tmp_path / "bind.test.yaml"
    bind.write_text(
        """
apiVersion: admit-guard.io/v1alpha1
kind: PolicyTest
cases:
  - name: binds a pod whose spec is a list
    bindTo: n1
    object: {apiVersion: v1, kind: Pod, metadata: {name: p}, spec: [1]}
    expect: {allowed: true}
"""
    )
    result = run(str(bind))
    assert result.exit_code == 1 and "bindTo binds a Pod" in result.output
    assert isinstance(result.exception, SystemExit)  # no traceback


DUPLICATE_KEY_CONFIG = "policies:\n  pinnedNodeName: {mode: warn}\n  pinnedNodeName: {mode: off}\n"
USES_CONFIG_FILE = """
apiVersion: admit-guard.io/v1alpha1
kind: PolicyTest
config: {path: guard.yaml}
cases:
  - name: a pod
    object: {apiVersion: v1, kind: Pod, metadata: {name: p}, spec: {containers: [{name: a, image: a}]}}
    expect: {allowed: true}
"""


def test_a_duplicate_key_in_a_test_files_config_file_is_an_error_naming_the_file_and_key(tmp_path):
    config = tmp_path / "guard.yaml"
    config.write_text(DUPLICATE_KEY_CONFIG)
    test_file = tmp_path / "dup.test.yaml"
    test_file.write_text(USES_CONFIG_FILE)
    result = run(str(test_file))
    assert result.exit_code == 2
    assert (
        f"{test_file}: config.path: {config}: invalid YAML: duplicate key 'pinnedNodeName' (line 3"
        in result.stderr
    )
    # ``check`` (and ``serve``) refuse the same file the same way.
    pod = tmp_path / "pod.yaml"
    pod.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: a}]}")
    checked = CliRunner().invoke(main, ["check", "-f", str(pod), "--config", str(config)])
    assert checked.exit_code == 2
    assert f"{config}: invalid YAML: duplicate key 'pinnedNodeName' (line 3" in checked.stderr
