"""The workload table's cost (issue 20): what it adds to ``check`` on 40,000 Deployments, and
``check`` on 5,000 custom resources of the operators' kinds.

1. Built-in kinds: 40,000 parsed Deployments through ``evaluate`` and the dry run's ``Result``
   against the example cluster, in CPU seconds of this process (the machine is shared: wall
   time would measure the neighbours). Run it from a checkout without the table too (copy this
   file into its bench/) for the before/after; target: the table adds <= 10%.
2. Custom resources: ``admit-guard check`` in-process on one YAML file of 5,000 objects, an
   even mix of Volcano Jobs, JobSets, PyTorchJobs, MPIJobs, RayClusters, RayJobs,
   LeaderWorkerSets and ClusterTrainingRuntimes (parse included). Target: <= 3 s.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "examples" / "cluster"
sys.path.insert(0, str(ROOT))

from webhook.cli import main as cli  # noqa: E402
from webhook.config import Config  # noqa: E402
from webhook.dryrun import Result  # noqa: E402
from webhook.engine import evaluate  # noqa: E402
from webhook.formats.manifests import Document, Location  # noqa: E402
from webhook.state.snapshot import load_snapshot  # noqa: E402

CONTAINER = {
    "name": "app",
    "image": "registry.example/app:1",
    "resources": {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
}
GPU_CONTAINER = {
    "name": "train",
    "image": "registry.example/train:1",
    "resources": {"limits": {"nvidia.com/gpu": "1"}},
}
TOLERATE = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]


def deployment(n: int) -> dict:
    spec = {
        "containers": [CONTAINER],
        "tolerations": [{"key": "dedicated", "value": "web", "effect": "NoSchedule"}],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"web-{n}", "namespace": f"team-{n % 50}"},
        "spec": {"replicas": 3, "selector": {"matchLabels": {"app": f"web-{n}"}},
                 "template": {"metadata": {"labels": {"app": f"web-{n}"}}, "spec": spec}},
    }  # fmt: skip


def template(gpu: bool, **spec) -> dict:
    body = {"containers": [GPU_CONTAINER if gpu else CONTAINER], **spec}
    if gpu:
        body["tolerations"] = TOLERATE
    return {"metadata": {"labels": {"app": "x"}}, "spec": body}


def custom_resource(n: int) -> dict:
    """One of eight operators' kinds, shaped like their examples (tests/fixtures/workloads/)."""
    meta = {"name": f"w-{n}", "namespace": f"team-{n % 50}"}
    scheduler = {"schedulerName": "volcano"} if n % 3 else {}
    kinds = [
        ("batch.volcano.sh/v1alpha1", "Job", {"schedulerName": "volcano", "tasks": [
            {"name": "ps", "replicas": 1, "template": template(False)},
            {"name": "worker", "replicas": 4, "template": template(True)}]}),
        ("jobset.x-k8s.io/v1alpha2", "JobSet", {"replicatedJobs": [
            {"name": "workers", "replicas": 2,
             "template": {"spec": {"template": template(True, **scheduler)}}},
            {"name": "driver", "template": {"spec": {"template": template(False)}}}]}),
        ("kubeflow.org/v1", "PyTorchJob", {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": template(True, **scheduler)},
            "Worker": {"replicas": 3, "template": template(True, **scheduler)}}}),
        ("kubeflow.org/v2beta1", "MPIJob", {"mpiReplicaSpecs": {
            "Launcher": {"replicas": 1, "template": template(False)},
            "Worker": {"replicas": 2, "template": template(True, **scheduler)}}}),
        ("ray.io/v1", "RayCluster", {"headGroupSpec": {"template": template(False)}, "workerGroupSpecs": [
            {"groupName": "gpu", "replicas": 2, "template": template(True, **scheduler)}]}),
        ("ray.io/v1", "RayJob", {"entrypoint": "python x.py", "rayClusterSpec": {
            "headGroupSpec": {"template": template(False)},
            "workerGroupSpecs": [
                {"groupName": "gpu", "replicas": 1, "template": template(True, **scheduler)}]}}),
        ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", {"replicas": 2, "leaderWorkerTemplate": {
            "size": 4, "leaderTemplate": template(False), "workerTemplate": template(True, **scheduler)}}),
        ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime", {"template": {"spec": {"replicatedJobs": [
            {"name": "node", "template": {"spec": {"template": template(True, **scheduler)}}}]}}}),
    ]  # fmt: skip
    api_version, kind, spec = kinds[n % len(kinds)]
    if kind == "ClusterTrainingRuntime":
        meta = {"name": meta["name"]}
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": spec}


def built_in_cpu(count: int, runs: int) -> float:
    """CPU seconds to judge ``count`` parsed Deployments, as ``check`` judges each document."""
    state = load_snapshot([str(CLUSTER)])
    config = Config()
    docs = [Document(Location("bench.yaml", n + 1, None), deployment(n)) for n in range(count)]
    times = []
    for _ in range(runs):
        started = time.process_time()
        for doc in docs:
            decision = evaluate(doc.obj, "CREATE", state, config, now=0.0)
            Result.of(doc, decision)
        times.append(time.process_time() - started)
    return statistics.median(times)


def custom_check(count: int, runs: int) -> tuple[float, float, str]:
    """Wall and CPU seconds of ``admit-guard check`` on ``count`` custom resources, and its summary."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "operators.yaml"
        path.write_text(yaml.safe_dump_all(custom_resource(n) for n in range(count)))
        walls, cpus = [], []
        summary = ""
        for _ in range(runs):
            err = io.StringIO()
            started, cpu = time.perf_counter(), time.process_time()
            quiet = contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err)
            with quiet[0], quiet[1], contextlib.suppress(SystemExit):
                cli(["check", "-f", str(path), "--cluster", str(CLUSTER), "-q"])
            walls.append(time.perf_counter() - started)
            cpus.append(time.process_time() - cpu)
            summary = err.getvalue().strip().splitlines()[-1]
    return statistics.median(walls), statistics.median(cpus), summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--deployments", type=int, default=40_000)
    parser.add_argument("--custom", type=int, default=5_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    cpu = built_in_cpu(args.deployments, args.runs)
    print(
        f"{args.deployments} Deployments judged (evaluate + Result): {cpu:.2f} CPU s, median of {args.runs}"
    )
    try:
        from webhook.kube.workloads import BUILT_IN  # noqa: F401  (a checkout with the table)
    except ImportError:
        return
    wall, cpu, summary = custom_check(args.custom, args.runs)
    print(f"check on {args.custom} custom resources: {wall:.2f} s wall, {cpu:.2f} CPU s (target <= 3 s)")
    print(f"  {summary}")


if __name__ == "__main__":
    main()
