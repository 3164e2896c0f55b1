"""A scheduler, as kube-scheduler and a batch scheduler (Volcano) both behave where the second
incident happens: each decides from its own cache, which lags the API server, assumes its own
decisions at once (so it never gives one GPU twice itself), and binds through ``pods/binding``.

Upstream (``pkg/scheduler/``):

- ``eventhandlers.go``: a scheduler takes the pending pods whose ``schedulerName`` is its own
  and that have no ``nodeName``;
- ``framework/plugins``: ``noderesources`` (``Insufficient <resource>``, the pod slot counted),
  ``nodeaffinity`` (``nodeSelector`` and required terms, ``matchFields`` on ``metadata.name``),
  ``dynamicresources`` (a free device of a ResourceSlice on the node for each unallocated
  claim; ``bindClaim`` writes the delete-protection finalizer with an Update, then
  ``status.allocation`` and ``reservedFor`` with UpdateStatus, then the Binding follows);
- ``schedule_one.go``: a random pick among the best-scored nodes (``selectHost``), ``FitError``
  (``0/N nodes are available: ...``), and on a failed bind the pod is forgotten from the cache
  and retried after a backoff (``podInitialBackoffSeconds`` 1 s, doubling to
  ``podMaxBackoffSeconds`` 10 s), its condition ``PodScheduled=False`` saying why.

The batch scheduler's gangs (Volcano, ``pkg/scheduler/plugins/gang``): pods annotated with a
PodGroup are placed together; unless ``minMember`` of them fit at once, none is bound and each
says ``pod group is not ready, N/M tasks in gang unschedulable``.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .apiserver import ApiDouble
from .cache import Cache
from .controllers import GROUP_NAME, POD_GROUPS
from .kube import allocatable, allocation, is_active, labels_match, pod_requests
from .webhooks import Denied

DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"
USERS = {
    "default-scheduler": {"username": "system:kube-scheduler", "groups": ["system:authenticated"]},
    "volcano": {
        "username": "system:serviceaccount:volcano-system:volcano-scheduler",
        "groups": ["system:serviceaccounts", "system:authenticated"],
    },
}
AFFINITY = "node(s) didn't match Pod's node affinity/selector"
CLAIMS = "cannot allocate all claims"


@dataclass
class Assumed:
    node: str
    requests: dict[str, float]
    devices: list[tuple[str, str, str]] = field(default_factory=list)  # (driver, pool, device)


class Scheduler:
    def __init__(
        self, name: str, api: ApiDouble, lag: float, seed: int, backoff: tuple[float, float] = (1.0, 10.0)
    ) -> None:
        self.name, self.api, self.backoff = name, api, backoff
        self.user = USERS.get(name, {"username": f"system:serviceaccount:kube-system:{name}"})
        self.cache = Cache(api.cluster, ("pods", "nodes", "resourceclaims", "resourceslices"), lag)
        self.rng = random.Random(f"{seed}-{name}")
        self.assumed: dict[str, Assumed] = {}
        self.retry_at: dict[str, tuple[float, int]] = {}
        self.denied_before: set[str] = set()
        self.counts = Counter()  # binds, binds_denied, binds_retried, allocations_denied, unschedulable

    # -- the scheduling loop -----------------------------------------------------------------

    def step(self) -> None:
        self.cache.sync()
        pods = self.cache.list("pods")
        bound = {p["metadata"]["uid"] for p in pods if p["spec"].get("nodeName")}
        for uid in [u for u in self.assumed if u in bound]:  # the cache confirms the assumption
            del self.assumed[uid]
        now = time.monotonic()
        queue = sorted(
            (p for p in pods if self._mine(p) and p["metadata"]["uid"] not in self.assumed),
            key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]),
        )
        gangs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for pod in queue:
            if self.retry_at.get(pod["metadata"]["uid"], (0.0, 0))[0] > now:
                continue
            group = (pod["metadata"].get("annotations") or {}).get(GROUP_NAME)
            if group:
                gangs.setdefault((pod["metadata"]["namespace"], group), []).append(pod)
            else:
                self.schedule_one(pod)
        for (namespace, group), members in gangs.items():
            self.schedule_gang(namespace, group, members)

    def schedule_gang(self, namespace: str, group: str, members: list[dict[str, Any]]) -> None:
        """Assume each member in turn; bind them all only if ``minMember`` fit (``gang``'s
        ``JobReady``), else forget every assumption."""
        pod_group = self.api.get(POD_GROUPS, namespace, group)
        if pod_group is None:
            return
        placed = []
        for pod in members:
            feasible, _ = self._filter(pod)
            if not feasible:
                continue
            best = max(score for _, score, _ in feasible)
            node, _, devices = self.rng.choice([f for f in feasible if f[1] == best])
            self.assumed[pod["metadata"]["uid"]] = Assumed(node, pod_requests(pod), [d for _, d in devices])
            placed.append((pod, node, devices))
        if len(placed) < pod_group["spec"]["minMember"]:
            for pod, _, _ in placed:
                del self.assumed[pod["metadata"]["uid"]]
            self.counts["unschedulable"] += len(members)
            missing = len(members) - len(placed)
            message = f"pod group is not ready, {missing}/{len(members)} tasks in gang unschedulable"
            for pod in members:
                self._failed(pod, "Unschedulable", message)
            return
        for pod, node, devices in placed:
            self._bind(pod, node, devices)

    def _mine(self, pod: dict[str, Any]) -> bool:
        spec = pod["spec"]
        return (
            spec.get("schedulerName", "default-scheduler") == self.name
            and not spec.get("nodeName")
            and is_active(pod)
        )

    def schedule_one(self, pod: dict[str, Any]) -> None:
        feasible, reasons = self._filter(pod)
        if not feasible:
            self.counts["unschedulable"] += 1
            nodes = len(self.cache.objects["nodes"])
            detail = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
            self._failed(pod, "Unschedulable", f"0/{nodes} nodes are available: {detail}.")
            return
        best = max(score for _, score, _ in feasible)
        node, _, devices = self.rng.choice([f for f in feasible if f[1] == best])
        self.assumed[pod["metadata"]["uid"]] = Assumed(node, pod_requests(pod), [d for _, d in devices])
        self._bind(pod, node, devices)

    def _bind(self, pod: dict[str, Any], node: str, devices) -> None:
        """The assumed pod's claims, then its Binding; a refusal forgets the assumption."""
        uid = pod["metadata"]["uid"]
        try:
            self._bind_claims(pod, node, devices)
            if uid in self.denied_before:
                self.counts["binds_retried"] += 1
            try:
                self.api.bind(pod["metadata"]["namespace"], pod["metadata"]["name"], uid, node, self.user)
            except Denied:
                self.counts["binds_denied"] += 1
                raise
            self.counts["binds"] += 1
            self.retry_at.pop(uid, None)
        except Denied as err:
            del self.assumed[uid]
            self.denied_before.add(uid)
            self._failed(pod, "SchedulerError", err.message)

    def _failed(self, pod: dict[str, Any], reason: str, message: str) -> None:
        """Back off, and say why on the pod (its status, not admitted by webhooks)."""
        uid = pod["metadata"]["uid"]
        attempts = self.retry_at.get(uid, (0.0, 0))[1]
        delay = min(self.backoff[0] * 2**attempts, self.backoff[1])
        self.retry_at[uid] = (time.monotonic() + delay, attempts + 1)
        current = self.api.get("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])
        if current is None or current["spec"].get("nodeName"):
            return
        condition = {"type": "PodScheduled", "status": "False", "reason": reason, "message": message}
        status = current.setdefault("status", {})
        if condition in (status.get("conditions") or []):
            return
        status["conditions"] = [c for c in status.get("conditions") or [] if c["type"] != "PodScheduled"]
        status["conditions"].append(condition)
        status.setdefault("phase", "Pending")
        with contextlib.suppress(Denied):  # changed meanwhile: the next attempt says it again
            self.api.update("pods", current, self.user, subresource="status")

    # -- filter and score ---------------------------------------------------------------------

    def _filter(self, pod: dict[str, Any]):
        requests = pod_requests(pod)
        usage = self._usage()
        feasible, reasons = [], Counter()
        for node in self.cache.list("nodes"):
            name = node["metadata"]["name"]
            if not _affinity_matches(pod, node):
                reasons[AFFINITY] += 1
                continue
            free = allocatable(node)
            used = usage.get(name, {})
            short = [r for r, amount in requests.items() if used.get(r, 0.0) + amount > free.get(r, 0.0)]
            if short:
                for resource in short:
                    reasons[f"Insufficient {resource}"] += 1
                continue
            devices = self._devices_for(pod, name)
            if devices is None:
                reasons[CLAIMS] += 1
                continue
            # LeastAllocated on cpu: the emptier node scores higher.
            score = round(
                1 - (used.get("cpu", 0.0) + requests.get("cpu", 0.0)) / max(free.get("cpu", 1.0), 1e-9), 2
            )
            feasible.append((name, score, devices))
        return feasible, reasons

    def _usage(self) -> dict[str, dict[str, float]]:
        usage: dict[str, dict[str, float]] = {}
        cached = {p["metadata"]["uid"]: p for p in self.cache.list("pods")}
        placed = [(p["spec"]["nodeName"], pod_requests(p)) for p in cached.values()
                  if p["spec"].get("nodeName") and is_active(p)]  # fmt: skip
        placed += [(a.node, a.requests) for uid, a in self.assumed.items()]
        for node, requests in placed:
            used = usage.setdefault(node, {})
            for resource, amount in requests.items():
                used[resource] = used.get(resource, 0.0) + amount
        return usage

    # -- DRA ------------------------------------------------------------------------------------

    def _claims(self, pod: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The pod's ResourceClaims from the cache (``None``: one is not there yet)."""
        claims = []
        for ref in pod["spec"].get("resourceClaims") or []:
            found = [c for c in self.cache.list("resourceclaims")
                     if c["metadata"]["name"] == ref.get("resourceClaimName")
                     and c["metadata"]["namespace"] == pod["metadata"]["namespace"]]  # fmt: skip
            if not found:
                return None
            claims.append(found[0])
        return claims

    def _devices_for(self, pod: dict[str, Any], node: str):
        """For each unallocated claim, a device of a slice on ``node`` that no allocated claim in
        the cache and no assumption of this scheduler holds: ``[(claim, device), ...]``, or
        ``None`` when a claim cannot be allocated here."""
        claims = self._claims(pod)
        if claims is None:
            return None
        taken = {
            (r["driver"], r["pool"], r["device"])
            for c in self.cache.list("resourceclaims")
            for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
            or []
        }
        taken |= {d for a in self.assumed.values() for d in a.devices}
        chosen = []
        for claim in claims:
            if (claim.get("status") or {}).get("allocation"):
                continue
            free = [
                (s["spec"]["driver"], s["spec"]["pool"]["name"], d["name"])
                for s in self.cache.list("resourceslices")
                if s["spec"].get("nodeName") == node
                for d in s["spec"].get("devices") or []
            ]
            free = [d for d in free if d not in taken]
            if not free:
                return None
            taken.add(free[0])
            chosen.append((claim, free[0]))
        return chosen

    def _bind_claims(self, pod: dict[str, Any], node: str, devices) -> None:
        """``bindClaim``: finalizer (Update), then allocation and reservation (UpdateStatus)."""
        for claim, (driver, pool, device) in devices:
            metadata = claim["metadata"]
            latest = self.api.get("resourceclaims", metadata["namespace"], metadata["name"])
            if latest is None:
                raise Denied(404, "NotFound", f"resourceclaim {metadata['name']} not found")
            if DELETE_PROTECTION not in (latest["metadata"].get("finalizers") or []):
                latest["metadata"].setdefault("finalizers", []).append(DELETE_PROTECTION)
                latest = self.api.update("resourceclaims", latest, self.user)
            request = latest["spec"]["devices"]["requests"][0]["name"]
            user = {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
            latest["status"] = {
                "allocation": allocation(request, driver, pool, device, node),
                "reservedFor": [user],
            }
            try:
                self.api.update("resourceclaims", latest, self.user, subresource="status")
            except Denied:
                self.counts["allocations_denied"] += 1
                raise


def _affinity_matches(pod: dict[str, Any], node: dict[str, Any]) -> bool:
    spec, labels = pod["spec"], node["metadata"].get("labels") or {}
    if not labels_match({"matchLabels": spec.get("nodeSelector") or {}}, labels):
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})  # fmt: skip
    terms = required.get("nodeSelectorTerms")
    if not terms:
        return True
    fields = {"metadata.name": node["metadata"]["name"]}
    return any(
        labels_match({"matchExpressions": term.get("matchExpressions") or []}, labels)
        and labels_match({"matchExpressions": term.get("matchFields") or []}, fields)
        for term in terms
    )
