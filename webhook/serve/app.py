"""The app the kube-apiserver talks to: /validate /mutate /healthz /readyz /metrics.

A Flask app whose two admission paths are answered in front of it (``wsgi.py``): ``answer``
below reads a review's body and hands it to the pipeline (``pipeline.py``: the guards and the
engine), then counts and logs what it decided.

``create_app`` is an explicit factory: gunicorn workers, tests and benchmarks each build an
app from a config and a state source, and nothing lives in module globals. Every answer is
JSON; no input reaches a 500 or a traceback.
"""

from __future__ import annotations

import logging
import sys
import time

import orjson
from flask import Flask, Response
from werkzeug.exceptions import HTTPException

from .. import admission
from ..admission import MUTATE, AdmissionRequest, Outcome, ReviewError
from ..allocation import AllocationGuard
from ..binding import BindGuard
from ..config import Config
from ..coordination.probes import SharedProbes
from ..pipeline import Pipeline, read_review
from ..state.source import StateSource
from ..state.waiting import WouldWait
from .decision_log import flush_decision_lines, line_writer, log_lines_in_background
from .limits import MAX_BODY_BYTES
from .metrics import Metrics
from .wsgi import AdmissionEndpoints, error_body

SOURCE_EXTENSION = "admit_guard.state_source"
# The paths whose answers the worker's event loop may give itself (``serve/worker.py``): every
# wait on their way raises ``WouldWait`` there instead (``state/waiting.py``).
ANSWERS_WITHOUT_WAITING = "answers_without_waiting"
DECISION_LOG = "admit_guard.decision"


def create_app(
    config: Config,
    source: StateSource,
    *,
    source_name: str = "snapshot",
    max_body_bytes: int = MAX_BODY_BYTES,
    bind_guard: BindGuard | None = None,
    storm_probes: SharedProbes | None = None,
    allocation_guard: AllocationGuard | None = None,
    require_client_cert: bool = False,
) -> Flask:
    """Build the webhook app. ``source`` supplies the cluster state and its readiness.

    ``storm_probes``: where the storm breakers' probe slots are shared (None: this worker alone).
    ``require_client_cert``: answer /validate and /mutate only for callers whose client
    certificate the server verified (``serve --client-ca``); others get 403.
    """
    app = Flask("admit_guard")
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    app.extensions[SOURCE_EXTENSION] = source  # gunicorn's worker_exit closes it
    metrics = Metrics()
    log_line = line_writer(logging.getLogger(DECISION_LOG))

    def observe(state) -> None:
        if state.storm is not None:
            metrics.observe_storm_now_and_then(state.storm)

    pipeline = Pipeline(
        config,
        source,
        bind_guard=bind_guard,
        allocation_guard=allocation_guard,
        probes=storm_probes,
        observe=observe,
    )

    def answer(endpoint: str, body: bytes, verified: bool) -> tuple[int, bytes]:
        started = time.perf_counter()
        try:
            routed = read_review(body)
        except ReviewError as err:
            metrics.count_bad_request(endpoint, 400)
            return 400, error_body(400, str(err))
        except Exception as err:  # a parser bug is still the body's problem, never a 500
            logging.getLogger(__name__).exception("unreadable AdmissionReview")
            metrics.count_bad_request(endpoint, 400)
            return 400, error_body(400, f"unreadable AdmissionReview ({type(err).__name__})")
        req = routed.request
        try:
            outcome = pipeline.decide(routed, endpoint, verified=verified, now=time.time())
        except WouldWait:
            raise  # nothing counted or logged yet: a pool thread decides it again
        except Exception as err:  # a bug must not become a 500 on the path of every pod
            logging.getLogger(__name__).exception("review %s failed", req.uid)
            outcome = admission.unchecked(req, endpoint, f"internal error ({type(err).__name__})", config)
        latency = time.perf_counter() - started
        _record(metrics, endpoint, outcome, latency)
        log_line(_log_line(endpoint, outcome, latency))
        metrics.observe_state_now_and_then(source.readiness, source_name)
        return 200, outcome.body()

    app.wsgi_app = AdmissionEndpoints(
        app.wsgi_app,
        answer,
        max_body_bytes,
        metrics.count_bad_request,
        require_client_cert=require_client_cert,
    )
    setattr(app, ANSWERS_WITHOUT_WAITING, frozenset(app.wsgi_app.paths))

    @app.get("/healthz")
    def healthz() -> Response:
        return _json(200, {"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        readiness = source.readiness()
        body = {
            "ready": readiness.ready,
            "reason": readiness.reason,
            "nodes": readiness.nodes,
            "pods": readiness.pods,
            "updatedAt": readiness.updated_at,
        }
        return _json(200 if readiness.ready else 503, body)

    @app.get("/metrics")
    def scrape() -> Response:
        metrics.observe_state(source.readiness(), source_name)
        with source.reading() as view:
            if view.state is not None and view.state.storm is not None:
                metrics.storm.publish(view.state.storm)
        return Response(metrics.scrape(), mimetype="text/plain; version=0.0.4; charset=utf-8")

    @app.errorhandler(HTTPException)
    def http_error(err: HTTPException) -> Response:
        code = err.code or 500
        return Response(
            error_body(code, err.description or err.name), status=code, mimetype="application/json"
        )

    return app


def _record(metrics: Metrics, endpoint: str, outcome: Outcome, latency: float) -> None:
    req = outcome.request
    metrics.count_request(endpoint, req.kind, req.operation, outcome.verdict, latency)
    if outcome.error:
        metrics.count_unchecked(endpoint, outcome.allowed)
    if outcome.fail_open:
        metrics.count_binding_fail_open(outcome.fail_open)
    if outcome.table_trouble:
        metrics.count_table_trouble(outcome.table_trouble)
    decision = outcome.decision
    if decision is None or req.dry_run:
        return  # dry runs have no side effects, and counting a finding is one
    if endpoint == MUTATE:
        findings = [("fixed", v) for v in decision.fixed]
    else:
        findings = [("denied", v) for v in (*decision.violations, *decision.fixed)]
        findings += [("audited", v) for v in decision.audited]
    for outcome_label, violation in findings:
        metrics.count_finding(violation.policy, violation.reason, outcome_label)
    for doubt in decision.doubts:
        metrics.count_topology_doubt(doubt)


def _log_line(endpoint: str, outcome: Outcome, latency: float) -> str:
    """One JSON line per decision; identifiers and verdicts only, never object bodies."""
    req: AdmissionRequest = outcome.request
    line = {
        "msg": "decision",
        "uid": req.uid,
        "endpoint": endpoint,
        "kind": req.kind,
        "namespace": req.namespace,
        "name": req.name,
        "operation": req.operation,
        "user": req.user,
        "dryRun": req.dry_run,
        "verdict": outcome.verdict,
        "reasons": outcome.reasons,
        "latencyMs": round(latency * 1000, 3),
    }
    if outcome.error:
        line["error"] = outcome.error
    return orjson.dumps(line).decode()


def log_decisions_to_stderr() -> None:
    """Decision lines go to stderr as bare JSON (one per line), written off the request thread."""
    log_lines_in_background(logging.getLogger(DECISION_LOG), sys.stderr)


def log_events_to_stderr(level: str) -> logging.Handler:
    """The guard's own events (storm breaker transitions, watch retries) at ``--log-level``, one
    line each on stderr: gunicorn configures only its own loggers, so without this they vanish.
    Written by a thread of their own, as decisions are: some are logged under the state's or the
    breakers' lock, which a blocked stderr must never hold."""
    logger = logging.getLogger(__name__.partition(".")[0])  # the whole package's: state/ logs too
    handler = log_lines_in_background(
        logger, sys.stderr, "%(asctime)s [%(process)d] [%(levelname)s] %(name)s: %(message)s"
    )
    logger.setLevel(level.upper())
    return handler


def flush_decisions() -> None:
    """Write the decision lines still queued (a worker is exiting)."""
    flush_decision_lines(logging.getLogger(DECISION_LOG))


def _json(code: int, body: dict) -> Response:
    return Response(orjson.dumps(body), status=code, mimetype="application/json")
