"""Small builders for Node and Pod objects, so each test shows only what it is about."""

from __future__ import annotations

import random
from typing import Any


def node(
    name: str = "node-1",
    *,
    cpu: str = "4",
    memory: str = "8Gi",
    pods: str = "110",
    labels: dict | None = None,
    taints: list | None = None,
    conditions: list[str] = (),
    extra: dict | None = None,
    os: str = "linux",
) -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": memory, "pods": pods, "ephemeral-storage": "50Gi", **(extra or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": taints or []},
        "status": {
            "allocatable": allocatable,
            "conditions": [{"type": c, "status": "True"} for c in conditions],
            "nodeInfo": {"operatingSystem": os},
        },
    }


def container(
    name: str = "app", requests: dict | None = None, limits: dict | None = None, **extra: Any
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if requests is not None:
        resources["requests"] = requests
    if limits is not None:
        resources["limits"] = limits
    return {"name": name, "image": "img", "resources": resources, **extra}


def pod(
    name: str = "p",
    *,
    node_name: str | None = None,
    requests: dict | None = None,
    containers: list | None = None,
    namespace: str = "default",
    uid: str | None = None,
    phase: str | None = None,
    scheduler: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"containers": containers or [container(requests=requests or {})], **spec}
    if node_name:
        body["nodeName"] = node_name
    if scheduler:
        body["schedulerName"] = scheduler
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid or f"uid-{name}"}
    obj = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def deployment(spec: dict[str, Any], name: str = "web", namespace: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }


# -- a large, realistic cluster: the benchmarks' and the fake API server's command line ----

SCHEDULERS = ("default-scheduler", "volcano")


def cluster_node(i: int) -> dict:
    """The ``i``-th node of a large cluster: every tenth has 8 GPUs (and a taint)."""
    gpu = i % 10 == 0
    allocatable = {"cpu": "63500m", "memory": "250Gi", "pods": "110", "ephemeral-storage": "900Gi"}
    if gpu:
        allocatable["nvidia.com/gpu"] = "8"
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": f"node-{i:05d}",
            "uid": f"node-uid-{i}",
            "labels": {
                "kubernetes.io/hostname": f"node-{i:05d}",
                "kubernetes.io/os": "linux",
                "topology.kubernetes.io/zone": f"zone-{i % 3}",
            },
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}] if gpu else []},
        "status": {
            "allocatable": allocatable,
            "capacity": allocatable,
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "MemoryPressure", "status": "False"},
            ],
            "nodeInfo": {"operatingSystem": "linux", "kubeletVersion": "v1.35.0"},
        },
    }


def cluster_pod(i: int, nodes: int, rng: random.Random) -> dict:
    """The ``i``-th pod of a large cluster of ``nodes`` nodes: Running on a random node, some with
    a GPU limit, every seventh with a host-port sidecar, every eleventh scheduled by volcano."""
    node = rng.randrange(nodes)
    requests = {"cpu": f"{rng.choice((100, 250, 500, 1000))}m", "memory": f"{rng.choice((128, 256, 512))}Mi"}
    limits = {"memory": requests["memory"]}
    if node % 10 == 0 and rng.random() < 0.2:
        limits["nvidia.com/gpu"] = "1"
    containers = [
        {
            "name": "app",
            "image": "registry.example/app:1",
            "resources": {"requests": requests, "limits": limits},
        }
    ]
    if i % 7 == 0:
        containers.append(
            {
                "name": "sidecar",
                "image": "registry.example/proxy:1",
                "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
                "ports": [{"containerPort": 15090, "hostPort": 15090 + i % 5}],
            }
        )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"app-{i}-x7k2p",
            "namespace": f"team-{i % 40}",
            "uid": f"7d5c2a9e-{i:08d}-4b1f-9a3e-5c2d1e0f{i % 10000:04d}",
        },
        "spec": {
            "nodeName": f"node-{node:05d}",
            "schedulerName": SCHEDULERS[i % 11 == 0],
            "priority": 0,
            "containers": containers,
        },
        "status": {"phase": "Running"},
    }


def live_pod(i: int, nodes: int, rng: random.Random) -> dict:
    """``cluster_pod`` as a live API server lists it (~11 KB of JSON): managed fields, labels
    and annotations, an owner, env, probes, volume mounts, volumes, tolerations, conditions and
    container statuses. Everything a list carries that a pod's record never reads."""
    pod = cluster_pod(i, nodes, rng)
    metadata, spec = pod["metadata"], pod["spec"]
    workload, stamp = i % 2000, f"2026-0{1 + i % 9}-1{i % 10}T0{i % 10}:1{i % 6}:2{i % 10}Z"
    leaves = {f"f:{k}": {} for k in ("name", "image", "resources", "env", "args", "ports")}
    fields = {f'k:{{"name":"{name}"}}': {".": {}, **leaves} for name in "abcdefghijklmnopqrst"}
    metadata.update(
        generateName=f"app-{workload}-7f9c8d6b5-",
        resourceVersion=str(10_000_000 + i),
        creationTimestamp=stamp,
        labels={"app": f"app-{workload}", "pod-template-hash": "7f9c8d6b5", "tier": "backend"},
        annotations={"prometheus.io/scrape": "true", "checksum/config": "a1b2c3d4e5f6" * 40},
        ownerReferences=[{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"app-{workload}-7f9c8d6b5",
                          "uid": f"0d1c6b2e-55aa-4a8e-9e4f-1c2b3d{workload:06d}", "controller": True}],
        managedFields=[{"manager": manager, "operation": "Update", "apiVersion": "v1", "time": stamp,
                        "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": fields}}
                       for manager in ("kube-controller-manager", "kubelet", "helm")],
    )  # fmt: skip
    probe = {"httpGet": {"path": "/healthz", "port": 8080, "scheme": "HTTP"}, "periodSeconds": 10}
    for container in spec["containers"]:
        container.update(
            env=[{"name": f"ENV_{k}", "value": f"value-{workload}-{k}"} for k in range(20)],
            args=["--config=/etc/config/app.yaml", f"--shard={workload % 16}"],
            livenessProbe=probe,
            readinessProbe=probe,
            volumeMounts=[{"name": v, "mountPath": f"/var/{v}"} for v in ("config", "data", "tmp", "token")],
            securityContext={"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        )
    spec.update(
        serviceAccountName=f"app-{workload}",
        tolerations=[{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}],
        volumes=[
            {"name": v, "configMap": {"name": f"app-{workload}-{v}"}}
            for v in ("config", "data", "tmp", "token")
        ],
    )
    conditions = ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
    pod["status"].update(
        conditions=[{"type": c, "status": "True", "lastTransitionTime": stamp} for c in conditions],
        hostIP=f"10.0.{i % 250}.{i % 200}",
        podIP=f"10.1.{i % 250}.{i % 200}",
        startTime=stamp,
        containerStatuses=[
            {"name": c["name"], "ready": True, "restartCount": 0, "image": c["image"], "started": True,
             "imageID": f"{c['image']}@sha256:{'ab' * 32}", "containerID": f"containerd://{'cd' * 32}",
             "state": {"running": {"startedAt": stamp}}}
            for c in spec["containers"]
        ],
    )  # fmt: skip
    return pod


def gpu_job(scheduler: str | None = None, **spec: Any) -> dict[str, Any]:
    """A Job ``ml/train`` whose pod asks one ``nvidia.com/gpu`` (``scheduler``: its schedulerName)."""
    body: dict[str, Any] = {"containers": [container(limits={"nvidia.com/gpu": "1"})], **spec}
    if scheduler:
        body["schedulerName"] = scheduler
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "ml"},
        "spec": {"template": {"spec": body}},
    }
