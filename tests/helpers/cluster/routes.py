"""Every rule of the shipped webhook configurations, one route at a time: which request each
(webhook, rule, resource) sends to the guard, and the configuration with only that route
taken out. ``test_cluster_box_routes.py`` proves each route is there by a request the guard
refuses (or repairs) through it and admits (or leaves alone) once the route is gone.

The operators' kinds are built here from their own API types (the ``source`` of each entry),
not from the guard's workload table, so a template the guard looks for in the wrong place is
a request it fails to judge.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .apiserver import Resource

SHIPPED = Path(__file__).resolve().parents[3] / "deploy" / "base" / "webhooks.yaml"
MUTATING = "MutatingWebhookConfiguration"


@dataclass(frozen=True)
class Route:
    """One resource of one rule of one webhook, as ``deploy/base/webhooks.yaml`` ships it."""

    webhook: str  # e.g. "pinned-templates.admit-guard.io"
    rule: int
    group: str
    resource: str
    mutating: bool

    @property
    def id(self) -> str:
        group = self.group or "core"
        return f"{self.webhook.split('.')[0]}:{group}/{self.resource}"


def shipped_routes() -> list[Route]:
    """Every route of the shipped configurations, read from deploy/ (no rendering needed)."""
    routes = []
    for doc in yaml.safe_load_all(SHIPPED.read_text()):
        for hook in doc["webhooks"]:
            for index, rule in enumerate(hook["rules"]):
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        routes.append(Route(hook["name"], index, group, resource, doc["kind"] == MUTATING))
    return routes


def without(configurations: list[dict[str, Any]], route: Route) -> list[dict[str, Any]]:
    """The configurations with ``route``'s resource taken out of its rule, nothing else."""
    changed = copy.deepcopy(configurations)
    for configuration in changed:
        for hook in configuration["webhooks"]:
            if hook["name"] == route.webhook:
                rule = hook["rules"][route.rule]
                assert route.resource in rule["resources"], (route, rule)
                rule["resources"] = [r for r in rule["resources"] if r != route.resource]
    return changed


def validating_only(configurations: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Without the mutating configuration: what reaches the validating webhooks unrepaired."""
    return [c for c in configurations if c["kind"] != MUTATING]


# -- the kinds a rule can name, and where each keeps its pod template ---------------------------


@dataclass(frozen=True)
class Kind:
    resource: Resource
    template: str  # the path of one pod template: dotted keys, ``name[0]`` the first item of a list
    source: str


def _kind(group: str, version: str, kind: str, template: str, source: str, namespaced: bool = True) -> Kind:
    return Kind(Resource(group, version, kind, namespaced), template, source)


RAY = "ray-project/kuberay ray-operator/apis/ray/v1"
KUBEFLOW = "kubeflow/training-operator pkg/apis/kubeflow.org/v1 ReplicaSpec.Template"
TRAINER = "kubeflow/trainer pkg/apis/trainer/v1alpha1/trainingruntime_types.go (a JobSetSpec)"
KINDS: dict[tuple[str, str], Kind] = {
    ("apps", "deployments"): _kind("apps", "v1", "Deployment", "spec.template", "apps/v1 DeploymentSpec"),
    ("apps", "replicasets"): _kind("apps", "v1", "ReplicaSet", "spec.template", "apps/v1 ReplicaSetSpec"),
    ("apps", "statefulsets"): _kind("apps", "v1", "StatefulSet", "spec.template", "apps/v1 StatefulSetSpec"),
    ("apps", "daemonsets"): _kind("apps", "v1", "DaemonSet", "spec.template", "apps/v1 DaemonSetSpec"),
    ("batch", "jobs"): _kind("batch", "v1", "Job", "spec.template", "batch/v1 JobSpec"),
    ("batch", "cronjobs"): _kind("batch", "v1", "CronJob", "spec.jobTemplate.spec.template",
                                 "batch/v1 CronJobSpec.JobTemplate"),
    ("", "replicationcontrollers"): _kind("", "v1", "ReplicationController", "spec.template",
                                          "core/v1 ReplicationControllerSpec"),
    ("", "podtemplates"): _kind("", "v1", "PodTemplate", "template", "core/v1 PodTemplate.Template"),
    ("batch.volcano.sh", "jobs"): _kind("batch.volcano.sh", "v1alpha1", "Job", "spec.tasks[0].template",
                                        "volcano-sh/apis pkg/apis/batch/v1alpha1/job.go TaskSpec.Template"),
    ("batch.volcano.sh", "cronjobs"): _kind(
        "batch.volcano.sh", "v1alpha1", "CronJob", "spec.jobTemplate.spec.tasks[0].template",
        "volcano-sh/apis pkg/apis/batch/v1alpha1 CronJobSpec.JobTemplate"),
    ("flow.volcano.sh", "jobtemplates"): _kind(
        "flow.volcano.sh", "v1alpha1", "JobTemplate", "spec.tasks[0].template",
        "volcano-sh/apis pkg/apis/flow/v1alpha1/jobtemplate_types.go (a batch JobSpec)"),
    ("jobset.x-k8s.io", "jobsets"): _kind(
        "jobset.x-k8s.io", "v1alpha2", "JobSet", "spec.replicatedJobs[0].template.spec.template",
        "kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go ReplicatedJob.Template"),
    ("kubeflow.org", "pytorchjobs"): _kind("kubeflow.org", "v1", "PyTorchJob",
                                           "spec.pytorchReplicaSpecs.Master.template", KUBEFLOW),
    ("kubeflow.org", "tfjobs"): _kind("kubeflow.org", "v1", "TFJob", "spec.tfReplicaSpecs.Worker.template",
                                      KUBEFLOW),
    ("kubeflow.org", "xgboostjobs"): _kind("kubeflow.org", "v1", "XGBoostJob",
                                           "spec.xgbReplicaSpecs.Master.template", KUBEFLOW),
    ("kubeflow.org", "paddlejobs"): _kind("kubeflow.org", "v1", "PaddleJob",
                                          "spec.paddleReplicaSpecs.Worker.template", KUBEFLOW),
    ("kubeflow.org", "jaxjobs"): _kind("kubeflow.org", "v1", "JAXJob", "spec.jaxReplicaSpecs.Worker.template",
                                       KUBEFLOW),
    ("kubeflow.org", "mpijobs"): _kind("kubeflow.org", "v2beta1", "MPIJob",
                                       "spec.mpiReplicaSpecs.Launcher.template",
                                       "kubeflow/mpi-operator pkg/apis/kubeflow/v2beta1/types.go"),
    ("ray.io", "rayclusters"): _kind("ray.io", "v1", "RayCluster", "spec.workerGroupSpecs[0].template",
                                     f"{RAY}/raycluster_types.go WorkerGroupSpec.Template"),
    ("ray.io", "rayjobs"): _kind("ray.io", "v1", "RayJob", "spec.rayClusterSpec.headGroupSpec.template",
                                 f"{RAY}/rayjob_types.go RayClusterSpec"),
    ("ray.io", "rayservices"): _kind("ray.io", "v1", "RayService",
                                     "spec.rayClusterConfig.headGroupSpec.template",
                                     f"{RAY}/rayservice_types.go RayClusterSpec"),
    ("ray.io", "raycronjobs"): _kind("ray.io", "v1", "RayCronJob", "spec.jobTemplate.submitterPodTemplate",
                                     f"{RAY}/raycronjob_types.go JobTemplate (a RayJobSpec)"),
    ("leaderworkerset.x-k8s.io", "leaderworkersets"): _kind(
        "leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet", "spec.leaderWorkerTemplate.workerTemplate",
        "kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go"),
    ("disaggregatedset.x-k8s.io", "disaggregatedsets"): _kind(
        "disaggregatedset.x-k8s.io", "v1", "DisaggregatedSet",
        "spec.roles[0].spec.leaderWorkerTemplate.leaderTemplate",
        "kubernetes-sigs/lws api/disaggregatedset/v1/disaggregatedset_types.go"),
    ("trainer.kubeflow.org", "clustertrainingruntimes"): _kind(
        "trainer.kubeflow.org", "v1alpha1", "ClusterTrainingRuntime",
        "spec.template.spec.replicatedJobs[0].template.spec.template", TRAINER, namespaced=False),
    ("trainer.kubeflow.org", "trainingruntimes"): _kind(
        "trainer.kubeflow.org", "v1alpha1", "TrainingRuntime",
        "spec.template.spec.replicatedJobs[0].template.spec.template", TRAINER),
}  # fmt: skip


def store_name(group: str, resource: str) -> str:
    """The double's name for a resource: the plural alone for the built-in kinds it serves,
    ``<plural>.<group>`` for an operator's (as ``kubectl get jobs.batch.volcano.sh``)."""
    builtin = group in ("", "apps", "batch")
    return resource if builtin else f"{resource}.{group}"


def holding(group: str, resource: str, name: str, namespace: str, template: dict[str, Any]) -> dict[str, Any]:
    """An object of the kind that keeps ``template`` where its API type puts it."""
    kind = KINDS[(group, resource)]
    obj: dict[str, Any] = {"apiVersion": kind.resource.api_version, "kind": kind.resource.kind,
                           "metadata": {"name": name}}  # fmt: skip
    if kind.resource.namespaced:
        obj["metadata"]["namespace"] = namespace
    node: Any = obj
    steps = kind.template.split(".")
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        match = re.fullmatch(r"(\w+)\[0\]", step)
        value = copy.deepcopy(template) if last else {}
        if match:
            node[match.group(1)] = [value]
        else:
            node[step] = value
        node = value
    return obj


def template_in(obj: dict[str, Any], group: str, resource: str) -> dict[str, Any]:
    """The pod template ``holding`` put in ``obj`` (as stored, after any patch)."""
    node: Any = obj
    for step in KINDS[(group, resource)].template.split("."):
        match = re.fullmatch(r"(\w+)\[0\]", step)
        node = node[match.group(1)][0] if match else node[step]
    return node
