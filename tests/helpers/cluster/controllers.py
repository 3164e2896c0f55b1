"""The Deployment and ReplicaSet controllers, as far as the first incident needs them.

Upstream (``pkg/controller/``):

- ``deployment/sync.go`` ``getNewReplicaSet``: one ReplicaSet per template, owned by the
  Deployment, named after it and the template's hash, with the ``pod-template-hash`` label;
- ``replicaset/replica_set.go`` ``manageReplicas``: counts the *active* pods it controls
  (``controller.FilterActivePods``: a Failed pod does not count, so it is replaced at once),
  creates the missing ones in ``slowStartBatch`` (1, 2, 4, ...; the batch stops at the first
  error), and on an error requeues the ReplicaSet rate-limited (client-go's
  ``DefaultControllerRateLimiter``: 5 ms doubling per failure, forgotten on success) and sets
  the ``ReplicaFailure`` condition with the API server's message (``calculateStatus``);
- ``controller_utils.go`` expectations: a controller never counts pods it has not yet seen
  twice. Here the ReplicaSet controller reads the store's truth, which is what its
  expectations make it behave as.

A box-wide ``pod_limit`` bounds the storm (every test's load is bounded in count).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import time
from typing import Any

import orjson

from .apiserver import ApiDouble
from .kube import is_active
from .webhooks import Denied

USER = {"username": "system:serviceaccount:kube-system:{}", "groups": ["system:serviceaccounts"]}
BASE_DELAY, MAX_DELAY = 0.005, 1000.0


def controller_user(name: str) -> dict[str, Any]:
    return {"username": USER["username"].format(name), "groups": USER["groups"]}


def owner_ref(obj: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
        "uid": obj["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True,
    }  # fmt: skip


def controlled_by(obj: dict[str, Any], owner_uid: str) -> bool:
    return any(
        ref.get("controller") and ref.get("uid") == owner_uid
        for ref in obj["metadata"].get("ownerReferences") or []
    )


class DeploymentController:
    def __init__(self, api: ApiDouble) -> None:
        self.api, self.user = api, controller_user("deployment-controller")
        self.failures: dict[str, int] = {}
        self.not_before: dict[str, float] = {}

    def step(self) -> None:
        replica_sets = self.api.list("replicasets")
        for deployment in self.api.list("deployments"):
            uid = deployment["metadata"]["uid"]
            if any(controlled_by(rs, uid) for rs in replica_sets):
                continue
            template = copy.deepcopy(deployment["spec"]["template"])
            digest = hashlib.sha256(orjson.dumps(template, option=orjson.OPT_SORT_KEYS)).hexdigest()[:10]
            template.setdefault("metadata", {}).setdefault("labels", {})["pod-template-hash"] = digest
            selector = copy.deepcopy(deployment["spec"]["selector"])
            selector.setdefault("matchLabels", {})["pod-template-hash"] = digest
            replica_set = {
                "metadata": {
                    "name": f"{deployment['metadata']['name']}-{digest}",
                    "namespace": deployment["metadata"]["namespace"],
                    "labels": template["metadata"]["labels"],
                    "ownerReferences": [owner_ref(deployment)],
                },
                "spec": {
                    "replicas": deployment["spec"].get("replicas", 1),
                    "selector": selector,
                    "template": template,
                },
            }
            if time.monotonic() < self.not_before.get(uid, 0.0):
                continue
            try:
                self.api.create("replicasets", replica_set, self.user)
            except Denied as err:  # getNewReplicaSet: Progressing=False, FailedCreate; requeued
                self.failures[uid] = self.failures.get(uid, 0) + 1
                self.not_before[uid] = time.monotonic() + min(BASE_DELAY * 2 ** self.failures[uid], MAX_DELAY)
                message = (
                    f'Failed to create new replica set "{replica_set["metadata"]["name"]}": {err.message}'
                )
                condition = {
                    "type": "Progressing",
                    "status": "False",
                    "reason": "FailedCreate",
                    "message": message,
                }
                deployment["status"] = {**(deployment.get("status") or {}), "conditions": [condition]}
                with contextlib.suppress(Denied):
                    self.api.update("deployments", deployment, self.user, subresource="status")


class ReplicaSetController:
    def __init__(self, api: ApiDouble, pod_limit: int) -> None:
        self.api, self.pod_limit = api, pod_limit
        self.user = controller_user("replicaset-controller")
        self.failures: dict[str, int] = {}
        self.not_before: dict[str, float] = {}
        self.creates_denied = 0

    def step(self) -> None:
        pods = self.api.list("pods")
        for replica_set in self.api.list("replicasets"):
            uid = replica_set["metadata"]["uid"]
            if time.monotonic() < self.not_before.get(uid, 0.0):
                continue
            active = [p for p in pods if controlled_by(p, uid) and is_active(p)]
            missing = replica_set["spec"].get("replicas", 1) - len(active)
            if missing > 0:
                self._create(replica_set, missing, len(pods))

    def _create(self, replica_set: dict[str, Any], missing: int, total: int) -> None:
        uid, batch, error = replica_set["metadata"]["uid"], 1, None
        while missing > 0 and error is None:
            for _ in range(min(batch, missing)):
                if total >= self.pod_limit:
                    return
                try:
                    self.api.create("pods", self._pod(replica_set), self.user)
                    total += 1
                except Denied as err:
                    error = err
                    break
                missing -= 1
            batch *= 2
        if error is None:
            self.failures.pop(uid, None)
            return
        self.creates_denied += 1
        failures = self.failures.get(uid, 0)
        self.failures[uid] = failures + 1
        self.not_before[uid] = time.monotonic() + min(BASE_DELAY * 2**failures, MAX_DELAY)
        self._report(replica_set, error)

    def _pod(self, replica_set: dict[str, Any]) -> dict[str, Any]:
        template = copy.deepcopy(replica_set["spec"]["template"])
        metadata = template.get("metadata") or {}
        return {
            "metadata": {
                "generateName": f"{replica_set['metadata']['name']}-",
                "namespace": replica_set["metadata"]["namespace"],
                "labels": metadata.get("labels") or {},
                "ownerReferences": [owner_ref(replica_set)],
            },
            "spec": template["spec"],
        }

    def _report(self, replica_set: dict[str, Any], error: Denied) -> None:
        condition = {
            "type": "ReplicaFailure",
            "status": "True",
            "reason": "FailedCreate",
            "message": error.message,
        }
        current = self.api.get(
            "replicasets", replica_set["metadata"]["namespace"], replica_set["metadata"]["name"]
        )
        if current is None or (current.get("status") or {}).get("conditions") == [condition]:
            return
        current["status"] = {**(current.get("status") or {}), "conditions": [condition]}
        self.api.update("replicasets", current, self.user, subresource="status")


JOB_NAME = "batch.kubernetes.io/job-name"
BACKOFF_LIMIT = 6  # batch/v1 JobSpec.backoffLimit default
POD_FAILURE_BACKOFF = (10.0, 360.0)  # job_controller.go DefaultJobPodFailureBackOff, MaxJobPodFailureBackOff


class JobController:
    """``pkg/controller/job/job_controller.go`` ``syncJob`` for a NonIndexed Job: the pods it
    owns are active, failed or succeeded; while ``failed <= backoffLimit`` it keeps
    ``min(parallelism, completions - succeeded)`` pods active, each new pod after a failure
    waiting the pod-failure backoff (10 s doubling to 6 min, from the newest failure); past
    the limit the Job gets ``Failed`` with ``BackoffLimitExceeded`` and no new pod.
    ``backoff`` lets a box compress that wait, so a few seconds show a whole Job's life."""

    def __init__(self, api: ApiDouble, backoff: tuple[float, float] = POD_FAILURE_BACKOFF) -> None:
        self.api, self.backoff = api, backoff
        self.user = controller_user("job-controller")
        self.seen_failed: dict[str, tuple[int, float]] = {}  # job uid → (failed pods, seen at)

    def step(self) -> None:
        pods = self.api.list("pods")
        for job in self.api.list("jobs"):
            if any(c["type"] == "Failed" for c in (job.get("status") or {}).get("conditions") or []):
                continue
            uid = job["metadata"]["uid"]
            owned = [p for p in pods if controlled_by(p, uid)]
            phases = [(p.get("status") or {}).get("phase") for p in owned]
            active = sum(1 for p in owned if is_active(p))
            failed, succeeded = phases.count("Failed"), phases.count("Succeeded")
            spec = job["spec"]
            if failed > spec.get("backoffLimit", BACKOFF_LIMIT):
                self._status(job, active, failed, succeeded, failed_condition=True)
                continue
            wanted = spec.get("parallelism", 1)
            if spec.get("completions") is not None:
                wanted = min(wanted, spec["completions"] - succeeded)
            before, seen_at = self.seen_failed.get(uid, (0, 0.0))
            if failed > before:
                self.seen_failed[uid] = (failed, time.monotonic())
                seen_at = time.monotonic()
            delay = min(self.backoff[0] * 2 ** max(failed - 1, 0), self.backoff[1]) if failed else 0.0
            if active < wanted and time.monotonic() >= seen_at + delay:
                for _ in range(wanted - active):
                    try:
                        self.api.create("pods", self._pod(job), self.user)
                    except Denied:
                        break
            self._status(job, active, failed, succeeded)

    def _pod(self, job: dict[str, Any]) -> dict[str, Any]:
        template = copy.deepcopy(job["spec"]["template"])
        labels = {**((template.get("metadata") or {}).get("labels") or {}), JOB_NAME: job["metadata"]["name"]}
        return {
            "metadata": {
                "generateName": f"{job['metadata']['name']}-",
                "namespace": job["metadata"]["namespace"],
                "labels": labels,
                "ownerReferences": [owner_ref(job)],
            },
            "spec": template["spec"],
        }

    def _status(self, job, active: int, failed: int, succeeded: int, failed_condition: bool = False) -> None:
        status = {**(job.get("status") or {}), "active": active, "failed": failed, "succeeded": succeeded}
        if failed_condition:
            status["conditions"] = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                     "message": "Job has reached the specified backoff limit"}]  # fmt: skip
        if status == job.get("status"):
            return
        job["status"] = status
        with contextlib.suppress(Denied):  # a conflict: the next sync writes it again
            self.api.update("jobs", job, self.user, subresource="status")


GROUP_NAME = "scheduling.k8s.io/group-name"  # the annotation Volcano's scheduler groups pods by
VOLCANO_JOBS, POD_GROUPS = "jobs.batch.volcano.sh", "podgroups.scheduling.volcano.sh"


class GangController:
    """Volcano's job controller (``pkg/controllers/job/job_controller_actions.go`` ``syncJob``):
    for a ``batch.volcano.sh`` Job, a PodGroup whose ``minMember`` is the Job's ``minAvailable``
    (every replica when unset), then every pod of every task at once, each annotated with the
    group's name and scheduled by ``volcano``; the batch scheduler binds the gang all or nothing."""

    def __init__(self, api: ApiDouble) -> None:
        self.api, self.user = api, controller_user("volcano-controllers")
        self.done: set[str] = set()

    def step(self) -> None:
        for job in self.api.list(VOLCANO_JOBS):
            uid = job["metadata"]["uid"]
            if uid in self.done:
                continue
            self.done.add(uid)
            name, namespace, spec = job["metadata"]["name"], job["metadata"]["namespace"], job["spec"]
            members = sum(task.get("replicas", 1) for task in spec["tasks"])
            group = {"metadata": {"name": name, "namespace": namespace, "ownerReferences": [owner_ref(job)]},
                     "spec": {"minMember": spec.get("minAvailable", members)}}  # fmt: skip
            self.api.create(POD_GROUPS, group, self.user)
            for task in spec["tasks"]:
                for index in range(task.get("replicas", 1)):
                    template = copy.deepcopy(task["template"])
                    metadata = template.get("metadata") or {}
                    pod = {
                        "metadata": {
                            "name": f"{name}-{task['name']}-{index}",
                            "namespace": namespace,
                            "labels": metadata.get("labels") or {},
                            "annotations": {**(metadata.get("annotations") or {}), GROUP_NAME: name},
                            "ownerReferences": [owner_ref(job)],
                        },
                        "spec": {**template["spec"], "schedulerName": spec.get("schedulerName", "volcano")},
                    }
                    with contextlib.suppress(Denied):  # refused: the Job's status would say so
                        self.api.create("pods", pod, self.user)
