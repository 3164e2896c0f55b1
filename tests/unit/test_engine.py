"""The three policies through ``evaluate``: verdicts, modes, fixes, UPDATE rules, exemptions."""

import copy

import jsonpatch
import pytest

from tests.helpers.builders import container, deployment, gpu_job, node, pod
from webhook.config import Config, config_from_dict
from webhook.engine import evaluate
from webhook.state import ClusterState, node_from, pod_record


def config(**policies) -> Config:
    return config_from_dict({"policies": policies})


@pytest.fixture
def state() -> ClusterState:
    s = ClusterState()
    s.set_node(node_from(node("full", pods="1")))
    s.set_node(node_from(node("gpu-1", extra={"nvidia.com/gpu": "2"})))
    for obj in (
        pod("filler", node_name="full"),
        pod("trainer", node_name="gpu-1", scheduler="volcano", requests={"nvidia.com/gpu": "1"}),
    ):
        s.set_pod(obj["metadata"]["uid"], pod_record(obj))
    return s


def reasons(decision):
    return [v.reason for v in decision.violations]


def patched(obj, decision):
    return jsonpatch.apply_patch(copy.deepcopy(obj), decision.patch)


def test_pinned_template_is_denied_with_the_kubelet_verdict(state):
    decision = evaluate(
        deployment({"nodeName": "full", "containers": [container()]}), "CREATE", state, Config()
    )
    assert not decision.allowed
    assert reasons(decision) == ["PinnedNodeName"]
    assert "Node full would reject it: OutOfpods (1 of 1 pods)" in decision.violations[0].message
    assert decision.violations[0].node == "full"


def test_pinned_template_update_is_allowed_when_nodename_is_unchanged(state):
    old = deployment({"nodeName": "full", "containers": [container()]})
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = ["example.com/cleanup"]
    assert evaluate(new, "UPDATE", state, Config(), old_object=old).allowed
    new["spec"]["template"]["spec"]["nodeName"] = "gpu-1"
    assert reasons(evaluate(new, "UPDATE", state, Config(), old_object=old)) == ["PinnedNodeName"]


def test_fix_mode_rewrites_nodename_to_required_node_affinity(state):
    obj = deployment({"nodeName": "full", "containers": [container()]})
    decision = evaluate(obj, "CREATE", state, config(pinnedNodeName={"mode": "fix"}))
    assert decision.allowed
    spec = patched(obj, decision)["spec"]["template"]["spec"]
    assert "nodeName" not in spec
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["full"]}]}
        ]
    }


def test_fix_mode_ands_the_node_into_every_existing_term_and_leaves_empty_terms_alone(state):
    terms = [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["x"]}]},
        {},
    ]
    affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    }
    obj = deployment({"nodeName": "full", "affinity": affinity, "containers": [container()]})
    decision = evaluate(obj, "CREATE", state, config(pinnedNodeName={"mode": "fix"}))
    new_terms = patched(obj, decision)["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    pin = {"key": "metadata.name", "operator": "In", "values": ["full"]}
    assert new_terms[0]["matchFields"] == [pin]
    assert new_terms[1]["matchFields"][-1] == pin and len(new_terms[1]["matchFields"]) == 2
    assert new_terms[2] == {}


def test_cronjob_template_path_is_patched(state):
    cron = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "c"},
        "spec": {
            "schedule": "* * * * *",
            "jobTemplate": {
                "spec": {"template": {"spec": {"nodeName": "full", "containers": [container()]}}}
            },
        },
    }
    decision = evaluate(cron, "CREATE", state, config(pinnedNodeName={"mode": "fix"}))
    assert "nodeName" not in patched(cron, decision)["spec"]["jobTemplate"]["spec"]["template"]["spec"]


def test_warn_and_audit_modes_allow(state):
    obj = deployment({"nodeName": "full", "containers": [container()]})
    warned = evaluate(obj, "CREATE", state, config(pinnedNodeName={"mode": "warn"}))
    assert (
        warned.allowed
        and warned.warnings
        and warned.warnings[0].startswith("[pinnedNodeName] PinnedNodeName")
    )
    audited = evaluate(obj, "CREATE", state, config(pinnedNodeName={"mode": "audit"}))
    assert audited.allowed and [v.reason for v in audited.audited] == ["PinnedNodeName"]
    assert evaluate(obj, "CREATE", state, config(pinnedNodeName={"mode": "off"})).violations == []


def test_device_pod_with_another_scheduler_than_the_detected_owner_is_denied(state):
    decision = evaluate(gpu_job(), "CREATE", state, Config())
    assert reasons(decision) == ["MixedDeviceScheduler"]
    assert (
        "gpu-1: nvidia.com/gpu is held by pods of volcano (default/trainer)" in decision.violations[0].message
    )
    assert evaluate(gpu_job("volcano"), "CREATE", state, Config()).allowed


def test_configured_owner_wins_over_autodetection(state):
    cfg = config(deviceScheduler={"owners": {"nvidia.com/*": "kai-scheduler"}})
    assert reasons(evaluate(gpu_job("volcano"), "CREATE", state, cfg)) == ["MixedDeviceScheduler"]
    assert evaluate(gpu_job("kai-scheduler"), "CREATE", state, cfg).allowed


def test_no_owner_known_means_nothing_to_mix_with():
    assert evaluate(gpu_job(), "CREATE", ClusterState(), Config()).allowed


def test_fix_mode_rewrites_default_scheduler_but_never_an_explicit_one(state):
    cfg = config(deviceScheduler={"mode": "fix"})
    job = gpu_job("default-scheduler")
    decision = evaluate(job, "CREATE", state, cfg)
    assert decision.allowed
    assert patched(job, decision)["spec"]["template"]["spec"]["schedulerName"] == "volcano"
    explicit = evaluate(gpu_job("yunikorn"), "CREATE", state, cfg)
    assert not explicit.allowed and explicit.patch is None


def test_pod_asking_for_devices_of_two_owners_is_denied(state):
    cfg = config(
        deviceScheduler={"owners": {"nvidia.com/gpu": "volcano", "amd.com/gpu": "default-scheduler"}}
    )
    job = gpu_job("volcano")
    job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"] = "1"
    decision = evaluate(job, "CREATE", state, cfg)
    assert reasons(decision) == ["MixedDeviceScheduler"]
    assert "different owners" in decision.violations[0].message


def test_device_pod_that_sets_nodename_bypasses_every_scheduler(state):
    obj = pod("debug", node_name="gpu-1", scheduler="volcano", requests={"nvidia.com/gpu": "1"})
    decision = evaluate(obj, "CREATE", state, Config())
    assert "MixedDeviceScheduler" in reasons(decision)
    assert "bypassing every scheduler" in decision.violations[0].message


def test_device_annotations_map_to_owners(state):
    cfg = config(deviceScheduler={"annotations": {"gpu-fraction": "kai-scheduler"}})
    obj = pod("frac")
    obj["metadata"]["annotations"] = {"gpu-fraction": "0.5"}
    assert reasons(evaluate(obj, "CREATE", state, cfg)) == ["MixedDeviceScheduler"]


def test_fixing_both_policies_leaves_a_pod_the_owner_schedules(state):
    cfg = config(pinnedNodeName={"mode": "fix"}, deviceScheduler={"mode": "fix"})
    obj = gpu_job(nodeName="gpu-1")
    decision = evaluate(obj, "CREATE", state, cfg)
    assert decision.allowed
    spec = patched(obj, decision)["spec"]["template"]["spec"]
    assert spec["schedulerName"] == "volcano" and "nodeName" not in spec


def test_pod_created_with_nodename_is_checked_like_the_kubelet(state):
    decision = evaluate(pod("late", node_name="full"), "CREATE", state, Config())
    assert reasons(decision) == ["OutOfpods"]
    assert decision.violations[0].node == "full"
    assert evaluate(pod("late", node_name="full"), "UPDATE", state, Config()).allowed


def test_unknown_node_is_denied_unless_configured_to_allow(state):
    assert reasons(evaluate(pod("x", node_name="ghost"), "CREATE", state, Config())) == ["UnknownNode"]
    assert evaluate(
        pod("x", node_name="ghost"), "CREATE", state, config(nodeAdmission={"unknownNode": "allow"})
    ).allowed


def test_mirror_pods_are_not_admitted_by_the_kubelet_so_not_checked(state):
    mirror = pod("static", node_name="full")
    mirror["metadata"]["annotations"] = {"kubernetes.io/config.mirror": "abc"}
    assert evaluate(mirror, "CREATE", state, Config()).allowed


def test_without_state_node_checks_become_a_warning():
    decision = evaluate(pod("x", node_name="n"), "CREATE", None, Config())
    assert decision.allowed and "NoClusterState" in decision.warnings[0]


def test_excluded_namespaces_and_exemptions_skip_policies(state):
    obj = deployment({"nodeName": "full", "containers": [container()]}, namespace="kube-system")
    assert evaluate(obj, "CREATE", state, Config()).allowed
    cfg = config_from_dict(
        {"exemptions": [{"namespaces": ["gpu-res*"], "users": ["system:serviceaccount:gpu-res:*"]}]}
    )
    obj = deployment({"nodeName": "full", "containers": [container()]}, namespace="gpu-res")
    assert evaluate(obj, "CREATE", state, cfg, user="system:serviceaccount:gpu-res:reserver").allowed
    assert not evaluate(obj, "CREATE", state, cfg, user="alice").allowed


def test_other_kinds_and_custom_jobs_pass_untouched(state):
    volcano_job = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "v"},
        "spec": {"template": {"spec": {"nodeName": "full"}}},
    }
    assert evaluate(volcano_job, "CREATE", state, Config()).allowed
    assert evaluate({"apiVersion": "v1", "kind": "ConfigMap"}, "CREATE", state, Config()).allowed


def test_malformed_quantity_in_a_template_names_the_full_field(state):
    obj = deployment({"containers": [container(requests={"cpu": "two"})]})
    decision = evaluate(obj, "CREATE", state, Config())
    assert decision.unreadable.field == "spec.template.spec.containers[0].resources.requests.cpu"
    assert decision.unchecked == ["deviceScheduler", "nodeAdmission"]


def test_an_unreadable_request_does_not_let_a_pinned_template_through(state):
    obj = deployment({"nodeName": "gpu-1", "containers": [container(requests={"cpu": "two"})]})
    decision = evaluate(obj, "CREATE", state, Config())
    assert [v.reason for v in decision.violations] == ["PinnedNodeName"]
    assert "Node capacity was not checked" in decision.violations[0].message


# -- scaling a workload already pinned ------------------------------------------------------


def test_scaling_a_pinned_workload_past_what_its_node_admits_is_warned():
    state = ClusterState()
    state.set_node(node_from(node("small", pods="3")))
    old = deployment({"nodeName": "small", "containers": [container()]})
    for i in range(2):
        running = pod(f"web-{i}", node_name="small")
        state.set_pod(running["metadata"]["uid"], pod_record(running))
    new = copy.deepcopy(old)
    new["spec"]["replicas"] = 5
    decision = evaluate(new, "UPDATE", state, Config(), old_object=old)
    assert decision.allowed  # existing objects stay updatable
    [warning] = decision.warnings
    assert warning.startswith(
        "[pinnedNodeName] PinnedNodeName: Deployment default/web scales from 2 to 5 pods"
    )
    assert "the kubelet on small would admit 1 of the 3 new pods and reject the others (OutOfpods" in warning
    new["spec"]["replicas"] = 3
    assert evaluate(new, "UPDATE", state, Config(), old_object=old).warnings == []


def test_scaling_a_custom_resources_pinned_task_is_warned_at_its_own_replicas():
    state = ClusterState()
    state.set_node(node_from(node("gpu-1", extra={"nvidia.com/gpu": "2"})))
    task = {
        "replicas": 1,
        "template": {
            "spec": {"nodeName": "gpu-1", "containers": [container(limits={"nvidia.com/gpu": "1"})]}
        },
    }
    old = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": {"tasks": [task]},
    }
    new = copy.deepcopy(old)
    new["spec"]["tasks"][0]["replicas"] = 4
    cfg = config(deviceScheduler={"mode": "off"})
    [warning] = evaluate(new, "UPDATE", state, cfg, old_object=old).warnings
    assert "(template spec.tasks[0].template) scales from 1 to 4 pods pinned to gpu-1" in warning
    assert "would admit 2 of the 3 new pods" in warning
