"""The workload table: where custom resources keep the pods their controllers create, and which
scheduler those pods really get. Manifests in tests/fixtures/workloads/ are shaped like each project's own
examples (each file says which)."""

from __future__ import annotations

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.paths import FIXTURES, ROOT
from webhook.kube.errors import FieldError
from webhook.kube.workloads import WORKLOADS, FieldPath, template_shapes, workload_kind

MANIFESTS = FIXTURES / "workloads"


def shapes_of(name: str) -> list[tuple[str, str]]:
    obj = yaml.safe_load((MANIFESTS / name).read_text())
    workload = workload_kind(obj, WORKLOADS)
    assert workload is not None, name
    return [(t.shape.path, t.scheduler) for t in template_shapes(obj, workload)]


def test_a_volcano_jobs_tasks_get_the_jobs_scheduler_unless_their_template_names_one():
    assert shapes_of("volcano-job.yaml") == [
        ("/spec/tasks/0/template", "volcano"),
        ("/spec/tasks/1/template", "default-scheduler"),
    ]


def test_a_volcano_job_without_a_scheduler_name_gets_volcanos_default():
    obj = yaml.safe_load((MANIFESTS / "volcano-job.yaml").read_text())
    del obj["spec"]["schedulerName"]
    [first, _] = template_shapes(obj, workload_kind(obj, WORKLOADS))
    assert first.scheduler == "volcano"


def test_kubeflow_replica_specs_are_a_map_of_templates_that_keep_their_own_scheduler():
    assert shapes_of("pytorchjob.yaml") == [
        ("/spec/pytorchReplicaSpecs/Master/template", "default-scheduler"),
        ("/spec/pytorchReplicaSpecs/Worker/template", "default-scheduler"),
    ]


def test_a_ray_cluster_has_a_head_template_and_one_per_worker_group():
    assert [path for path, _ in shapes_of("raycluster.yaml")] == [
        "/spec/headGroupSpec/template",
        "/spec/workerGroupSpecs/0/template",
        "/spec/workerGroupSpecs/1/template",
    ]


def test_a_leader_worker_set_has_leader_and_worker_templates():
    assert shapes_of("lws.yaml") == [
        ("/spec/leaderWorkerTemplate/leaderTemplate", "default-scheduler"),
        ("/spec/leaderWorkerTemplate/workerTemplate", "volcano"),
    ]


def test_a_jobset_template_is_the_pod_template_inside_each_replicated_jobs_job_template():
    assert [path for path, _ in shapes_of("jobset.yaml")] == [
        "/spec/replicatedJobs/0/template/spec/template",
        "/spec/replicatedJobs/1/template/spec/template",
    ]


def test_a_batch_v1_job_is_not_mistaken_for_a_volcano_job():
    assert workload_kind({"apiVersion": "batch/v1", "kind": "Job"}, WORKLOADS) is None


def test_a_path_that_matches_nothing_means_no_template_there():
    obj = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "spec": {}}
    assert template_shapes(obj, workload_kind(obj, WORKLOADS)) == []


def test_a_template_that_is_not_a_mapping_is_a_field_error_naming_it():
    obj = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "spec": {"tasks": [{"template": "x"}]}}
    with pytest.raises(FieldError) as err:
        template_shapes(obj, workload_kind(obj, WORKLOADS))
    assert "spec.tasks[0].template" in str(err.value)


@pytest.mark.parametrize("bad", ["", "spec..template", "spec.tasks[0].template", "spec.ta sks", "spec.[*]"])
def test_a_malformed_path_is_refused_naming_it(bad):
    with pytest.raises(ValueError):
        FieldPath.parse(bad)


def test_map_keys_are_escaped_in_json_pointers():
    path = FieldPath.parse("spec.*.template")
    assert [p for p, _ in path.find({"spec": {"a/b~c": {"template": {}}}})] == ["/spec/a~1b~0c/template"]


@given(st.lists(st.dictionaries(st.sampled_from(["template", "x"]), st.just({}), max_size=2), max_size=5))
def test_a_list_path_finds_one_template_per_item_that_has_one(items):
    found = list(FieldPath.parse("spec.tasks[*].template").find({"spec": {"tasks": items}}))
    assert [p for p, _ in found] == [
        f"/spec/tasks/{i}/template" for i, item in enumerate(items) if "template" in item
    ]


def test_every_built_in_kind_names_its_source():
    assert all(w.source for w in WORKLOADS)


def test_the_docs_document_every_built_in_kind_with_its_paths_and_source():
    readme = (ROOT / "docs" / "reference" / "workloads.md").read_text()
    for workload in WORKLOADS:
        paths = ", ".join(f"`{p.text}`" for p in workload.templates)
        assert f"| `{workload.group}` | {workload.kind} | {paths} |" in readme, workload.kind
        assert workload.source in readme
