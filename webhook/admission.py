"""AdmissionReview v1 in, ``Decision`` through the engine, AdmissionReview v1 out.

Pure, like the engine: the server does the HTTP, this module does the contract. Every request
that is not a well-formed AdmissionReview raises ``ReviewError`` naming the field, so the
server answers 400 instead of guessing.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonpatch
import orjson

from .config import Config
from .engine import Decision, evaluate
from .kube.errors import FieldError
from .state import ClusterState

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
VALIDATE, MUTATE = "validate", "mutate"


class ReviewError(ValueError):
    """The body is not an AdmissionReview v1 request; the message names the field."""


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """The parts of ``request`` the guard reads; the object body stays out of logs."""

    uid: str
    operation: str
    kind: str
    namespace: str
    name: str
    obj: Mapping[str, Any] | None
    old_obj: Mapping[str, Any] | None
    user: str
    groups: tuple[str, ...]
    dry_run: bool


@dataclass(slots=True)
class Outcome:
    """What the server sends back, plus what it logs and counts."""

    request: AdmissionRequest
    response: dict[str, Any]
    decision: Decision | None = None
    error: str | None = None  # the object could not be read (answered per failOpen)
    reasons: list[str] = field(default_factory=list)

    @property
    def allowed(self) -> bool:
        return bool(self.response["allowed"])

    @property
    def verdict(self) -> str:
        if not self.allowed:
            return "deny"
        if "patch" in self.response:
            return "patch"
        return "warn" if self.response.get("warnings") else "allow"

    def body(self) -> bytes:
        return orjson.dumps({"apiVersion": API_VERSION, "kind": KIND, "response": self.response})


def parse_review(body: bytes) -> AdmissionRequest:
    """Decode and validate an AdmissionReview request body."""
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise ReviewError(f"body is not JSON: {err}") from None
    if not isinstance(review, dict):
        raise ReviewError("body must be a JSON object (an AdmissionReview)")
    if review.get("apiVersion") != API_VERSION:
        raise ReviewError(f"apiVersion must be {API_VERSION!r}, got {review.get('apiVersion')!r}")
    if review.get("kind") != KIND:
        raise ReviewError(f"kind must be {KIND!r}, got {review.get('kind')!r}")
    request = review.get("request")
    if not isinstance(request, dict):
        raise ReviewError("request: missing or not an object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("request.uid: missing or not a non-empty string")
    operation = _string(request, "operation", required=True)
    obj = request.get("object")
    if not isinstance(obj, dict):
        if operation in ("CREATE", "UPDATE"):
            raise ReviewError(f"request.object: missing or not an object (required for {operation})")
        obj = None  # DELETE and CONNECT carry no object to judge
    old_obj = request.get("oldObject")
    if old_obj is not None and not isinstance(old_obj, dict):
        raise ReviewError("request.oldObject: not an object")
    kind = request.get("kind")
    kind = kind.get("kind") if isinstance(kind, dict) else None
    user_info = request.get("userInfo") or {}
    if not isinstance(user_info, dict):
        raise ReviewError("request.userInfo: not an object")
    groups = user_info.get("groups") or []
    if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
        raise ReviewError("request.userInfo.groups: not a list of strings")
    dry_run = request.get("dryRun", False)
    if not isinstance(dry_run, bool):
        raise ReviewError("request.dryRun: not a boolean")
    return AdmissionRequest(
        uid=uid,
        operation=operation,
        kind=kind if isinstance(kind, str) else str((obj or {}).get("kind") or ""),
        namespace=_string(request, "namespace"),
        name=_string(request, "name") or _generated_name(obj),
        obj=obj,
        old_obj=old_obj,
        user=_string(user_info, "username", "request.userInfo.username"),
        groups=tuple(groups),
        dry_run=dry_run,
    )


def review(
    request: AdmissionRequest,
    endpoint: str,
    state: ClusterState | None,
    config: Config,
    state_unavailable: str | None = None,
) -> Outcome:
    """Run the engine and shape its decision for ``endpoint`` (``validate`` or ``mutate``).

    The mutating webhook only repairs (policies in ``fix`` mode) and never denies: denials
    come once, from the validating webhook, which sees the object after mutation. A fixable
    finding that still reaches ``validate`` means the mutation did not run, so it denies.
    """
    response: dict[str, Any] = {"uid": request.uid, "allowed": True}
    outcome = Outcome(request, response)
    if request.obj is None or request.operation not in ("CREATE", "UPDATE"):
        return outcome
    try:
        decision = evaluate(
            _with_namespace(request.obj, request.namespace),
            request.operation,
            state,
            config,
            old_object=request.old_obj,
            user=request.user,
            groups=request.groups,
            state_unavailable=state_unavailable,
        )
    except FieldError as err:
        return unchecked(request, endpoint, f"{request.kind} field {err}", config)
    outcome.decision = decision
    if endpoint == MUTATE:
        patch = _effective_patch(request.obj, decision.patch)
        if patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
            response["warnings"] = decision.fix_notes
            outcome.reasons = [v.reason for v in decision.fixed]
        return outcome
    denied = [*decision.violations, *decision.fixed]
    if decision.warnings:
        response["warnings"] = list(decision.warnings)
    outcome.reasons = [v.reason for v in (*denied, *decision.audited)]
    if denied:
        response["allowed"] = False
        response["status"] = {
            "code": 403,
            "reason": ",".join(dict.fromkeys(v.reason for v in denied)),
            "message": denial_message(decision),
        }
    return outcome


def denial_message(decision: Decision) -> str:
    """Every violation, numbered when there are several: one fix-and-retry loop, not many."""
    lines = [f"{v.reason}: {v.message}" for v in decision.violations]
    lines += [
        f"{v.reason}: {v.message} (policy {v.policy} is in fix mode, but the mutating webhook "
        "did not repair this object)"
        for v in decision.fixed
    ]
    if len(lines) == 1:
        return f"admit-guard: {lines[0]}"
    return "admit-guard: " + " ".join(f"({i}) {line}" for i, line in enumerate(lines, 1))


def unchecked(request: AdmissionRequest, endpoint: str, problem: str, config: Config) -> Outcome:
    """The answer when the guard could not decide: per ``failOpen``, from ``validate`` only."""
    outcome = Outcome(request, {"uid": request.uid, "allowed": True}, error=problem)
    if endpoint == MUTATE:
        return outcome
    if config.fail_open:
        outcome.response["warnings"] = [
            f"admit-guard could not check this object and allowed it (failOpen): {problem}"
        ]
    else:
        outcome.response["allowed"] = False
        outcome.response["status"] = {"code": 422, "reason": "Invalid", "message": f"admit-guard: {problem}"}
    return outcome


def _effective_patch(obj: Mapping[str, Any], patch: list[dict[str, Any]] | None) -> list | None:
    """The patch, or None when it is empty or changes nothing: never send a no-op patch."""
    if not patch:
        return None
    return patch if jsonpatch.apply_patch(obj, patch) != obj else None


def _with_namespace(obj: Mapping[str, Any], namespace: str) -> Mapping[str, Any]:
    """On CREATE the namespace may only be in the request; the policies need it on the object."""
    metadata = obj.get("metadata")
    if not namespace or not isinstance(metadata, dict) or metadata.get("namespace"):
        return obj
    return {**obj, "metadata": {**metadata, "namespace": namespace}}


def _generated_name(obj: Mapping[str, Any] | None) -> str:
    metadata = (obj or {}).get("metadata")
    if not isinstance(metadata, dict):
        return ""
    name = metadata.get("name")
    if isinstance(name, str) and name:
        return name
    prefix = metadata.get("generateName")
    return f"{prefix}*" if isinstance(prefix, str) and prefix else ""


def _string(data: Mapping[str, Any], key: str, where: str | None = None, *, required: bool = False) -> str:
    value = data.get(key)
    where = where or f"request.{key}"
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise ReviewError(f"{where}: missing or not a string")
    return value
