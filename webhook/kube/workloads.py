"""Where a workload keeps the pods it creates.

Built-in kinds are recognised by API group as well as kind, so a custom
``batch.volcano.sh/v1alpha1 Job`` is not mistaken for a ``batch/v1 Job``. Custom resources of
the operators GPU clusters run (Volcano, JobSet, Kubeflow, KubeRay, LeaderWorkerSet and its
DisaggregatedSet, Kubeflow Trainer) are found through a table of template paths
(``WORKLOADS``), which users extend in config (``workloads:``) without code.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import MAPPING, FieldError

# kind -> (API groups it is served from, path from the object to the pod template)
_TEMPLATES: dict[str, tuple[frozenset[str], tuple[str, ...]]] = {
    "Deployment": (frozenset({"apps", "extensions"}), ("spec", "template")),
    "ReplicaSet": (frozenset({"apps", "extensions"}), ("spec", "template")),
    "StatefulSet": (frozenset({"apps"}), ("spec", "template")),
    "DaemonSet": (frozenset({"apps", "extensions"}), ("spec", "template")),
    "Job": (frozenset({"batch"}), ("spec", "template")),
    "CronJob": (frozenset({"batch"}), ("spec", "jobTemplate", "spec", "template")),
    "ReplicationController": (frozenset({""}), ("spec", "template")),
    "PodTemplate": (frozenset({""}), ("template",)),
}


def is_built_in(group: str, kind: str) -> bool:
    """A Pod or a built-in controller: their templates are where Kubernetes puts them."""
    entry = _TEMPLATES.get(kind)
    return (kind == "Pod" and group == "") or (entry is not None and group in entry[0])


@dataclass(frozen=True, slots=True)
class PodShape:
    """The pod an object stands for: its metadata and spec, and where they live.

    ``path`` is the JSON-pointer prefix of the pod (``""`` for a Pod, ``/spec/template`` for a
    Deployment), so policies can write patches that land in the right place.
    """

    kind: str
    metadata: Mapping[str, Any]
    spec: Mapping[str, Any]
    path: str

    @property
    def is_template(self) -> bool:
        return self.kind != "Pod"


def api_group(obj: Mapping[str, Any]) -> str:
    api_version = obj.get("apiVersion")
    if not isinstance(api_version, str):
        return ""
    return api_version.rsplit("/", 1)[0] if "/" in api_version else ""


def pod_shape(obj: Mapping[str, Any]) -> PodShape | None:
    """The pod inside ``obj``, or None when ``obj`` is not a pod-creating kind."""
    kind = obj.get("kind")
    group = api_group(obj)
    if kind == "Pod" and group == "":
        return PodShape("Pod", _mapping(obj, ("metadata",)), _mapping(obj, ("spec",)), "")
    entry = _TEMPLATES.get(kind) if isinstance(kind, str) else None
    if entry is None or group not in entry[0]:
        return None
    path = entry[1]
    template = _mapping(obj, path)
    return PodShape(
        kind,
        _mapping(template, ("metadata",), ".".join(path)),
        _mapping(template, ("spec",), ".".join(path)),
        "/" + "/".join(path),
    )


def _mapping(obj: Mapping[str, Any], path: tuple[str, ...], prefix: str = "") -> Mapping[str, Any]:
    """Follow ``path``; a missing step is an empty mapping, a non-mapping step an error."""
    current: Any = obj
    walked = prefix
    for key in path:
        walked = f"{walked}.{key}" if walked else key
        current = current.get(key) if isinstance(current, MAPPING) else None
        if current is None:
            return {}
        if not isinstance(current, MAPPING):
            raise FieldError(walked, "must be a mapping")
    return current


# -- custom resources: a table of template paths -------------------------------------------

_SEGMENT = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_-]*)(?P<list>\[\*\])?|(?P<values>\*)")


@dataclass(frozen=True, slots=True)
class FieldPath:
    """A path into an object: ``spec.tasks[*].template`` (``[*]``: every item of a list) or
    ``spec.pytorchReplicaSpecs.*.template`` (``*``: every value of a map). A path that matches
    nothing in an object means that object has no template there, not an error."""

    text: str
    steps: tuple[tuple[str, str], ...]  # ("key", name), ("items", name) or ("values", "")

    @classmethod
    def parse(cls, text: str) -> FieldPath:
        """Raises ``ValueError`` naming the segment that is not a field name, ``name[*]`` or ``*``."""
        if not isinstance(text, str) or not text:
            raise ValueError("must be a path like spec.tasks[*].template")
        steps = []
        for segment in text.split("."):
            match = _SEGMENT.fullmatch(segment)
            if match is None:
                raise ValueError(f"{text!r}: segment {segment!r} is not a field name, name[*] or *")
            if match["values"]:
                steps.append(("values", ""))
            else:
                steps.append(("items" if match["list"] else "key", match["name"]))
        return cls(text, tuple(steps))

    def find(self, obj: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
        """Every (JSON pointer, value) the path reaches in ``obj``."""
        found: list[tuple[str, Any]] = [("", obj)]
        for kind, name in self.steps:
            reached = []
            for pointer, value in found:
                if not isinstance(value, MAPPING):
                    continue
                if kind == "values":
                    reached.extend((f"{pointer}/{_escape(k)}", v) for k, v in value.items())
                    continue
                child = value.get(name)
                if kind == "key":
                    if child is not None:
                        reached.append((f"{pointer}/{_escape(name)}", child))
                elif isinstance(child, list):
                    reached.extend((f"{pointer}/{_escape(name)}/{i}", item) for i, item in enumerate(child))
            found = reached
        return iter(found)

    def first(self, obj: Mapping[str, Any]) -> Any:
        return next((value for _, value in self.find(obj)), None)


def _escape(key: Any) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True, slots=True)
class WorkloadKind:
    """A custom resource whose controller creates pods from templates inside it.

    ``scheduler_name``: the object's field whose value a pod gets when its template names no
    scheduler (Volcano's ``spec.schedulerName``), and ``scheduler_default`` when that field is
    empty too; None: pods keep their template's ``schedulerName`` (default-scheduler if unset).
    """

    group: str
    kind: str
    templates: tuple[FieldPath, ...]
    scheduler_name: FieldPath | None = None
    scheduler_default: str | None = None
    source: str = ""  # where the paths come from, for the docs
    # The versions the operator's CRD serves, the stored one first; empty: any (a kind users
    # add in config, whose CRD the guard does not know).
    versions: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, api_version: str, kind: str, templates, scheduler_name=None, default=None, source="", served=()
    ):
        group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
        scheduler = FieldPath.parse(scheduler_name) if scheduler_name else None
        templates = tuple(map(FieldPath.parse, templates))
        return cls(group, kind, templates, scheduler, default, source, tuple(served))

    def version_problem(self, api_version: str) -> tuple[str, str] | None:
        """Why the API server would not take this kind in ``api_version`` (its CRD serves other
        versions), as (field, message); None when it is served, or any version is taken."""
        version = api_version.rsplit("/", 1)[-1]
        if not self.versions or version in self.versions:
            return None
        served = ", ".join(self.versions)
        return "apiVersion", (
            f"the API server does not serve {self.kind} in {api_version} (its CRD serves {served}; "
            f"{self.source}): use apiVersion: {self.group}/{self.versions[0]}"
        )


_RAY_CLUSTER = ("headGroupSpec.template", "workerGroupSpecs[*].template")
_RAY_JOB = (*(f"rayClusterSpec.{p}" for p in _RAY_CLUSTER), "submitterPodTemplate")
_KUBEFLOW = "kubeflow/training-operator pkg/apis/kubeflow.org/v1 (ReplicaSpec.Template)"
_VOLCANO_JOB = "volcano-sh/apis pkg/apis/batch/v1alpha1/job.go (JobSpec.SchedulerName, TaskSpec.Template)"
_LWS = ("leaderWorkerTemplate.leaderTemplate", "leaderWorkerTemplate.workerTemplate")
# The versions each CRD serves (its config/crd bases): KubeRay still serves the deprecated
# v1alpha1 of its first three kinds; MPIJob is v2beta1 of mpi-operator and v1 of the training
# operator, with the same mpiReplicaSpecs.
_V1, _V1ALPHA1, _RAY = ("v1",), ("v1alpha1",), ("v1", "v1alpha1")

# Each project's own API types; the citations say where. Scheduler names: Volcano's Job
# controller gives a pod the Job's spec.schedulerName when its template has none
# (pkg/controllers/job/job_controller_util.go createJobPod; the Volcano webhook defaults it to
# "volcano"). Kubeflow and KubeRay pick gang schedulers by operator flags, not object fields;
# JobSet, LeaderWorkerSet and Trainer pods keep their templates' schedulerName.
WORKLOADS: tuple[WorkloadKind, ...] = (
    WorkloadKind.of(
        "batch.volcano.sh/v1alpha1", "Job", ["spec.tasks[*].template"], "spec.schedulerName", "volcano",
        _VOLCANO_JOB, _V1ALPHA1,
    ),
    WorkloadKind.of(
        "batch.volcano.sh/v1alpha1", "CronJob", ["spec.jobTemplate.spec.tasks[*].template"],
        "spec.jobTemplate.spec.schedulerName", "volcano",
        "volcano-sh/apis pkg/apis/batch/v1alpha1 (CronJobSpec.JobTemplate)", _V1ALPHA1,
    ),
    # A JobFlow creates a Volcano Job from each JobTemplate's spec (a batch JobSpec).
    WorkloadKind.of(
        "flow.volcano.sh/v1alpha1", "JobTemplate", ["spec.tasks[*].template"], "spec.schedulerName",
        "volcano", "volcano-sh/apis pkg/apis/flow/v1alpha1/jobtemplate_types.go (Spec: batch JobSpec)",
        _V1ALPHA1,
    ),
    WorkloadKind.of(
        "jobset.x-k8s.io/v1alpha2", "JobSet", ["spec.replicatedJobs[*].template.spec.template"],
        source="kubernetes-sigs/jobset api/jobset/v1alpha2/jobset_types.go (ReplicatedJob.Template)",
        served=("v1alpha2",),
    ),
    *(
        WorkloadKind.of("kubeflow.org/v1", kind, [f"spec.{field}.*.template"], source=_KUBEFLOW, served=_V1)
        for kind, field in (
            ("PyTorchJob", "pytorchReplicaSpecs"),
            ("TFJob", "tfReplicaSpecs"),
            ("XGBoostJob", "xgbReplicaSpecs"),
            ("PaddleJob", "paddleReplicaSpecs"),
            ("JAXJob", "jaxReplicaSpecs"),
        )
    ),
    WorkloadKind.of(
        "kubeflow.org/v2beta1", "MPIJob", ["spec.mpiReplicaSpecs.*.template"],
        source="kubeflow/mpi-operator pkg/apis/kubeflow/v2beta1/types.go (MPIReplicaSpecs)",
        served=("v2beta1", "v1"),
    ),
    WorkloadKind.of(
        "ray.io/v1", "RayCluster", [f"spec.{p}" for p in _RAY_CLUSTER],
        source="ray-project/kuberay ray-operator/apis/ray/v1/raycluster_types.go", served=_RAY,
    ),
    WorkloadKind.of(
        "ray.io/v1", "RayJob", [f"spec.{p}" for p in _RAY_JOB],
        source="ray-project/kuberay ray-operator/apis/ray/v1/rayjob_types.go", served=_RAY,
    ),
    WorkloadKind.of(
        "ray.io/v1", "RayService", [f"spec.rayClusterConfig.{p}" for p in _RAY_CLUSTER],
        source="ray-project/kuberay ray-operator/apis/ray/v1/rayservice_types.go", served=_RAY,
    ),
    WorkloadKind.of(
        "ray.io/v1", "RayCronJob", [f"spec.jobTemplate.{p}" for p in _RAY_JOB],
        source="ray-project/kuberay ray-operator/apis/ray/v1/raycronjob_types.go (JobTemplate: a RayJobSpec)",
        served=_V1,
    ),
    WorkloadKind.of(
        "leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", [f"spec.{p}" for p in _LWS],
        source="kubernetes-sigs/lws api/leaderworkerset/v1/leaderworkerset_types.go", served=_V1,
    ),
    WorkloadKind.of(
        "disaggregatedset.x-k8s.io/v1", "DisaggregatedSet", [f"spec.roles[*].spec.{p}" for p in _LWS],
        source="kubernetes-sigs/lws api/disaggregatedset/v1/disaggregatedset_types.go "
        "(DisaggregatedRoleSpec: a LeaderWorkerSetTemplateSpec)",
        served=_V1,
    ),
    *(
        WorkloadKind.of(
            "trainer.kubeflow.org/v1alpha1", kind,
            ["spec.template.spec.replicatedJobs[*].template.spec.template"],
            source="kubeflow/trainer pkg/apis/trainer/v1alpha1/trainingruntime_types.go (a JobSet template)",
            served=_V1ALPHA1,
        )
        for kind in ("ClusterTrainingRuntime", "TrainingRuntime")
    ),
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class TemplateShape:
    """One pod template of a custom resource: the pod, and the scheduler its pods really get.

    ``where``: the template's field as people write it (``spec.tasks[0].template``), for the
    messages about a custom resource; "" for a Pod or a built-in controller (one template)."""

    shape: PodShape
    scheduler: str
    where: str = ""


def workload_kind(obj: Mapping[str, Any], table: tuple[WorkloadKind, ...]) -> WorkloadKind | None:
    kind = obj.get("kind")
    group = api_group(obj)
    return next((w for w in table if w.kind == kind and w.group == group), None)


def template_shapes(obj: Mapping[str, Any], workload: WorkloadKind) -> list[TemplateShape]:
    """Every pod template of a custom resource, with its JSON pointer and effective scheduler."""
    field = workload.scheduler_name.first(obj) if workload.scheduler_name else None
    fallback = field if isinstance(field, str) and field else workload.scheduler_default
    shapes = []
    for path in workload.templates:
        for pointer, template in path.find(obj):
            where = display_path(pointer)
            if not isinstance(template, MAPPING):
                raise FieldError(where, "must be a mapping (a pod template)")
            shape = PodShape(
                workload.kind,
                _mapping(template, ("metadata",), where),
                _mapping(template, ("spec",), where),
                pointer,
            )
            own = shape.spec.get("schedulerName")
            scheduler = own if isinstance(own, str) and own else (fallback or "default-scheduler")
            shapes.append(TemplateShape(shape, scheduler, display_path(pointer)))
    return shapes


def display_path(pointer: str) -> str:
    """A JSON pointer as people write the field: ``/spec/tasks/0/template`` → ``spec.tasks[0].template``."""
    parts = []
    for step in pointer.lstrip("/").split("/"):
        step = step.replace("~1", "/").replace("~0", "~")
        if step.isdigit() and parts:
            parts[-1] += f"[{step}]"
        else:
            parts.append(step)
    return ".".join(parts)


@dataclass(frozen=True, slots=True)
class WorkloadTable:
    """The kinds whose objects hold pod templates: the built-in controllers, then the custom
    resources of ``WORKLOADS`` and those users add in config (``workloads:``), found by API
    group and kind in one dictionary lookup."""

    kinds: tuple[WorkloadKind, ...]
    _by_kind: Mapping[tuple[str, str], WorkloadKind] = field(compare=False, repr=False)

    @classmethod
    def of(cls, kinds: Iterable[WorkloadKind]) -> WorkloadTable:
        """A later entry for the same group and kind replaces an earlier one (a user's own paths
        for a built-in custom resource)."""
        by_kind = {(k.group, k.kind): k for k in kinds}
        return cls(tuple(by_kind.values()), by_kind)

    def version_problem(self, obj: Mapping[str, Any]) -> tuple[str, str] | None:
        """Why the API server would not take ``obj``: a kind of this table in a version its
        CRD does not serve (a Volcano ``batch.volcano.sh/v1`` Job), as (field, message)."""
        workload = self.kind_of(obj)
        api_version = obj.get("apiVersion")
        if workload is None or not isinstance(api_version, str):
            return None
        return workload.version_problem(api_version)

    def kind_of(self, obj: Mapping[str, Any]) -> WorkloadKind | None:
        kind = obj.get("kind")
        return self._by_kind.get((api_group(obj), kind)) if isinstance(kind, str) else None

    def creates_pods(self, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj`` is a Pod, a built-in controller or a kind of this table."""
        kind = obj.get("kind")
        if not isinstance(kind, str):
            return False
        group = api_group(obj)
        return is_built_in(group, kind) or (group, kind) in self._by_kind

    def shapes(self, obj: Mapping[str, Any]) -> list[TemplateShape] | None:
        """Every pod ``obj`` stands for, with the scheduler its pods get: one for a Pod or a
        built-in controller, one per template of a custom resource (none when its paths match
        nothing); None when ``obj`` creates no pods. Raises ``FieldError`` naming the field."""
        shape = pod_shape(obj)
        if shape is not None:
            own = shape.spec.get("schedulerName")
            return [TemplateShape(shape, own if isinstance(own, str) and own else "default-scheduler")]
        workload = self.kind_of(obj)
        return None if workload is None else template_shapes(obj, workload)


BUILT_IN = WorkloadTable.of(WORKLOADS)
