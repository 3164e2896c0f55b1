"""AdmissionReview v1 in, ``Decision`` through the engine, AdmissionReview v1 out.

Pure, like the engine: the server does the HTTP, this module does the contract. The wire
shapes are typed here (``ReviewBody``, ``RequestBody``, ``Response``, ``Status``: the
fields of ``admission.k8s.io/v1`` the guard reads and writes); ``parse_review`` turns a
body into an ``AdmissionRequest`` and every request that is not a well-formed
AdmissionReview raises ``ReviewError`` naming the field, so the server answers 400 instead
of guessing; ``Outcome.body`` is the reply.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

import jsonpatch
import orjson

from .config import Config
from .engine import Decision, Violation, evaluate
from .formats import deep_json
from .kube.errors import FieldError
from .state import ClusterState

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"
VALIDATE, MUTATE = "validate", "mutate"


class ReviewError(ValueError):
    """The body is not an AdmissionReview v1 request; the message names the field."""


class GroupVersionKind(TypedDict):
    group: str
    version: str
    kind: str


class GroupVersionResource(TypedDict):
    group: str
    version: str
    resource: str


class UserInfo(TypedDict, total=False):
    username: str
    groups: list[str]


class RequestBody(TypedDict, total=False):
    """``request`` as the API server sends it (the fields the guard reads)."""

    uid: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    subResource: str
    name: str
    namespace: str
    operation: Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]
    userInfo: UserInfo
    object: dict[str, Any]
    oldObject: dict[str, Any] | None
    dryRun: bool


class Status(TypedDict):
    """Why a request is denied: ``reason`` is the comma-separated reason codes."""

    code: int
    reason: str
    message: str


class _Verdict(TypedDict):
    uid: str
    allowed: bool


class Response(_Verdict, total=False):
    """``response``: the verdict (always), warnings, a JSONPatch (base64) when mutating, and
    why when denied."""

    warnings: list[str]
    patchType: Literal["JSONPatch"]
    patch: str
    status: Status


class ReviewBody(TypedDict, total=False):
    """The AdmissionReview envelope: ``request`` in, ``response`` out."""

    apiVersion: str
    kind: str
    request: RequestBody
    response: Response


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
    # From the API server (``request.kind``, ``request.resource``), not from the object: an
    # object's own ``kind`` or namespace is whatever its author wrote.
    api_version: str = ""
    resource: str = ""
    sub_resource: str = ""
    # Where the body was nested past the JSON parser's depth limit (that part was cut away):
    # a field the guard could not read, answered per failOpen.
    too_deep: str | None = None


@dataclass(slots=True)
class Outcome:
    """What the server sends back, plus what it logs and counts."""

    request: AdmissionRequest
    response: Response
    decision: Decision | None = None
    error: str | None = None  # the object could not be read (answered per failOpen)
    reasons: list[str] = field(default_factory=list)
    fail_open: str | None = None  # why a binding was allowed unchecked (a closed set)
    table_trouble: str | None = None  # the replica's reservation table failed or was damaged

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

    @classmethod
    def allowing(cls, request: AdmissionRequest, **details: Any) -> Outcome:
        """An outcome that allows ``request``, for the caller to fill in."""
        return cls(request, {"uid": request.uid, "allowed": True}, **details)

    def body(self) -> bytes:
        review: ReviewBody = {"apiVersion": API_VERSION, "kind": KIND, "response": self.response}
        return orjson.dumps(review)


def parse_review(body: bytes) -> AdmissionRequest:
    """Decode and validate an AdmissionReview request body."""
    too_deep = None
    try:
        review = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        if not deep_json.too_deep(err):
            raise ReviewError(f"body is not JSON: {err}") from None
        review, too_deep = _cut_and_load(body)
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
    kind, api_version = _kind(request, obj)
    resource = _mapping(request, "resource")
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
        kind=kind,
        namespace=_string(request, "namespace"),
        name=_string(request, "name") or _generated_name(obj),
        obj=obj,
        old_obj=old_obj,
        user=_string(user_info, "username", "request.userInfo.username"),
        groups=tuple(groups),
        dry_run=dry_run,
        api_version=api_version,
        resource=_string(resource, "resource", "request.resource.resource"),
        sub_resource=_string(request, "subResource"),
        too_deep=too_deep,
    )


def _cut_and_load(body: bytes) -> tuple[Any, str]:
    """A body nested past the parser's limit, read with what is too deep cut away."""
    try:
        cut, where = deep_json.cut_too_deep(body)
        return orjson.loads(cut), where
    except (deep_json.TooComplex, orjson.JSONDecodeError) as err:
        raise ReviewError(f"body is not JSON the guard can read: nested too deeply ({err})") from None


def _kind(request: Mapping[str, Any], obj: Mapping[str, Any] | None) -> tuple[str, str]:
    """``(kind, apiVersion)`` from ``request.kind``; from the object only in hand-written
    reviews that lack it (the API server always sends it)."""
    kind = _mapping(request, "kind")
    if kind:
        group = _string(kind, "group", "request.kind.group")
        version = _string(kind, "version", "request.kind.version")
        return _string(kind, "kind", "request.kind.kind"), f"{group}/{version}" if group else version
    obj = obj or {}
    return str(obj.get("kind") or ""), str(obj.get("apiVersion") or "")


def _mapping(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ReviewError(f"request.{key}: not an object")
    return value


def review(
    request: AdmissionRequest,
    endpoint: str,
    state: ClusterState | None,
    config: Config,
    state_unavailable: str | None = None,
    now: float | None = None,
) -> Outcome:
    """Run the engine and shape its decision for ``endpoint`` (``validate`` or ``mutate``).

    The mutating webhook only repairs (policies in ``fix`` mode) and never denies: denials
    come once, from the validating webhook, which sees the object after mutation. A fixable
    finding that still reaches ``validate`` means the mutation did not run, so it denies.
    """
    outcome = Outcome.allowing(request)
    response = outcome.response
    if request.obj is None or request.operation not in ("CREATE", "UPDATE"):
        return outcome
    if request.sub_resource and not is_claim_status(request):
        return outcome  # status, scale, ephemeral containers: not a new pod spec to judge
    try:
        decision = evaluate(
            as_requested(request.obj, request),
            request.operation,
            state,
            config,
            old_object=as_requested(request.old_obj, request) if request.old_obj else None,
            user=request.user,
            groups=request.groups,
            state_unavailable=state_unavailable,
            now=now,
            unreadable=_cut_field(request),
        )
        patch = _effective_patch(request.obj, decision.patch) if endpoint == MUTATE else None
    except FieldError as err:
        return unchecked(request, endpoint, f"{request.kind} field {err}", config)
    except RecursionError:
        return unchecked(request, endpoint, f"{request.kind}: object nested too deeply to read", config)
    outcome.decision = decision
    if decision.unchecked:
        _answer_unchecked(outcome, endpoint, decision, config)
    if endpoint == MUTATE:
        if patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
            response["warnings"] = decision.fix_notes
            outcome.reasons = [v.reason for v in decision.fixed]
        return outcome
    return respond(outcome, decision)


def respond(outcome: Outcome, decision: Decision, code: int = 403) -> Outcome:
    """The validating answer to a decision: its warnings, and a denial (``code``, every reason,
    one message) when anything was violated. Objects, binds and allocations answer this way."""
    response = outcome.response
    outcome.decision = decision
    denied = [*decision.violations, *decision.fixed]
    if decision.warnings:
        response.setdefault("warnings", []).extend(decision.warnings)
    outcome.reasons = [v.reason for v in (*denied, *decision.audited)]
    if denied:
        decision.allowed = False
        response["allowed"] = False
        response["status"] = {
            "code": code,
            "reason": ",".join(dict.fromkeys(v.reason for v in denied)),
            "message": denial_message(decision),
        }
    return outcome


def deny(
    outcome: Outcome, policy: str, reason: str, message: str, *, node: str | None = None, code: int = 403
) -> Outcome:
    """A denial for one reason, in the one denial format (``respond``)."""
    return respond(outcome, Decision(violations=[Violation(policy, reason, message, node)]), code)


def allowed_unchecked(outcome: Outcome, why: str, what: str, detail: str) -> Outcome:
    """Allowed though ``what`` (a binding, an allocation) could not be checked: the bind and
    allocation webhooks fail open by design, and say so in a warning. ``why`` is one of a
    closed set (``coordination.transaction``), counted in a metric."""
    outcome.fail_open = why
    outcome.error = f"{what} not checked ({why}): {detail}"
    outcome.response.setdefault("warnings", []).append(
        f"admit-guard did not check this {what} and allowed it: {detail}"
    )
    return outcome


def is_claim_status(request: AdmissionRequest) -> bool:
    """A write of ``resourceclaims/status``: where a scheduler hands out DRA devices."""
    return request.resource == "resourceclaims" and request.sub_resource == "status"


def _cut_field(request: AdmissionRequest) -> FieldError | None:
    """The field cut for depth, as the engine names an unreadable one (from the object)."""
    if request.too_deep is None:
        return None
    where = request.too_deep.removeprefix("request.object.")
    return FieldError(where, f"nested more than {deep_json.DEPTH_LIMIT} levels deep (not read)")


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
    outcome = Outcome.allowing(request, error=problem)
    if endpoint != MUTATE:
        _per_fail_open(outcome.response, problem, config)
    return outcome


def _per_fail_open(response: Response, problem: str, config: Config) -> None:
    if config.fail_open:
        response["warnings"] = [
            f"admit-guard could not check this object and allowed it (failOpen): {problem}"
        ]
    else:
        response["allowed"] = False
        response["status"] = {"code": 422, "reason": "Invalid", "message": f"admit-guard: {problem}"}


def _answer_unchecked(outcome: Outcome, endpoint: str, decision: Decision, config: Config) -> None:
    """Policies that needed an unreadable field did not run: answer for them per failOpen.

    The policies that did run keep their verdict: an unreadable request elsewhere in the pod
    never lets a pinned template through.
    """
    skipped = ", ".join(decision.unchecked)
    problem = f"{outcome.request.kind} field {decision.unreadable} (not checked: {skipped})"
    outcome.error = problem
    if endpoint == MUTATE:
        return
    if decision.violations or decision.fixed:
        if not config.fail_open:
            decision.violations.append(Violation("failOpen", "Invalid", problem))
        return
    _per_fail_open(outcome.response, problem, config)


def _effective_patch(obj: Mapping[str, Any], patch: list[dict[str, Any]] | None) -> list | None:
    """The patch, or None when it is empty or changes nothing: never send a no-op patch."""
    if not patch:
        return None
    return patch if jsonpatch.apply_patch(obj, patch) != obj else None


def as_requested(obj: Mapping[str, Any], request: AdmissionRequest) -> Mapping[str, Any]:
    """The object with the API server's kind and namespace: the policies read only its spec
    from the author. (On CREATE the namespace may be only in the request.)"""
    metadata = obj.get("metadata")
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise FieldError("metadata", "must be a mapping")
    authoritative = dict(obj)
    if request.kind:
        authoritative["kind"] = request.kind
        authoritative["apiVersion"] = request.api_version
    if request.namespace:
        authoritative["metadata"] = {**metadata, "namespace": request.namespace}
    return authoritative


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
    if value.__class__ is str and (value or not required):
        return value  # the API server's case, decided first: nine fields a review
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise ReviewError(f"{where or f'request.{key}'}: missing or not a string")
    return value
