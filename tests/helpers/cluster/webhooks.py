"""Admission webhooks called as kube-apiserver calls them, from a rendered configuration.

The double hands every write to ``Dispatcher.admit`` with the request's attributes; the
dispatcher picks the webhooks whose rules, namespaceSelector, objectSelector and
matchConditions match, builds the AdmissionReview v1 each one gets, calls it over HTTPS
(verified against its ``caBundle``, the service's DNS name as the TLS server name), applies
JSONPatch answers of mutating webhooks, gathers warnings, and turns a denial, an error or a
timeout into what the API server answers, by the webhook's ``failurePolicy``.

Upstream, in ``staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/``:
``predicates/rules/rules.go`` (rule matching, subresources included), ``predicates/namespace``
and ``predicates/object`` (the selectors), ``matchconditions/matcher.go`` (CEL conditions, an
error decided by failurePolicy), ``request/admissionreview.go`` (``CreateV1AdmissionReview``),
``mutating/dispatcher.go`` and ``validating/dispatcher.go`` (dry run and sideEffects, timeout,
failurePolicy, JSONPatch; mutating webhooks one after the other, validating ones in parallel,
a goroutine each in ``Dispatch``, the first error returned), ``errors/statuserror.go``
(``ToStatusErr``). The calls reuse their connections (``webhook/client.go`` builds one
``http.Transport`` per webhook, keep-alive on); here one connection per (webhook, thread),
kept open. The whole request is bounded by the API server's request timeout
(``--request-timeout``, 60 s; ``server/filters/timeout.go`` answers 504 when it passes), each
call by the smaller of its ``timeoutSeconds`` and what is left of it.
"""

from __future__ import annotations

import base64
import concurrent.futures
import http.client
import itertools
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import celpy
import jsonpatch
import orjson

from .kube import labels_match

MUTATING, VALIDATING = "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"
REQUEST_TIMEOUT = 60.0  # kube-apiserver --request-timeout default
TIMED_OUT = "request did not complete within requested timeout - context deadline exceeded"


@dataclass
class Attributes:
    """One request as the API server's admission chain sees it (``admission.Attributes``)."""

    operation: str
    group: str
    version: str
    resource: str
    kind: str
    namespace: str
    name: str
    obj: dict[str, Any] | None
    old_obj: dict[str, Any] | None = None
    subresource: str = ""
    user: Mapping[str, Any] = field(default_factory=dict)
    dry_run: bool = False
    deadline: float | None = None  # monotonic: when the request's timeout passes (set on its first call)

    def options(self) -> dict[str, Any]:
        """``GetOperationOptions``: CreateOptions or UpdateOptions, as the request carried them."""
        kind = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}[
            self.operation
        ]
        options: dict[str, Any] = {"kind": kind, "apiVersion": "meta.k8s.io/v1"}
        if self.dry_run:
            options["dryRun"] = ["All"]
        return options


class Denied(Exception):
    """The API server's answer to a refused request: a ``metav1.Status``."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


@dataclass
class Call:
    """One webhook call: for latency and for what each policy did."""

    webhook: str
    seconds: float
    outcome: str  # allowed | denied | error | ignored-error


@dataclass
class Admitted:
    obj: dict[str, Any] | None
    warnings: list[str]


class Dispatcher:
    """The webhooks of the configurations in ``docs``; ``endpoints`` maps a service
    ``(namespace, name)`` to the loopback ports of its ready pods; ``namespace_labels`` gives a
    namespace's labels (``None``: no such namespace)."""

    def __init__(
        self,
        docs: list[dict[str, Any]],
        endpoints: Callable[[str, str], list[int]],
        namespace_labels: Callable[[str], Mapping[str, str] | None],
        request_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        self.endpoints, self.namespace_labels = endpoints, namespace_labels
        self.request_timeout = request_timeout
        self.mutating = [_Hook(h) for d in docs if d["kind"] == MUTATING for h in d["webhooks"]]
        self.validating = [_Hook(h) for d in docs if d["kind"] == VALIDATING for h in d["webhooks"]]
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._next = itertools.count()
        self._local = threading.local()  # this thread's kept-alive connection per webhook
        self._connections: list[_Connection] = []  # every one opened, to close at the end
        self._parallel = concurrent.futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="webhook")
        self.connects = 0  # TCP+TLS connections opened: with keep-alive, far fewer than calls

    def admit(self, attrs: Attributes) -> Admitted:
        """Mutating webhooks, then validating ones. ``Denied`` when one refuses or fails closed."""
        mutated = self.mutating_only(attrs)
        validated = self.validating_only(attrs)
        return Admitted(validated.obj, mutated.warnings + validated.warnings)

    def mutating_only(self, attrs: Attributes) -> Admitted:
        """The mutating webhooks in order: a patch changes the object the next one sees."""
        self._start(attrs)
        warnings: list[str] = []
        for hook in self.mutating:
            if self._matches(hook, attrs):
                response = self._call(hook, attrs, warnings)
                if response is not None and response.get("patch"):
                    if response.get("patchType") != "JSONPatch":
                        raise Denied(500, "InternalError", f"{hook.name}: unsupported patchType")
                    patch = orjson.loads(base64.b64decode(response["patch"]))
                    attrs.obj = jsonpatch.apply_patch(attrs.obj, patch)
        return Admitted(attrs.obj, warnings)

    def validating_only(self, attrs: Attributes) -> Admitted:
        """The validating webhooks that match, all at once (none mutates); the first error to
        arrive is the answer, as ``Dispatch`` returns ``errs[0]``. Warnings in webhook order."""
        self._start(attrs)
        hooks = [hook for hook in self.validating if self._matches(hook, attrs)]
        found: list[list[str]] = [[] for _ in hooks]
        if len(hooks) == 1:  # one goroutine or the caller's thread: the same call
            self._call(hooks[0], attrs, found[0])
            return Admitted(attrs.obj, found[0])
        calls = [self._parallel.submit(self._call, h, attrs, w) for h, w in zip(hooks, found, strict=True)]
        for done in concurrent.futures.as_completed(calls):
            error = done.exception()
            if error is not None:
                raise error
        return Admitted(attrs.obj, [w for warnings in found for w in warnings])

    def close(self) -> None:
        """Close every kept-alive connection (the API server going away)."""
        self._parallel.shutdown(wait=True)
        with self._lock:
            connections, self._connections = self._connections, []
        for conn in connections:
            conn.close()

    def _start(self, attrs: Attributes) -> None:
        if attrs.deadline is None:
            attrs.deadline = time.monotonic() + self.request_timeout

    # -- which webhooks a request reaches -------------------------------------------------

    def _matches(self, hook: _Hook, attrs: Attributes) -> bool:
        if not any(_rule_matches(rule, attrs) for rule in hook.spec.get("rules") or []):
            return False
        if attrs.namespace and "namespaceSelector" in hook.spec:
            labels = self.namespace_labels(attrs.namespace)
            if labels is None or not labels_match(hook.spec["namespaceSelector"], labels):
                return False
        selector = hook.spec.get("objectSelector")
        if selector:
            labelled = [o for o in (attrs.obj, attrs.old_obj) if o is not None]
            if not any(
                labels_match(selector, (o.get("metadata") or {}).get("labels") or {}) for o in labelled
            ):
                return False
        return hook.conditions_hold(attrs, self.namespace_labels)

    # -- calling one --------------------------------------------------------------------

    def _call(self, hook: _Hook, attrs: Attributes, warnings: list[str]) -> dict[str, Any] | None:
        """The webhook's response, or ``None`` when its failure was ignored."""
        if attrs.dry_run and hook.spec.get("sideEffects") not in ("None", "NoneOnDryRun"):
            # ``webhookerrors.NewDryRunUnsupportedErr``: a webhook with side effects never sees a dry run.
            raise Denied(400, "BadRequest", f'admission webhook "{hook.name}" does not support dry run')
        review = review_for(hook, attrs)
        started = time.monotonic()
        left = (attrs.deadline or started + self.request_timeout) - started
        if left <= 0:
            raise Denied(504, "Timeout", TIMED_OUT)
        try:
            response = self._post(hook, review, min(float(hook.spec.get("timeoutSeconds", 10)), left))
        except (OSError, http.client.HTTPException, ValueError, KeyError) as err:
            seconds = time.monotonic() - started
            if attrs.deadline is not None and time.monotonic() >= attrs.deadline:
                self._record(Call(hook.name, seconds, "error"))
                raise Denied(504, "Timeout", TIMED_OUT) from err
            if hook.spec.get("failurePolicy", "Fail") == "Ignore":
                self._record(Call(hook.name, seconds, "ignored-error"))
                return None
            self._record(Call(hook.name, seconds, "error"))
            message = f'Internal error occurred: failed calling webhook "{hook.name}": {err}'
            raise Denied(500, "InternalError", message) from err
        self._record(
            Call(hook.name, time.monotonic() - started, "allowed" if response["allowed"] else "denied")
        )
        warnings.extend(response.get("warnings") or [])
        if not response["allowed"]:
            status = response.get("status") or {}
            code = max(int(status.get("code") or 0), 400)  # ToStatusErr: never below 400
            message = status.get("message") or "without explanation"
            reason = status.get("reason") or ""
            raise Denied(code, reason, f'admission webhook "{hook.name}" denied the request: {message}')
        return response

    def _post(self, hook: _Hook, review: dict[str, Any], timeout: float) -> dict[str, Any]:
        body = orjson.dumps(review)
        path = hook.spec["clientConfig"]["service"].get("path", "/")
        conn, reused = self._connection(hook)
        conn.timeout = timeout
        try:
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            reply = conn.getresponse()
            data = reply.read()
        except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
            self._drop(hook, conn)
            if not reused:
                raise
            # Go's transport retries a request on a kept-alive connection the server had closed.
            return self._post(hook, review, timeout)
        except BaseException:
            self._drop(hook, conn)
            raise
        if reply.status != 200:
            raise ValueError(f"the server responded with status {reply.status}")
        answer = orjson.loads(data)["response"]
        if answer.get("uid") != review["request"]["uid"]:
            raise ValueError("expected response.uid to match the request.uid")
        return answer

    def _connection(self, hook: _Hook) -> tuple[_Connection, bool]:
        """This thread's connection to ``hook``'s service, and whether it was used before. A new
        one picks the next ready endpoint, as a Service spreads new connections; one to an
        endpoint no longer ready is closed (the pod is gone)."""
        service = hook.spec["clientConfig"]["service"]
        ports = self.endpoints(service["namespace"], service["name"])
        kept: dict[str, _Connection] = self._local.__dict__.setdefault("connections", {})
        conn = kept.get(hook.name)
        if conn is not None and conn.port in ports:
            return conn, True
        if conn is not None:
            self._drop(hook, conn)
        if not ports:
            raise ConnectionRefusedError(f'no endpoints available for service "{service["name"]}"')
        port = ports[next(self._next) % len(ports)]
        conn = _Connection(f"{service['name']}.{service['namespace']}.svc", port, hook.tls, 10.0)
        kept[hook.name] = conn
        with self._lock:
            self._connections.append(conn)
            self.connects += 1
        return conn, False

    def _drop(self, hook: _Hook, conn: _Connection) -> None:
        conn.close()
        kept = self._local.__dict__.get("connections", {})
        if kept.get(hook.name) is conn:
            del kept[hook.name]
        with self._lock:
            if conn in self._connections:
                self._connections.remove(conn)

    def _record(self, call: Call) -> None:
        with self._lock:
            self.calls.append(call)


class _Hook:
    """One webhook of a configuration: its spec, its TLS trust, its compiled conditions."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec, self.name = spec, spec["name"]
        self.tls = ssl.create_default_context(
            cadata=base64.b64decode(spec["clientConfig"]["caBundle"]).decode()
        )
        env = celpy.Environment()
        self.conditions = [
            (c["name"], env.program(env.compile(c["expression"]))) for c in spec.get("matchConditions") or []
        ]

    def conditions_hold(self, attrs: Attributes, namespace_labels) -> bool:
        """Every matchCondition true. An evaluation error is the webhook's failure: Fail refuses
        the request, Ignore skips the webhook (``matchconditions/matcher.go``)."""
        if not self.conditions:
            return True
        activation = {
            "object": celpy.json_to_cel(attrs.obj),
            "oldObject": celpy.json_to_cel(attrs.old_obj),
            "request": celpy.json_to_cel(review_request(attrs)),
        }
        for name, program in self.conditions:
            try:
                result = program.evaluate(activation)
            except Exception as err:
                result = err
            if isinstance(result, (Exception, celpy.evaluation.CELEvalError)):
                if self.spec.get("failurePolicy", "Fail") == "Ignore":
                    return False
                message = f'failed calling webhook "{self.name}": matchCondition {name}: {result}'
                raise Denied(500, "InternalError", message)
            if not bool(result):
                return False
        return True


def _rule_matches(rule: Mapping[str, Any], attrs: Attributes) -> bool:
    """``rules.Matcher``: operation, group, version, and resource with its subresource."""

    def one(values, value) -> bool:
        return "*" in values or value in values

    if not one(rule.get("operations") or [], attrs.operation):
        return False
    if not one(rule.get("apiGroups") or [], attrs.group) or not one(
        rule.get("apiVersions") or [], attrs.version
    ):
        return False
    scope = rule.get("scope", "*")
    if scope != "*" and (scope == "Namespaced") != bool(attrs.namespace):
        return False
    requested = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    for pattern in rule.get("resources") or []:
        if pattern in ("*/*", requested):
            return True
        resource, _, sub = pattern.partition("/")
        if pattern == "*" and not attrs.subresource:
            return True
        if resource == "*" and sub == attrs.subresource:
            return True
        if sub == "*" and resource == attrs.resource:
            return True
    return False


def review_request(attrs: Attributes) -> dict[str, Any]:
    """``request`` of ``CreateV1AdmissionReview`` (request/admissionreview.go), field by field.
    kind/resource/subResource are the invocation's, requestKind/requestResource/
    requestSubResource the request's: the same here (matchPolicy Equivalent never has to
    convert, every rule names the version the double serves)."""
    gvk = {"group": attrs.group, "version": attrs.version, "kind": attrs.kind}
    gvr = {"group": attrs.group, "version": attrs.version, "resource": attrs.resource}
    user = {
        "username": attrs.user.get("username", ""),
        "uid": attrs.user.get("uid", ""),
        "groups": list(attrs.user.get("groups") or []),
        "extra": {},
    }
    request: dict[str, Any] = {
        "uid": str(uuid.uuid4()),  # types.UID(uuid.NewUUID()) in CreateAdmissionObjects
        "kind": gvk,
        "resource": gvr,
        "requestKind": dict(gvk),
        "requestResource": dict(gvr),
        "name": attrs.name,
        "namespace": attrs.namespace,
        "operation": attrs.operation,
        "userInfo": user,
        "object": attrs.obj,
        "oldObject": attrs.old_obj,
        "dryRun": attrs.dry_run,
        "options": attrs.options(),
    }
    if attrs.subresource:  # omitempty on the wire
        request["subResource"] = attrs.subresource
        request["requestSubResource"] = attrs.subresource
    return request


def review_for(hook: _Hook, attrs: Attributes) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": review_request(attrs)}


class _Connection(http.client.HTTPSConnection):
    """HTTPS to a loopback port, verified as the service's DNS name, as kube-apiserver dials a
    webhook service (``ServerName`` = ``<service>.<namespace>.svc``)."""

    def __init__(self, server_name: str, port: int, context: ssl.SSLContext, timeout: float) -> None:
        super().__init__("127.0.0.1", port, timeout=timeout, context=context)
        self._server_name, self._tls = server_name, context

    def connect(self) -> None:
        sock = socket.create_connection(("127.0.0.1", self.port), self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self._server_name)
