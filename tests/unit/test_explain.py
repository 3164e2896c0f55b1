"""``admit-guard explain``: every node's verdicts for a pod (the scheduler's filters and the
kubelet's admission) and the scheduler-style summary; denial messages name a few nodes where the
pod fits, counted as explain counts them."""

from __future__ import annotations

import json

import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.builders import container, deployment, node, pod
from tests.helpers.paths import EXAMPLES, FIXTURES
from webhook.cli import main
from webhook.config import Config
from webhook.engine import evaluate
from webhook.explain import explain
from webhook.state import ClusterState, node_from, pod_record


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
    [explanation] = explain(obj, small_cluster())
    verdicts = {v.node: (v.admit, v.reasons) for v in explanation.nodes}
    assert verdicts == {
        "a": (False, ("OutOfcpu",)),
        "b": (False, ("OutOfcpu",)),
        "c": (False, ("OutOfcpu",)),
        "d": (False, ("TaintToleration",)),
        "e": (True, ()),
    }
    assert explanation.summary == "1/5 nodes fit: 3 Insufficient cpu, 1 untolerated taint"


def test_the_pods_own_node_name_is_set_aside():
    obj = deployment({"nodeName": "a", "containers": [container(requests={"cpu": "100m"})]})
    [explanation] = explain(obj, small_cluster())
    admitting = {v.node for v in explanation.nodes if v.admit}
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
    assert set(entry) == {"kind", "namespace", "name", "template", "fit", "total", "nodes", "summary"}
    assert set(entry["nodes"][0]) == {"node", "fits", "admit", "reasons", "scheduler"}
    assert entry["summary"].startswith("0/")


def test_text_lists_every_node_and_yaml_matches_json():
    args = ["explain", "-f", str(EXAMPLES / "workloads" / "incident-1-pinned-deployment.yaml"),
            "--cluster", str(EXAMPLES / "cluster")]  # fmt: skip
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0
    assert text.stdout.startswith("Deployment edge/sensor-ingest: ") and "nodes fit" in text.stdout
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
    assert "Nodes it fits on now: e." in violation.message


def test_a_node_check_denial_says_when_no_node_would_admit_the_pod():
    obj = pod("huge", node_name="a", requests={"cpu": "64"})
    violations = evaluate(obj, "CREATE", small_cluster(), Config()).violations
    assert violations[0].reason == "OutOfcpu"
    assert "It fits on none of the 5 nodes now." in violations[0].message
    [explanation] = explain(obj, small_cluster())
    assert explanation.summary.startswith("0/5 nodes fit")  # the same nodes, counted the same way


def test_a_denial_message_scans_a_bounded_number_of_nodes():
    state = ClusterState()
    for i in range(100):
        state.set_node(node_from(node(f"n{i:03}", cpu="1", pods="10")))
    obj = pod("huge", node_name="n000", requests={"cpu": "2"})
    [violation] = evaluate(obj, "CREATE", state, Config()).violations
    assert "It fits on none of the first 32 of 100 nodes now." in violation.message


# -- the scheduler's view ---------------------------------------------------------------------


def gpu_cluster() -> ClusterState:
    state = ClusterState()
    state.set_node(node_from(node("cpu-1", cpu="16")))
    state.set_node(node_from(node("gpu-free", cpu="16", extra={"nvidia.com/gpu": "4"})))
    cordoned = node("gpu-cordoned", cpu="16", extra={"nvidia.com/gpu": "4"})
    cordoned["spec"]["unschedulable"] = True
    state.set_node(node_from(cordoned))
    reserved = {"key": "team", "value": "research", "effect": "NoSchedule"}
    state.set_node(
        node_from(node("gpu-reserved", cpu="16", extra={"nvidia.com/gpu": "4"}, taints=[reserved]))
    )
    return state


def test_a_gpu_pod_never_fits_a_node_without_gpus_though_its_kubelet_would_admit_it():
    obj = deployment({"containers": [container(limits={"nvidia.com/gpu": "2"})]})
    [explanation] = explain(obj, gpu_cluster())
    by_node = {v.node: v for v in explanation.nodes}
    cpu = by_node["cpu-1"]
    assert (cpu.fits, cpu.admit, cpu.scheduler) == (False, True, ("Insufficient nvidia.com/gpu",))
    assert cpu.detail() == "scheduler: Insufficient nvidia.com/gpu (the kubelet alone would admit it)"
    assert by_node["gpu-cordoned"].scheduler == ("node(s) were unschedulable",)
    assert by_node["gpu-reserved"].scheduler == ("node(s) had untolerated taint {team: research}",)
    assert [v.node for v in explanation.nodes if v.fits] == ["gpu-free"]
    assert (
        explanation.summary
        == "1/4 nodes fit: 1 Insufficient nvidia.com/gpu, 1 unschedulable, 1 untolerated taint"
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.booleans(), st.booleans()), min_size=1, max_size=8))
def test_explain_on_a_gpu_pod_lists_only_nodes_with_free_gpus_as_places_it_fits(nodes):
    state = ClusterState()
    for i, (gpus, cordoned, tainted) in enumerate(nodes):
        obj = node(f"n{i}", cpu="16", extra={"nvidia.com/gpu": str(gpus)} if gpus else {})
        obj["spec"]["unschedulable"] = cordoned
        obj["spec"]["taints"] = [{"key": "t", "effect": "NoSchedule"}] if tainted else []
        state.set_node(node_from(obj))
    [explanation] = explain(pod("gpu", requests={"nvidia.com/gpu": "1"}), state)
    fitting = {v.node for v in explanation.nodes if v.fits}
    assert fitting == {
        f"n{i}" for i, (gpus, cordoned, tainted) in enumerate(nodes) if gpus and not (cordoned or tainted)
    }


def test_a_denial_suggests_only_nodes_the_scheduler_would_pick():
    state = gpu_cluster()
    full = node("gpu-full", cpu="16", extra={"nvidia.com/gpu": "1"})
    state.set_node(node_from(full))
    holder = pod("holder", node_name="gpu-full", requests={"nvidia.com/gpu": "1"})
    state.set_pod(holder["metadata"]["uid"], pod_record(holder))
    obj = deployment({"nodeName": "gpu-full", "containers": [container(limits={"nvidia.com/gpu": "1"})]})
    [violation] = [
        v for v in evaluate(obj, "CREATE", state, Config()).violations if v.reason == "PinnedNodeName"
    ]
    assert "Node gpu-full would reject it: OutOfnvidia.com/gpu" in violation.message
    assert "Nodes it fits on now: gpu-free." in violation.message


def test_summary_mode_prints_one_line_per_pod_and_json_without_nodes(tmp_path):
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(deployment({"containers": [container(limits={"nvidia.com/gpu": "1"})]})))
    args = ["explain", "--summary", "-f", str(path), "--cluster", str(EXAMPLES / "cluster")]
    text = CliRunner().invoke(main, args)
    counts = "3 Insufficient nvidia.com/gpu, 3 untolerated taint, 1 Too many pods"
    assert text.stdout.splitlines() == [f"Deployment default/web: 0/7 nodes fit: {counts}"]
    [entry] = json.loads(CliRunner().invoke(main, [*args, "-o", "json"]).stdout)["results"]
    assert "nodes" not in entry and (entry["fit"], entry["total"]) == (0, 7)


def test_each_template_of_a_custom_resource_is_explained():
    job = yaml.safe_load((FIXTURES / "workloads" / "volcano-job.yaml").read_text())
    explained = explain(job, gpu_cluster())
    assert [e.subject for e in explained] == [
        "Job default/test-job (template spec.tasks[0].template)",
        "Job default/test-job (template spec.tasks[1].template)",
    ]
    assert [v.node for v in explained[0].nodes if v.fits] == ["gpu-free"]
