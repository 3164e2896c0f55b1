"""Custom resources through every policy: each template of a table kind is judged like a built-in
template (its path named, patched at its own JSON pointer, with its effective scheduler), and
users add kinds in config. The manifests in tests/fixtures/workloads/ are shaped like each project's own
examples; each file names the one it follows."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonpatch
import pytest
import yaml

from tests.helpers.builders import node
from tests.helpers.paths import FIXTURES
from webhook.config import ConfigError, config_from_dict
from webhook.engine import evaluate
from webhook.kube.workloads import BUILT_IN, display_path
from webhook.state import ClusterState, node_from

MANIFESTS = FIXTURES / "workloads"
GPU = "nvidia.com/gpu"
OWNED_BY_KAI = {"deviceScheduler": {"owners": {GPU: "kai-scheduler"}}}


def manifests() -> list[Path]:
    return sorted(MANIFESTS.glob("*.yaml"))


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def config(**policies):
    return config_from_dict({"policies": policies})


def gpu_templates(obj: dict):
    return [t for t in BUILT_IN.shapes(obj) if "nvidia.com/gpu" in str(t.shape.spec)]


@pytest.fixture(scope="module")
def state() -> ClusterState:
    s = ClusterState()
    s.set_node(node_from(node("gpu-1", cpu="64", memory="512Gi", extra={GPU: "8"})))
    return s


def test_every_built_in_kind_has_an_example():
    kinds = {(w.group, w.kind) for w in BUILT_IN.kinds}
    examples = {(BUILT_IN.kind_of(o).group, BUILT_IN.kind_of(o).kind) for o in map(load, manifests())}
    assert examples == kinds


@pytest.mark.parametrize("path", manifests(), ids=lambda p: p.stem)
def test_a_pinned_template_is_denied_naming_its_path(path, state):
    obj = load(path)
    first = BUILT_IN.shapes(obj)[0]
    pinned = jsonpatch.apply_patch(
        obj, [{"op": "add", "path": f"{first.shape.path}/spec/nodeName", "value": "gpu-1"}]
    )
    decision = evaluate(pinned, "CREATE", state, config())
    where = f"(template {display_path(first.shape.path)})"
    [violation] = [v for v in decision.violations if v.reason == "PinnedNodeName" and where in v.message]
    assert violation.node == "gpu-1"


@pytest.mark.parametrize("path", manifests(), ids=lambda p: p.stem)
def test_fix_mode_moves_the_pin_to_node_affinity_at_the_templates_own_pointer(path, state):
    obj = load(path)
    last = BUILT_IN.shapes(obj)[-1]
    pointer = f"{last.shape.path}/spec"
    pinned = jsonpatch.apply_patch(obj, [{"op": "add", "path": f"{pointer}/nodeName", "value": "gpu-1"}])
    decision = evaluate(pinned, "CREATE", state, config(pinnedNodeName={"mode": "fix"}))
    assert decision.allowed, decision.violations
    fixed = jsonpatch.apply_patch(copy.deepcopy(pinned), decision.patch)
    spec = jsonpatch.JsonPointer(pointer).resolve(fixed)
    assert "nodeName" not in spec
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}]
    assert all(op["path"].startswith(last.shape.path) for op in decision.patch)


@pytest.mark.parametrize("path", manifests(), ids=lambda p: p.stem)
def test_a_gpu_template_on_the_wrong_scheduler_is_denied_naming_its_path(path, state):
    obj = load(path)
    templates = gpu_templates(obj)
    assert templates, f"{path.name} asks for no GPU"
    decision = evaluate(obj, "CREATE", state, config(**OWNED_BY_KAI))
    mixed = [v.message for v in decision.violations if v.reason == "MixedDeviceScheduler"]
    assert len(mixed) == len(templates)
    for template, message in zip(templates, mixed, strict=True):
        assert f"(template {template.where}) uses schedulerName {template.scheduler!r}" in message


@pytest.mark.parametrize("path", manifests(), ids=lambda p: p.stem)
def test_fix_mode_gives_default_scheduler_templates_the_owner_and_leaves_chosen_ones(path, state):
    obj = load(path)
    decision = evaluate(
        obj, "CREATE", state, config(deviceScheduler={"mode": "fix", "owners": {GPU: "kai-scheduler"}})
    )
    fixed = jsonpatch.apply_patch(copy.deepcopy(obj), decision.patch or [])
    for before, after in zip(gpu_templates(obj), gpu_templates(fixed), strict=True):
        if before.scheduler == "default-scheduler":
            assert after.shape.spec["schedulerName"] == "kai-scheduler"
        else:  # chosen on purpose (Volcano's spec.schedulerName, or the template's own)
            assert after.scheduler == before.scheduler
    assert decision.allowed is all(t.scheduler == "default-scheduler" for t in gpu_templates(obj))


def test_a_volcano_jobs_templates_get_its_scheduler_when_they_name_none(state):
    job = load(MANIFESTS / "volcano-job.yaml")
    cfg = config(deviceScheduler={"owners": {GPU: "volcano"}})
    assert not [
        v for v in evaluate(job, "CREATE", state, cfg).violations if v.reason == "MixedDeviceScheduler"
    ]
    job["spec"]["schedulerName"] = "default-scheduler"
    decision = evaluate(job, "CREATE", state, cfg)
    [mixed] = [v for v in decision.violations if v.reason == "MixedDeviceScheduler"]
    assert "(template spec.tasks[0].template) uses schedulerName 'default-scheduler'" in mixed.message


def test_an_update_that_changes_a_volcano_jobs_scheduler_is_judged_again(state):
    old = load(MANIFESTS / "volcano-job.yaml")
    new = copy.deepcopy(old)
    cfg = config(deviceScheduler={"owners": {GPU: "volcano"}})
    assert "MixedDeviceScheduler" not in [
        v.reason for v in evaluate(new, "UPDATE", state, cfg, old_object=old).violations
    ]
    new["spec"]["schedulerName"] = "default-scheduler"
    decision = evaluate(new, "UPDATE", state, cfg, old_object=old)
    assert "MixedDeviceScheduler" in [v.reason for v in decision.violations]


def test_a_custom_resource_whose_paths_match_nothing_is_allowed(state):
    obj = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "empty"}, "spec": {}}
    assert evaluate(obj, "CREATE", state, config()).allowed


# -- kinds users add ------------------------------------------------------------------------

TRAINER = {
    "apiVersion": "example.com/v1",
    "kind": "Trainer",
    "metadata": {"name": "t", "namespace": "ml"},
    "spec": {
        "scheduler": "volcano",
        "roles": [
            {"template": {"spec": {"containers": [{"name": "a", "resources": {"limits": {GPU: "1"}}}]}}},
            {"template": {"spec": {"nodeName": "gpu-1", "containers": [{"name": "b"}]}}},
        ],
    },
}
ADDED = [
    {
        "apiVersion": "example.com/v1",
        "kind": "Trainer",
        "templates": ["spec.roles[*].template"],
        "schedulerName": "spec.scheduler",
    }
]


def test_a_kind_added_in_config_is_judged_like_a_built_in_one(state):
    cfg = config_from_dict({"workloads": ADDED, "policies": OWNED_BY_KAI})
    decision = evaluate(TRAINER, "CREATE", state, cfg)
    messages = {v.reason: v.message for v in decision.violations}
    assert (
        "Trainer ml/t (template spec.roles[1].template) sets spec.roles[1].template.spec.nodeName"
        in messages["PinnedNodeName"]
    )
    assert (
        "(template spec.roles[0].template) uses schedulerName 'volcano'" in messages["MixedDeviceScheduler"]
    )
    assert evaluate(TRAINER, "CREATE", state, config()).allowed  # not in the table: not a workload


def test_a_malformed_path_in_config_is_an_error_naming_it():
    bad = [{**ADDED[0], "templates": ["spec.roles[0].template"], "schedulerName": "spec..scheduler"}]
    with pytest.raises(ConfigError) as err:
        config_from_dict({"workloads": bad})
    assert "workloads[0].templates[0]: 'spec.roles[0].template': segment 'roles[0]'" in str(err.value)
    assert "workloads[0].schedulerName: 'spec..scheduler'" in str(err.value)


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        (
            {"apiVersion": "v1", "kind": "Thing", "templates": ["spec.t"]},
            "workloads[0].apiVersion: must be group/version",
        ),
        (
            {"apiVersion": "apps/v1", "kind": "Deployment", "templates": ["spec.t"]},
            "workloads[0].kind: Deployment of apps/v1 is built in",
        ),
        ({"apiVersion": "a.io/v1", "kind": "T"}, "workloads[0].templates: must be a list"),
        (
            {"apiVersion": "a.io/v1", "kind": "T", "templates": []},
            "workloads[0].templates: must list at least one path",
        ),
        (
            {"apiVersion": "a.io/v1", "kind": "T", "templates": ["x"], "scheduler": "y"},
            "workloads[0].scheduler: unknown field",
        ),
    ],
)
def test_workloads_config_is_strict(entry, problem):
    with pytest.raises(ConfigError, match=problem.replace("[", r"\[").replace("]", r"\]")):
        config_from_dict({"workloads": [entry]})


def test_a_config_entry_for_a_built_in_custom_resource_replaces_its_paths(state):
    ray = load(MANIFESTS / "raycluster.yaml")
    cfg = config_from_dict(
        {
            "workloads": [
                {
                    "apiVersion": "ray.io/v1",
                    "kind": "RayCluster",
                    "templates": ["spec.headGroupSpec.template"],
                }
            ],
        }
    )
    assert [t.where for t in cfg.workloads.shapes(ray)] == ["spec.headGroupSpec.template"]


# -- the webhook ----------------------------------------------------------------------------


def admission_review(obj: dict, group: str, version: str, kind: str) -> bytes:
    import orjson

    return orjson.dumps({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u", "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": f"{kind.lower()}s"},
            "namespace": "ml", "operation": "CREATE", "userInfo": {"username": "alice"}, "object": obj,
        },
    })  # fmt: skip


def test_the_webhook_denies_a_volcano_job_and_the_mutating_webhook_patches_its_task(state):
    from webhook.admission import MUTATE, VALIDATE, parse_review, review

    job = load(MANIFESTS / "volcano-job.yaml")
    request = parse_review(admission_review(job, "batch.volcano.sh", "v1alpha1", "Job"))
    denied = review(request, VALIDATE, state, config())
    assert denied.response["allowed"] is False
    assert denied.response["status"]["reason"] == "PinnedNodeName"
    assert "Job ml/test-job (template spec.tasks[1].template)" in denied.response["status"]["message"]
    fixed = review(request, MUTATE, state, config(pinnedNodeName={"mode": "fix"}))
    assert fixed.response["patchType"] == "JSONPatch"
    assert fixed.reasons == ["PinnedNodeName"]
