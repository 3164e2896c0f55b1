"""The scenarios of issue 28, each a starting cluster and a script, run with the guard (the
webhooks of the rendered overlay, the shipped config with its policies enforcing) or without
it (no webhooks), with the same seed.

- ``nodename-storm`` (incident 1): Deployments pinned with ``nodeName`` onto a full node, one
  created before the guard was installed, one applied now, and a Job pinned there too. The
  kubelet rejects every pod (``OutOfcpu``); the ReplicaSet controller replaces each at once,
  the Job controller until its ``backoffLimit`` is burnt.
- ``two-schedulers`` (incident 2): default-scheduler and volcano, stale caches, one GPU left per
  node, a burst of GPU pods for both. Both bind a node's last GPU; the device manager fails one
  pod with ``UnexpectedAdmissionError``.
- ``dra-allocators``: the same race through DRA: both schedulers write ``resourceclaims/status``
  for a node's last device; the driver refuses the second prepare and that pod is stuck.
- ``slow-apiserver``: ``two-schedulers`` while every Lease call takes 0.3 s.
- ``guard-outage``: both replicas down (``failurePolicy: Ignore`` lets binds through: what
  leaks), then back: a second burst on other nodes must not leak. A pinned Deployment applied
  during the outage meets the one fail-closed webhook.
- ``topology-storm``: nodes of two NUMA zones under ``single-numa-node``, an NRT each that the
  exporter updates a second after a pod starts. A Deployment of Guaranteed pods that fit every
  node in total but, on all nodes but one, no single zone: kube-scheduler cannot see zones and
  binds them there, the kubelet fails each (``TopologyAffinityError``), the ReplicaSet replaces
  it at once. The last node has room in one zone for one pod (and, by its total, for two).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .box import WANTED, Box, Outcome, Setting
from .deploy import Rendered, render
from .guard import enforcing
from .kube import allocation

DRIVER, DEVICE_CLASS = "gpu.example.com", "gpu.example.com"
GPU = "nvidia.com/gpu"


@dataclass(frozen=True)
class Scale:
    nodes: int
    replicas: int
    seconds: float


SCALES = {"small": Scale(nodes=3, replicas=3, seconds=2.0), "full": Scale(nodes=8, replicas=10, seconds=15.0)}


# -- objects ------------------------------------------------------------------------------------


def node(name: str, cpu: str = "4", labels: dict[str, str] | None = None, **extra: str) -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": "16Gi", "pods": "110", "ephemeral-storage": "50Gi", **extra}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                              **(labels or {})}},
        "spec": {},
        "status": {"allocatable": allocatable, "capacity": allocatable,
                   "conditions": [{"type": "Ready", "status": "True"}],
                   "nodeInfo": {"operatingSystem": "linux", "kubeletVersion": "v1.35.0"}},
    }  # fmt: skip


def pod_spec(requests: dict[str, str], scheduler: str = "default-scheduler", **spec: Any) -> dict[str, Any]:
    resources = {"requests": requests, "limits": {k: v for k, v in requests.items() if k == GPU}}
    container = {"name": "app", "image": "registry.example/app:1", "resources": resources}
    return {"schedulerName": scheduler, "containers": [container], **spec}


def guaranteed_spec(cpu: int, **spec: Any) -> dict[str, Any]:
    """One container whose requests equal its limits, in whole CPUs: exclusive CPUs, aligned."""
    amounts = {"cpu": str(cpu), "memory": "1Gi"}
    resources = {"requests": amounts, "limits": dict(amounts)}
    return {
        "containers": [{"name": "app", "image": "registry.example/app:1", "resources": resources}],
        **spec,
    }


def pod(
    name: str, spec: dict[str, Any], namespace: str = "default", wanted: bool = True, **status
) -> dict[str, Any]:
    labels = {"app": name.rsplit("-", 1)[0], **({WANTED: "true"} if wanted else {})}
    obj = {"apiVersion": "v1", "kind": "Pod", "spec": spec,
           "metadata": {"name": name, "namespace": namespace, "labels": labels}}  # fmt: skip
    if status:
        obj["status"] = status
    return obj


def deployment(name: str, replicas: int, spec: dict[str, Any]) -> dict[str, Any]:
    labels = {"app": name, WANTED: "true"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": labels}, "spec": spec}},
    }  # fmt: skip


def job(name: str, spec: dict[str, Any], backoff_limit: int = 6) -> dict[str, Any]:
    labels = {"app": name, WANTED: "true"}
    template = {"metadata": {"labels": labels}, "spec": {**spec, "restartPolicy": "Never"}}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "default"},
            "spec": {"parallelism": 1, "backoffLimit": backoff_limit, "template": template}}  # fmt: skip


def claim(
    name: str, node_name: str | None = None, device: str | None = None, pod_name: str = ""
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DEVICE_CLASS}}]}},
    }
    if device:
        obj["status"] = {
            "allocation": allocation("gpu", DRIVER, node_name, device, node_name),
            "reservedFor": [{"resource": "pods", "name": pod_name, "uid": f"pods-{pod_name}"}],
        }  # fmt: skip
    return obj


def resource_slice(node_name: str, devices: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node_name}-gpus"},
        "spec": {"driver": DRIVER, "nodeName": node_name, "pool": {"name": node_name, "generation": 1,
                 "resourceSliceCount": 1}, "devices": [{"name": d} for d in devices]},
    }  # fmt: skip


def device_class() -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DEVICE_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}}  # fmt: skip


# -- the scenarios ------------------------------------------------------------------------------


def nodename_storm(scale: Scale, lag: float) -> tuple[Setting, Callable[[Box], None]]:
    nodes = [node(f"node-{i}") for i in range(1, scale.nodes + 1)]
    hog = pod("hog-0", pod_spec({"cpu": "4"}, nodeName="node-1"), wanted=False, phase="Running")
    pinned = pod_spec({"cpu": "1"}, nodeName="node-1")
    legacy = deployment("legacy", scale.replicas, pinned)  # its ReplicaSet predates the guard
    legacy.update(kind="ReplicaSet", metadata={"name": "legacy-5d8f7c", "namespace": "default"})
    setting = Setting(nodes, {}, pods=[hog], replica_sets=[legacy], schedulers=("default-scheduler",),
                      scheduler_lag=lag, wanted=2 * scale.replicas + 1)  # fmt: skip

    def play(box: Box) -> None:
        box.create("deployments", deployment("pinned", scale.replicas, pinned))
        box.create("jobs", job("pinned-job", pinned))
        box.until(scale.seconds)

    return setting, play


def _gpu_cluster(scale: Scale, lag: float, pools: tuple[str, ...] = ("a",)) -> Setting:
    """Nodes with one GPU left and no device pod yet (a cpu-only pod runs on each): nothing on
    a node says which scheduler its devices belong to, so the bind is where the race is seen."""
    nodes, pods, devices = [], [], {}
    for pool in pools:
        for i in range(1, scale.nodes + 1):
            name = f"gpu-{pool}{i}"
            nodes.append(node(name, cpu="16", labels={"pool": pool}, **{GPU: "1"}))
            devices[name] = {GPU: ["gpu-0"]}
            spec = pod_spec({"cpu": "2"}, nodeName=name)
            pods.append(pod(f"resident-{pool}{i}", spec, wanted=False, phase="Running"))
    return Setting(nodes, devices, pods=pods, scheduler_lag=lag, wanted=2 * scale.nodes * len(pools))


def _gpu_burst(box: Box, scale: Scale, pool: str) -> None:
    """One GPU pod per node for each scheduler, all at once."""
    box.burst("pods", [
        pod(f"train-{pool}{tag}-{i}", pod_spec({GPU: "1"}, scheduler=scheduler, nodeSelector={"pool": pool}))
        for i in range(1, scale.nodes + 1)
        for scheduler, tag in (("default-scheduler", "d"), ("volcano", "v"))
    ])  # fmt: skip


def two_schedulers(scale: Scale, lag: float) -> tuple[Setting, Callable[[Box], None]]:
    setting = _gpu_cluster(scale, lag)

    def play(box: Box) -> None:
        _gpu_burst(box, scale, "a")
        box.until(scale.seconds)

    return setting, play


def slow_apiserver(scale: Scale, lag: float) -> tuple[Setting, Callable[[Box], None]]:
    setting, play = two_schedulers(scale, lag)
    setting.lease_delay = 0.3
    return setting, play


def guard_outage(scale: Scale, lag: float) -> tuple[Setting, Callable[[Box], None]]:
    setting = _gpu_cluster(scale, lag, pools=("a", "b"))
    setting.wanted += 1  # the pinned Deployment's one pod

    def play(box: Box) -> None:
        phase = max(scale.seconds / 2, lag + 1.0)  # long enough for the binds and the kubelets
        if box.guard is not None:
            box.guard.stop()
        box.create("deployments", deployment("pinned", 1, pod_spec({"cpu": "1"}, nodeName="gpu-a1")))
        started = time.monotonic() - box.started
        _gpu_burst(box, scale, "a")
        box.until(started + phase)
        box.mark("outage")
        if box.guard is not None:
            box.guard.start()
        started = time.monotonic() - box.started
        _gpu_burst(box, scale, "b")
        box.until(started + phase)

    return setting, play


def dra_allocators(scale: Scale, lag: float) -> tuple[Setting, Callable[[Box], None]]:
    nodes, pods, slices, claims = [], [], [], []
    for i in range(1, scale.nodes + 1):
        name = f"gpu-{i}"
        nodes.append(node(name, cpu="16"))
        slices.append(resource_slice(name, ["gpu-0", "gpu-1"]))
        claims.append(claim(f"resident-{i}", name, "gpu-0", pod_name=f"resident-{i}"))
        spec = pod_spec(
            {"cpu": "1"},
            nodeName=name,
            resourceClaims=[{"name": "gpu", "resourceClaimName": f"resident-{i}"}],
        )
        pods.append(pod(f"resident-{i}", spec, namespace="ml", wanted=False, phase="Running"))
        for tag in ("d", "v"):
            claims.append(claim(f"claim-{tag}-{i}"))
    setting = Setting(nodes, {}, pods=pods, slices=slices, claims=claims, device_classes=[device_class()],
                      scheduler_lag=lag, wanted=2 * scale.nodes)  # fmt: skip

    def play(box: Box) -> None:
        box.burst("pods", [
            pod(f"dra-{tag}-{i}", pod_spec({"cpu": "1"}, scheduler, resourceClaims=[
                {"name": "gpu", "resourceClaimName": f"claim-{tag}-{i}"}]), "ml")
            for i in range(1, scale.nodes + 1)
            for scheduler, tag in (("default-scheduler", "d"), ("volcano", "v"))
        ])  # fmt: skip
        box.until(scale.seconds)

    return setting, play


def topology_storm(scale: Scale, lag: float) -> tuple[Setting, Callable[[Box], None]]:
    """Zones of 4 CPUs, pods of 3. The residents take, lowest zone first: 3 then 2 CPUs on the
    full nodes (1 and 2 CPUs left: 3 in total, none in one zone); 2 on the last node (2 and 4:
    one pod fits zone ``node-1``, two by the node's total)."""
    nodes, pods, numa = [], [], {}
    for i in range(1, scale.nodes + 1):
        name = f"numa-{i}"
        nodes.append(node(name, cpu="8"))
        numa[name] = [4, 4]
        for n, cpus in enumerate((2,) if i == scale.nodes else (3, 2)):
            spec = guaranteed_spec(cpus, nodeName=name)
            pods.append(pod(f"resident-{i}{'ab'[n]}", spec, wanted=False, phase="Running"))
    setting = Setting(nodes, {}, pods=pods, schedulers=("default-scheduler",), scheduler_lag=lag,
                      wanted=scale.replicas, numa=numa)  # fmt: skip

    def play(box: Box) -> None:
        box.create("deployments", deployment("numa", scale.replicas, guaranteed_spec(3)))
        box.until(scale.seconds)

    return setting, play


SCENARIOS: dict[str, Callable[[Scale, float], tuple[Setting, Callable[[Box], None]]]] = {
    "nodename-storm": nodename_storm,
    "two-schedulers": two_schedulers,
    "dra-allocators": dra_allocators,
    "slow-apiserver": slow_apiserver,
    "guard-outage": guard_outage,
    "topology-storm": topology_storm,
}
ARMS = ("guard", "none")


def run(
    name: str, arm: str, *, seed: int = 1, scale: str | Scale = "small", lag_ms: float = 1000,
    rendered: Rendered | None = None, workdir: Path | None = None,
) -> Outcome:  # fmt: skip
    """One scenario, one arm. ``rendered``: the overlay to take the webhooks, TLS and config from
    (rendered here when not given; a test may hand in a changed one). ``scale``: a name of
    ``SCALES`` or a ``Scale`` of a test's own."""
    with tempfile.TemporaryDirectory(prefix=f"box-{name}-") as tmp:
        box, play = _box(name, arm, seed, scale, lag_ms, rendered, workdir or Path(tmp))
        return _play(box, play, name, arm)


def run_both(
    name: str, *, rendered: Rendered, seed: int = 1, scale: str | Scale = "small", lag_ms: float = 1000
) -> tuple[Outcome, Outcome]:
    """Both arms, same seed: (without the guard, with it). The guard's replicas start while the
    arm without them runs, so a test waits for one of the two, not both; the guarded arm's
    cluster starts only once they are ready, exactly as ``run`` starts it."""
    with tempfile.TemporaryDirectory(prefix=f"box-{name}-") as tmp:
        box, play = _box(name, "guard", seed, scale, lag_ms, rendered, Path(tmp))
        assert box.guard is not None
        with contextlib.ExitStack() as cleanup, ThreadPoolExecutor(max_workers=1) as pool:
            cleanup.callback(box.__exit__, None, None, None)  # the guard stopped if the other arm fails
            starting = pool.submit(box.guard.start)
            cleanup.callback(starting.exception)  # never stop what is still starting
            none = run(name, "none", seed=seed, scale=scale, lag_ms=lag_ms)
            starting.result()
            cleanup.pop_all()
        return none, _play(box, play, name, "guard")


def _box(
    name: str, arm: str, seed: int, scale: str | Scale, lag_ms: float, rendered: Rendered | None,
    directory: Path,
) -> tuple[Box, Callable[[Box], None]]:  # fmt: skip
    setting, play = SCENARIOS[name](SCALES[scale] if isinstance(scale, str) else scale, lag_ms / 1000)
    if arm == "guard" and rendered is None:
        rendered = render(directory)
    config = enforcing(rendered.config()) if arm == "guard" else None
    return Box(setting, directory, seed, rendered if arm == "guard" else None, config), play


def _play(box: Box, play: Callable[[Box], None], name: str, arm: str) -> Outcome:
    with box:
        play(box)
        box.settle()
        return box.outcome(name, arm)
