"""``admit-guard explain``: every node's kubelet verdict for a pod, and the scheduler-style summary;
denial messages name a few nodes that would admit the pod."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner

from tests.builders import container, deployment, node, pod
from webhook.cli import main
from webhook.config import Config
from webhook.engine import evaluate
from webhook.explain import explain
from webhook.state import ClusterState, node_from, pod_record

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def small_cluster() -> ClusterState:
    state = ClusterState()
    for name in ("a", "b", "c"):
        state.set_node(node_from(node(name, cpu="2", pods="10")))
    tainted = node("d", cpu="8", pods="10")
    tainted["spec"] = {"taints": [{"key": "dedicated", "value": "gpu", "effect": "NoExecute"}]}
    state.set_node(node_from(tainted))
    state.set_node(node_from(node("e", cpu="8", pods="10")))
    for name in ("a", "b", "c"):
        busy = pod(f"busy-{name}", node_name=name, requests={"cpu": "1500m"})
        state.set_pod(busy["metadata"]["uid"], pod_record(busy))
    return state


def test_every_node_gets_the_kubelet_verdict_and_the_summary_counts_first_reasons():
    obj = deployment({"containers": [container(requests={"cpu": "1"})]})
    explanation = explain(obj, small_cluster())
    verdicts = {v.node: (v.admit, v.reasons) for v in explanation.nodes}
    assert verdicts == {
        "a": (False, ("OutOfcpu",)),
        "b": (False, ("OutOfcpu",)),
        "c": (False, ("OutOfcpu",)),
        "d": (False, ("TaintToleration",)),
        "e": (True, ()),
    }
    assert explanation.summary == "1/5 nodes would admit it: 3 OutOfcpu, 1 untolerated taint"


def test_the_pods_own_node_name_is_set_aside():
    obj = deployment({"nodeName": "a", "containers": [container(requests={"cpu": "100m"})]})
    admitting = {v.node for v in explain(obj, small_cluster()).nodes if v.admit}
    assert admitting == {"a", "b", "c", "e"}


def test_objects_that_create_no_pods_have_no_explanation():
    assert (
        explain({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}, small_cluster()) is None
    )


def test_json_follows_the_contract_and_exit_1_when_no_node_fits(tmp_path):
    path = tmp_path / "big.yaml"
    big = deployment({"containers": [container(requests={"cpu": "64"})]})
    path.write_text(yaml.safe_dump(big))
    result = CliRunner().invoke(
        main, ["explain", "-f", str(path), "--cluster", str(EXAMPLES / "cluster"), "-o", "json"]
    )
    assert result.exit_code == 1
    [entry] = json.loads(result.stdout)["results"]
    assert set(entry) == {"kind", "namespace", "name", "nodes", "summary"}
    assert set(entry["nodes"][0]) == {"node", "admit", "reasons"}
    assert entry["summary"].startswith("0/")


def test_text_lists_every_node_and_yaml_matches_json():
    args = ["explain", "-f", str(EXAMPLES / "workloads" / "incident-1-pinned-deployment.yaml"),
            "--cluster", str(EXAMPLES / "cluster")]  # fmt: skip
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0
    assert text.stdout.startswith("Deployment edge/sensor-ingest: ") and "nodes would admit it" in text.stdout
    assert "  edge-1 " in text.stdout
    as_json = json.loads(CliRunner().invoke(main, [*args, "-o", "json"]).stdout)
    assert yaml.safe_load(CliRunner().invoke(main, [*args, "-o", "yaml"]).stdout) == as_json


def test_explain_without_cluster_state_is_an_input_error():
    result = CliRunner().invoke(main, ["explain", "-f", str(EXAMPLES / "workloads")])
    assert result.exit_code == 2 and "needs cluster state" in result.stderr


def test_a_pinned_denial_names_nodes_that_would_admit_the_pod():
    obj = deployment({"nodeName": "a", "containers": [container(requests={"cpu": "1"})]})
    [violation] = evaluate(obj, "CREATE", small_cluster(), Config()).violations
    assert "Node a would reject it" in violation.message
    assert "Nodes that would admit it now: e." in violation.message


def test_a_node_check_denial_says_when_no_node_would_admit_the_pod():
    obj = pod("huge", node_name="a", requests={"cpu": "64"})
    violations = evaluate(obj, "CREATE", small_cluster(), Config()).violations
    assert violations[0].reason == "OutOfcpu"
    assert "None of the 4 nodes would admit it now." in violations[0].message


def test_a_denial_message_scans_a_bounded_number_of_nodes():
    state = ClusterState()
    for i in range(100):
        state.set_node(node_from(node(f"n{i:03}", cpu="1", pods="10")))
    obj = pod("huge", node_name="n000", requests={"cpu": "2"})
    [violation] = evaluate(obj, "CREATE", state, Config()).violations
    assert "None of the first 32 of 99 nodes would admit it now." in violation.message
