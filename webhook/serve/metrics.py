"""Prometheus metrics that stay correct when gunicorn runs several worker processes.

With ``PROMETHEUS_MULTIPROC_DIR`` set (``admit-guard serve`` sets it before the client is
imported), every worker writes its samples to files there and a scrape of any worker
aggregates all of them. Without it (tests, embedding), the metrics live in the app's own
registry. Gauges carry labels or are written only by workers, never by the gunicorn master:
a master's sample would linger in the aggregate forever.

A review's own samples (``count_request``: its count and latency) are found by one lookup of
its labels as the review gave them, remembered for the closed sets' labels only; mapping them
onto the closed sets and looking two children up on every review was half of the 9 µs that
call cost (measured in-process, issue 31). The samples themselves are still written by
``prometheus_client``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from functools import cache
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from ..state.source import Readiness
from . import metric_files

# Before any metric is made: its multi-process files are allocated, never sparse (SIGBUS).
metric_files.install()

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_UPDATED = "admit_guard_state_last_update_timestamp_seconds"
STATE_OBSERVE_INTERVAL = 1.0  # seconds between state gauge updates from the request path
# Decisions take tens of microseconds; the apiserver's budget is seconds.
_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


# Label values come from closed sets: a label taken from a request as sent would let any
# client grow every worker's memory and the metrics files without bound.
KINDS = frozenset(
    {"Pod", "Deployment", "ReplicaSet", "StatefulSet", "DaemonSet", "Job", "CronJob",
     "ReplicationController", "PodTemplate", "Binding", "ResourceClaim"}
)  # fmt: skip
OPERATIONS = frozenset({"CREATE", "UPDATE", "DELETE", "CONNECT"})
ENDPOINTS = frozenset({"validate", "mutate"})
VERDICTS = frozenset({"allow", "warn", "patch", "deny"})  # ``admission.Outcome.verdict``
# Reasons are the kubelet's and the guard's codes, but ``OutOf<resource>`` carries any extended
# resource a pod names: the first few distinct ones keep their name, later ones read "other".
MAX_REASONS = 64
OTHER = "other"


def closed(value: str, known: frozenset[str]) -> str:
    return value if value in known else OTHER


def multiprocess() -> bool:
    return bool(os.environ.get(MULTIPROC_ENV))


class Metrics:
    """The guard's metrics, and the scrape that aggregates them across workers."""

    def __init__(self) -> None:
        self._registry = None if multiprocess() else CollectorRegistry()
        registry = self._registry
        self.requests = Counter(
            "admit_guard_requests",
            "Admission requests answered, by endpoint, object kind, operation and verdict.",
            ["endpoint", "kind", "operation", "verdict"],
            registry=registry,
        )
        self.violations = Counter(
            "admit_guard_violations",
            "Policy findings (denied, audited or fixed), by policy, reason and mode outcome. "
            "Dry runs are not counted.",
            ["policy", "reason", "outcome"],
            registry=registry,
        )
        self.bad_requests = Counter(
            "admit_guard_bad_requests",
            "Requests that were not a usable AdmissionReview, by endpoint and HTTP status.",
            ["endpoint", "code"],
            registry=registry,
        )
        self.latency = Histogram(
            "admit_guard_decision_seconds",
            "Time from request body read to response ready, by endpoint.",
            ["endpoint"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.state_objects = Gauge(
            "admit_guard_state_objects",
            "Objects in the worker's cluster state, by kind.",
            ["kind"],
            multiprocess_mode="livemax",
            registry=registry,
        )
        self.state_updated = Gauge(
            _UPDATED,
            "Wall-clock time of the last change applied to the cluster state (oldest worker).",
            ["source"],
            multiprocess_mode="livemin",
            registry=registry,
        )

        self.state_relists = Gauge(
            "admit_guard_state_relists",
            "Full relists of nodes or pods after the watch could not resume (410 Gone), all workers.",
            ["source"],
            multiprocess_mode="livesum",
            registry=registry,
        )
        self.state_ready = Gauge(
            "admit_guard_state_ready",
            "1 while the worker's cluster state is synced and fresh enough to judge against (any worker).",
            ["source"],
            multiprocess_mode="livemin",
            registry=registry,
        )
        self.unchecked = Counter(
            "admit_guard_unchecked_decisions",
            "Reviews the guard could not decide (unreadable object, internal error), answered per "
            "failOpen: fail-open or fail-closed.",
            ["endpoint", "answer"],
            registry=registry,
        )
        self.binding_fail_open = Counter(
            "admit_guard_binding_fail_open",
            "Binds (and DRA allocations) allowed unchecked, by why: pod-unknown, state-unavailable, "
            "node-unknown, api-error, deadline, table-error, busy, unknown-pool (DRA: a pool no "
            "ResourceSlice publishes, not coordinated).",
            ["reason"],
            registry=registry,
        )
        self.table_trouble = Counter(
            "admit_guard_reservation_table_trouble",
            "Decisions that found the replica's reservation table failing (table-error: decided "
            "through the Lease alone, or unchecked) or damaged (table-damaged: rebuilt).",
            ["reason"],
            registry=registry,
        )
        self.topology_doubts = Counter(
            "admit_guard_topology_refusals_doubted",
            "Topology manager refusals said as warnings instead, by why: fingerprint-mismatch (the "
            "node's NRT was computed over other pods than the guard knows there).",
            ["reason"],
            registry=registry,
        )
        self.storm = StormGauges(registry)
        self._state_observed_at = float("-inf")
        self._storm_observed_at = float("-inf")
        self._reasons: set[str] = set()
        # ``labels()`` takes a lock and builds a key on every call: children are looked up once.
        self._children: dict[tuple, Any] = {}
        self._request_children: dict[tuple[str, str, str, str], tuple] = {}

    def _child(self, metric, *labels: str):
        key = (metric, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def count_request(self, endpoint: str, kind: str, operation: str, verdict: str, latency: float) -> None:
        """One answered review: its latency and its count. The two children are found by one
        lookup of the labels as the review gave them (half of this call's cost was mapping
        them onto the closed sets and building two keys, on every review)."""
        children = self._request_children.get((endpoint, kind, operation, verdict))
        if children is None:
            children = self._children_for_request(endpoint, kind, operation, verdict)
        latency_child, count = children
        latency_child.observe(latency)
        count.inc()

    def _children_for_request(self, endpoint: str, kind: str, operation: str, verdict: str) -> tuple:
        """The latency and count children of a review's labels; remembered only for labels
        of the closed sets, so a client sending new kinds cannot grow the lookup."""
        label = closed(endpoint, ENDPOINTS)
        children = (
            self._child(self.latency, label),
            self._child(self.requests, label, closed(kind, KINDS), closed(operation, OPERATIONS), verdict),
        )
        if endpoint in ENDPOINTS and kind in KINDS and operation in OPERATIONS and verdict in VERDICTS:
            self._request_children[(endpoint, kind, operation, verdict)] = children
        return children

    def count_unchecked(self, endpoint: str, allowed: bool) -> None:
        self._child(
            self.unchecked, closed(endpoint, ENDPOINTS), "fail-open" if allowed else "fail-closed"
        ).inc()

    def count_binding_fail_open(self, reason: str) -> None:
        self._child(self.binding_fail_open, reason).inc()  # reasons come from a closed set

    def count_table_trouble(self, reason: str) -> None:
        self._child(self.table_trouble, reason).inc()  # reasons come from a closed set

    def count_topology_doubt(self, reason: str) -> None:
        self._child(self.topology_doubts, reason).inc()  # reasons come from a closed set

    def count_bad_request(self, endpoint: str, code: int) -> None:
        self._child(self.bad_requests, closed(endpoint, ENDPOINTS), str(code)).inc()

    def count_finding(self, policy: str, reason: str, outcome: str) -> None:
        if reason not in self._reasons and len(self._reasons) < MAX_REASONS:
            self._reasons.add(reason)
        self._child(self.violations, policy, reason if reason in self._reasons else OTHER, outcome).inc()

    def observe_state_now_and_then(self, readiness: Callable[[], Readiness], source: str) -> None:
        """``observe_state`` at most once a second: four multi-process file writes per request
        cost more than the decision, and a scrape observes the state itself anyway."""
        now = time.monotonic()
        if now - self._state_observed_at >= STATE_OBSERVE_INTERVAL:
            self._state_observed_at = now
            self.observe_state(readiness(), source)

    def observe_storm_now_and_then(self, storm) -> None:
        """The storm breakers' gauges, at most once a second from the request path."""
        now = time.monotonic()
        if storm is not None and now - self._storm_observed_at >= STATE_OBSERVE_INTERVAL:
            self._storm_observed_at = now
            self.storm.publish(storm)

    def observe_state(self, readiness: Readiness, source: str) -> None:
        self.state_objects.labels("node").set(readiness.nodes)
        self.state_objects.labels("pod").set(readiness.pods)
        self.state_relists.labels(source).set(readiness.relists)
        self.state_ready.labels(source).set(1 if readiness.ready else 0)
        if readiness.updated_at is not None:
            self.state_updated.labels(source).set(readiness.updated_at)

    def scrape(self) -> bytes:
        registry = CollectorRegistry()
        source = MultiProcessCollector(CollectorRegistry()) if self._registry is None else self._registry
        registry.register(_WithStateAge(source))
        registry.register(_DegradedFiles())
        return generate_latest(registry)


class _LabelledValues:
    """A labelled gauge published whole each time: a label set missing from the new values is
    set to 0, because a multi-process gauge cannot drop one (it would read its last value)."""

    def __init__(self, gauge: Gauge) -> None:
        self._gauge = gauge
        self._published: set[tuple[str, ...]] = set()

    def publish(self, values: dict[tuple[str, ...], float]) -> None:
        for labels in self._published - values.keys():
            self._gauge.labels(*labels).set(0)
        for labels, value in values.items():
            self._gauge.labels(*labels).set(value)
        self._published |= values.keys()


class AuditGauges:
    """The periodic audit's findings by type and namespace (``serve --audit-interval``).

    A resolved finding reads as 0, never as its last count. The master audits, once per
    replica: across processes each gauge reads the value written last (a worker only inherits
    them, unset).
    """

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.findings = Gauge(
            "admit_guard_audit_findings",
            "Findings of the last periodic audit, by finding type and namespace ('' for nodes).",
            ["type", "namespace"],
            multiprocess_mode="livemostrecent",
            registry=registry,
        )
        self.last_run = Gauge(
            "admit_guard_audit_last_run_timestamp_seconds",
            "Wall-clock time the last periodic audit finished.",
            ["source"],
            multiprocess_mode="livemostrecent",
            registry=registry,
        )
        self.duration = Gauge(
            "admit_guard_audit_duration_seconds",
            "How long the last periodic audit took.",
            ["source"],
            multiprocess_mode="livemostrecent",
            registry=registry,
        )
        self._findings = _LabelledValues(self.findings)

    def publish(
        self, counts: dict[tuple[str, str], int], source: str, finished_at: float, took: float
    ) -> None:
        self._findings.publish(counts)
        self.last_run.labels(source).set(finished_at)
        self.duration.labels(source).set(took)


class StormGauges:
    """Open storm breakers by namespace and owner, and the trips and probes so far.

    Every worker sees the same rejections, so breakers and trips are the same in each (max
    across workers); each probe is admitted by the one worker that answered it (sum).
    """

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.open = Gauge(
            "admit_guard_storm_breakers_open",
            "1 while the storm breaker of an owner (kind/name) is open or half-open.",
            ["namespace", "owner"],
            multiprocess_mode="livemax",
            registry=registry,
        )
        self.trips = Gauge(
            "admit_guard_storm_trips",
            "Storm breakers opened since the worker started (any worker).",
            multiprocess_mode="livemax",
            registry=registry,
        )
        self.probes = Gauge(
            "admit_guard_storm_probes",
            "Half-open probe pods admitted, all workers.",
            multiprocess_mode="livesum",
            registry=registry,
        )
        self._open = _LabelledValues(self.open)

    def publish(self, storm) -> None:
        """Open breakers read 1, breakers that closed since the last publish 0."""
        storm.prune(time.time())
        self._open.publish(
            {(b.owner.namespace, f"{b.owner.kind}/{b.owner.name}"): 1 for b in storm.open_breakers()}
        )
        self.trips.set(storm.trips)
        self.probes.set(storm.probes)


class _WithStateAge:
    """Adds ``admit_guard_state_age_seconds``, computed at scrape time from the oldest update."""

    def __init__(self, source) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        families: Iterable[Metric] = self._source.collect()
        for family in families:
            yield family
            if family.name == _UPDATED and family.samples:
                age = GaugeMetricFamily(
                    "admit_guard_state_age_seconds",
                    "Seconds since the last change applied to the cluster state (oldest worker).",
                    labels=["source"],
                )
                for sample in family.samples:
                    age.add_metric([sample.labels["source"]], max(0.0, time.time() - sample.value))
                yield age


class _DegradedFiles:
    """``admit_guard_metric_files_degraded``: the scraped worker's metric files that could not
    grow (a full filesystem), whose samples stopped updating (``metric_files``)."""

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "admit_guard_metric_files_degraded",
            "Metric files of the worker answering the scrape that could not be allocated (full "
            "filesystem): its samples in them stopped updating.",
            value=metric_files.degraded_files(),
        )


REFUSED_METRIC = "admit_guard_requests_refused"
BUFFER_BUDGET = "buffer-budget"  # the one reason so far: 503 past --max-buffered-bytes


@cache
def _refused() -> Counter:
    # Made on first use, in the worker's event loop, outside any app's registry (the loop has
    # no app): under gunicorn a scrape of any worker reads it from the multi-process files.
    return Counter(
        REFUSED_METRIC,
        "Requests the server answered 503 before a thread saw them, by reason: buffer-budget (the "
        "worker held --max-buffered-bytes of requests, parsed copies counted).",
        ["reason"],
        registry=None,
    )


def count_refused(reason: str) -> None:
    """One request refused by the event loop; ``reason`` comes from a closed set."""
    _refused().labels(reason).inc()


def worker_exited(pid: int) -> None:
    """gunicorn ``child_exit``: drop a dead worker's live gauges from the aggregate."""
    if multiprocess():
        mark_process_dead(pid)
