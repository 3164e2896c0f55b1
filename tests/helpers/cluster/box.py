"""One cluster in a box: the store served to the guard, the double, the guard (or none), and the
components, started together and measured at the end.

A scenario (``scenarios.py``) describes the cluster it starts from and what happens at which
second; ``Box`` runs it for a bounded time and reads the outcome from the store's truth and the
components' counters.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers.fake_apiserver import FakeApiServer

from .apiserver import ApiDouble, Resource, fresh_cluster
from .controllers import (
    POD_GROUPS,
    VOLCANO_JOBS,
    DeploymentController,
    GangController,
    JobController,
    ReplicaSetController,
)
from .deploy import Rendered
from .dra import DraDriver
from .guard import Guard
from .kubelet import UNEXPECTED, Kubelet
from .loop import Loop
from .numa import NRT, Exporter
from .scheduler import Scheduler
from .webhooks import Denied, Dispatcher

WANTED = "box.admit-guard.io/wanted"  # the label of the pods a scenario wants running
USER = {"username": "jane", "groups": ["system:authenticated"]}
EXPORTER = {"username": "system:serviceaccount:node-feature-discovery:nfd-topology-updater",
            "groups": ["system:serviceaccounts", "system:authenticated"]}  # fmt: skip
POD_LIMIT = 3000  # the most pods a box ever creates: a storm is bounded in count as in time
# The Job controller's pod-failure backoff (10 s doubling to 6 min upstream), compressed so a
# Job burns its backoffLimit within a small scenario's seconds.
JOB_BACKOFF = (0.02, 0.2)


@dataclass
class Setting:
    """What a scenario sets up, arm-independent."""

    nodes: list[dict[str, Any]]
    devices: dict[str, dict[str, list[str]]]  # node → resource → device IDs
    pods: list[dict[str, Any]] = field(default_factory=list)  # running before the start
    slices: list[dict[str, Any]] = field(default_factory=list)
    claims: list[dict[str, Any]] = field(default_factory=list)
    device_classes: list[dict[str, Any]] = field(default_factory=list)
    replica_sets: list[dict[str, Any]] = field(default_factory=list)  # created before the guard
    schedulers: tuple[str, ...] = ("default-scheduler", "volcano")
    watch_lag: float = 0.05
    scheduler_lag: float = 0.3
    lease_delay: float = 0.0
    wanted: int = 0
    numa: dict[str, list[int]] = field(default_factory=dict)  # node → CPUs per NUMA zone (an NRT each)
    exporter_lag: float = 1.0  # how long after a pod starts its node's NRT says so


@dataclass
class Outcome:
    """What a run measured; ``row()`` is the bench's JSON contract."""

    scenario: str
    arm: str
    seconds: float
    wanted: int
    pods: list[dict[str, Any]]
    claims: list[dict[str, Any]]
    replica_sets: list[dict[str, Any]]
    refused: list[str]  # messages of the scenario's own writes the API server refused
    events: list[dict[str, Any]]
    counts: Counter
    running_at: list[float]
    webhook_ms: list[float]
    writes: int
    calls: list[Any]
    phases: dict[str, Counter] = field(default_factory=dict)  # per scenario phase: rejections
    warnings: list[str] = field(default_factory=list)  # admission warnings the API server returned
    jobs: list[dict[str, Any]] = field(default_factory=list)

    def failed(self) -> list[dict[str, Any]]:
        return [p for p in self.pods if (p.get("status") or {}).get("phase") == "Failed"]

    def running(self) -> list[dict[str, Any]]:
        return [p for p in self._wanted() if (p.get("status") or {}).get("phase") == "Running"]

    def _wanted(self) -> list[dict[str, Any]]:
        return [p for p in self.pods if (p["metadata"].get("labels") or {}).get(WANTED)]

    def devices_twice(self) -> int:
        holders: dict[tuple, set[str]] = {}
        for claim in self.claims:
            results = (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get(
                "results"
            ) or []
            for r in results:
                holders.setdefault((r["driver"], r["pool"], r["device"]), set()).add(claim["metadata"]["uid"])
        return sum(1 for uids in holders.values() if len(uids) > 1)

    def unexpected_admission_errors(self) -> int:
        return sum(1 for p in self.failed() if p["status"].get("reason") == UNEXPECTED)

    def unexplained(self) -> list[str]:
        """Wanted pods neither running nor pending with a reason a person can act on: a pending
        pod needs its PodScheduled condition's message; a pod never created needs its
        ReplicaSet's ReplicaFailure or the refusal of the scenario's own write."""
        out = []
        for pod in self._wanted():
            status = pod.get("status") or {}
            if status.get("phase") == "Running":
                continue
            reasons = [c.get("message") for c in status.get("conditions") or [] if c["type"] == "PodScheduled"
                       and c["status"] == "False" and c.get("message")]  # fmt: skip
            if (status.get("phase") != "Pending" and status.get("phase") is not None) or not reasons:
                out.append(
                    f"{pod['metadata']['name']}: {status.get('phase')} {status.get('reason', '')}".strip()
                )
        missing = self.wanted - len(self._wanted())
        failing = [c for rs in self.replica_sets for c in (rs.get("status") or {}).get("conditions") or []
                   if c["type"] == "ReplicaFailure"]  # fmt: skip
        if missing > 0 and not failing and not self.refused:
            out.append(f"{missing} wanted pods were never created, and nothing says why")
        return out

    def row(self) -> dict[str, Any]:
        running = self.running()
        ms = sorted(self.webhook_ms)
        return {
            "scenario": self.scenario,
            "arm": self.arm,
            "failed_per_minute": round(len(self.failed()) / self.seconds * 60, 1),
            "unexpected_admission_errors": self.unexpected_admission_errors(),
            "devices_twice": self.devices_twice(),
            "wanted_pods": self.wanted,
            "running_pods": len(running),
            "seconds_to_running": round(max(self.running_at), 2) if running and self.running_at else None,
            "binds_denied": self.counts["binds_denied"],
            "binds_retried": self.counts["binds_retried"],
            "webhook_p50_ms": round(statistics.median(ms), 1) if ms else None,
            "webhook_p99_ms": round(ms[min(len(ms) - 1, int(len(ms) * 0.99))], 1) if ms else None,
            "api_writes_per_pod": round(self.writes / max(self.wanted, 1), 1),
        }


class Box:
    """The cluster, with the guard (``rendered`` given) or without it."""

    def __init__(self, setting: Setting, workdir: Path, seed: int, rendered: Rendered | None,
                 guard_config: dict[str, Any] | None = None) -> None:  # fmt: skip
        self.setting, self.seed = setting, seed
        self.cluster = fresh_cluster(setting.watch_lag)
        self.cluster.lease_delay = setting.lease_delay
        self.api = ApiDouble(self.cluster)
        for namespace in ("default", "ml", "kube-system", "admit-guard"):
            self.api.add_namespace(namespace)
        self.api.install(VOLCANO_JOBS, Resource("batch.volcano.sh", "v1alpha1", "Job"))
        self.api.install(POD_GROUPS, Resource("scheduling.volcano.sh", "v1beta1", "PodGroup"))
        self.api.load("nodes", setting.nodes)
        self.api.load("pods", setting.pods)
        self.api.load("resourceslices", setting.slices)
        self.api.load("resourceclaims", setting.claims)
        self.api.load("deviceclasses", setting.device_classes)
        self.api.load("replicasets", setting.replica_sets)
        self.server = FakeApiServer(self.cluster)
        self.guard: Guard | None = None
        if rendered is not None:
            kubeconfig = self.server.kubeconfig(workdir / "kubeconfig")
            self.guard = Guard(rendered, kubeconfig, workdir, guard_config or rendered.config())
            self.api.dispatcher = Dispatcher(
                rendered.webhook_configurations(), self.guard.endpoints, self.api.namespace_labels
            )
        self.refused: list[str] = []
        self._refused_lock = threading.Lock()
        self.schedulers = [Scheduler(n, self.api, setting.scheduler_lag, seed) for n in setting.schedulers]
        self.drivers = {s["spec"]["nodeName"]: DraDriver(s["spec"]["driver"], s["spec"]["pool"]["name"])
                        for s in setting.slices}  # fmt: skip
        self.kubelets = [
            Kubelet(node, self.api, setting.watch_lag, setting.devices.get(node["metadata"]["name"], {}),
                    self.drivers.get(node["metadata"]["name"]), setting.numa.get(node["metadata"]["name"]))
            for node in setting.nodes
        ]  # fmt: skip
        for kubelet in self.kubelets:
            kubelet.adopt(setting.pods)
        self.exporters = [Exporter(k.name, k.cpus, setting.exporter_lag) for k in self.kubelets if k.cpus]
        self.api.load(NRT, [exporter.nrt() for exporter in self.exporters])
        for held in setting.claims:  # the claims of running pods were prepared on their nodes
            allocation = (held.get("status") or {}).get("allocation")
            if allocation:
                self.drivers[allocation["devices"]["results"][0]["pool"]].prepare(held)
        self.replica_sets = ReplicaSetController(self.api, POD_LIMIT)
        self.loops: list[Loop] = []
        self.started = 0.0
        self.phase_marks: list[tuple[str, Counter]] = []

    # -- running -----------------------------------------------------------------------------

    def __enter__(self) -> Box:
        if self.guard is not None:
            self.guard.start()
        self.loops = [
            Loop("deployment-controller", DeploymentController(self.api).step),
            Loop("replicaset-controller", self.replica_sets.step),
            Loop("job-controller", JobController(self.api, JOB_BACKOFF).step),
            Loop("volcano-job-controller", GangController(self.api).step),
            *(Loop(f"scheduler-{s.name}", s.step) for s in self.schedulers),
            *(Loop(f"kubelet-{k.name}", k.step) for k in self.kubelets),
            Loop("nfd-topology-updater", self._export, tick=0.05),
        ]
        self.started = time.monotonic()
        for loop in self.loops:
            loop.start()
        return self

    def __exit__(self, *exc) -> None:
        try:
            for loop in self.loops:
                loop.stop()
        finally:
            if self.api.dispatcher is not None:
                self.api.dispatcher.close()
            if self.guard is not None:
                self.guard.stop()
            self.server.close()

    def _export(self) -> None:
        """Each exporter's NRT, written when due (an Update, not admitted by these webhooks)."""
        for exporter in self.exporters:
            nrt = exporter.due()
            if nrt is not None:
                current = self.api.get(NRT, "", exporter.node)
                self.api.update(NRT, {**nrt, "metadata": current["metadata"]}, EXPORTER)

    def create(self, resource: str, obj: dict[str, Any]) -> None:
        """The scenario's own write (a person's ``kubectl apply``); a refusal is kept as its reason."""
        try:
            self.api.create(resource, obj, USER)
        except Denied as err:
            with self._refused_lock:
                self.refused.append(err.message)

    def burst(self, resource: str, objects: list[dict[str, Any]]) -> None:
        """Create ``objects`` all at once, as several clients do: one thread each, bounded."""
        with ThreadPoolExecutor(max_workers=min(16, len(objects) or 1)) as pool:
            list(pool.map(lambda obj: self.create(resource, obj), objects))

    def until(self, seconds: float) -> None:
        time.sleep(max(0.0, self.started + seconds - time.monotonic()))

    def settle(self, limit: float = 5.0) -> None:
        """End the script: the controllers stop making pods, then wait, at most ``limit``
        seconds, until no wanted pod is in flight: each one runs, has failed, or says why it
        waits (the scheduler's condition, or the kubelet's event). A bind or a kubelet still
        busy at the script's end is not a pending pod without a reason."""
        for loop in self.loops[:4]:  # the controllers: no new pods from here on
            loop.stop()
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            told = {e["involvedObject"]["uid"] for e in list(self.api.events)}
            if not any(_in_flight(p, told) for p in self.api.list("pods")):
                return
            time.sleep(0.05)

    def mark(self, phase: str) -> None:
        """Remember the kubelets' rejections so far, to tell phases of a scenario apart."""
        self.phase_marks.append((phase, self.rejections()))

    def rejections(self) -> Counter:
        total = Counter()
        for kubelet in self.kubelets:
            total.update(kubelet.rejections)
        return total

    def outcome(self, scenario: str, arm: str) -> Outcome:
        seconds = time.monotonic() - self.started
        counts = Counter()
        for scheduler in self.schedulers:
            counts.update(scheduler.counts)
        counts["creates_denied"] = self.replica_sets.creates_denied
        running_at = [t - self.started for k in self.kubelets for t in k.running_at.values()]
        calls = list(self.api.dispatcher.calls) if self.api.dispatcher else []
        writes = sum(self.api.writes.values()) + self.cluster.lease_writes + self.cluster.lease_deletes
        marks, phases, before = [*self.phase_marks, ("end", self.rejections())], {}, Counter()
        for phase, total in marks:
            phases[phase] = total - before
            before = total
        api = self.api
        return Outcome(
            scenario, arm, seconds, self.setting.wanted, api.list("pods"), api.list("resourceclaims"),
            api.list("replicasets"), list(self.refused), list(api.events), counts, running_at,
            [c.seconds * 1000 for c in calls if c.outcome in ("allowed", "denied")], writes, calls, phases,
            list(api.warnings), api.list("jobs"),
        )  # fmt: skip


def _in_flight(pod: dict[str, Any], told: set[str]) -> bool:
    if not (pod["metadata"].get("labels") or {}).get(WANTED) or pod["metadata"]["uid"] in told:
        return False
    status = pod.get("status") or {}
    if status.get("phase") in ("Running", "Failed"):
        return False
    waiting = [
        c for c in status.get("conditions") or [] if c["type"] == "PodScheduled" and c["status"] == "False"
    ]
    return not waiting or bool(pod["spec"].get("nodeName"))
