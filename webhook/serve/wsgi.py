"""/validate and /mutate as plain WSGI, in front of the Flask app.

An admission endpoint is one POST of JSON in and JSON out, on the path of every pod the
cluster creates. Flask's request machinery (request context, URL adapter, signals, response
object) cost about 50 µs a request in-process, more than most of the guard's decisions, and an
admission call needs none of it. So these two paths are answered here, installed as
the app's ``wsgi_app`` (Flask's own middleware hook: the test client and gunicorn both go
through it), and every other path is left to Flask.

With a client CA configured (``serve --client-ca``), only a connection that presented a
certificate the server verified, with an allowed name, is answered on these paths; any other
gets 403 before its body is judged. The server says which connection that is through the WSGI
environ (``CLIENT_VERIFIED``, set by ``reply.with_client_identity``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from http import HTTPStatus
from typing import Any

import orjson

from ..admission import MUTATE, VALIDATE
from ..state.waiting import WouldWait
from .limits import DRAIN_LIMIT

# ``answer(endpoint, body, verified) -> (status, JSON body)``: the decision, whatever the body
# holds. ``verified``: the caller presented a verified client certificate with an allowed name.
Answer = Callable[[str, bytes, bool], tuple[int, bytes]]
WSGIApp = Callable[[dict[str, Any], Callable], Iterable[bytes]]
CLIENT_VERIFIED = "admit_guard.client_verified"

log = logging.getLogger(__name__)
_STATUS_LINES = {status.value: f"{status.value} {status.phrase}" for status in HTTPStatus}


class AdmissionEndpoints:
    """``POST /validate`` and ``POST /mutate`` answered by ``answer``; the rest by ``app``.

    ``refused(endpoint, code)`` is told of each request answered before its decision: a body
    over ``max_body_bytes`` (413), a caller without a verified certificate when
    ``require_client_cert`` (403).
    """

    def __init__(
        self,
        app: WSGIApp,
        answer: Answer,
        max_body_bytes: int,
        refused: Callable[[str, int], None],
        *,
        require_client_cert: bool = False,
    ) -> None:
        self.app = app
        self.answer = answer
        self.max_body_bytes = max_body_bytes
        self.refused = refused
        self.require_client_cert = require_client_cert
        self.paths = {"/validate": VALIDATE, "/mutate": MUTATE}

    def __call__(self, environ: dict[str, Any], start_response: Callable) -> Iterable[bytes]:
        endpoint = self.paths.get(environ.get("PATH_INFO", ""))
        if endpoint is None:
            return self.app(environ, start_response)
        if environ.get("REQUEST_METHOD") != "POST":
            return _reply(start_response, 405, error_body(405, "use POST"), [("Allow", "POST")])
        verified = bool(environ.get(CLIENT_VERIFIED))
        if self.require_client_cert and not verified:
            message = (
                "a client certificate signed by the configured client CA, with an allowed name, is required"
            )
            return self._refuse(start_response, endpoint, 403, message)
        # Reading is the server's part: a body it cannot frame (a forbidden trailer field) raises
        # the server's own parse error, which it answers 400 and closes the connection on.
        body = self._body(environ)
        if body is None:
            message = f"request body is larger than the {self.max_body_bytes}-byte limit"
            return self._refuse(start_response, endpoint, 413, message)
        try:
            status, answer = self.answer(endpoint, body, verified)
        except WouldWait:
            raise  # the worker's loop hands the request to a pool thread
        except Exception as err:  # still JSON, as every answer of the guard is (Flask did this before)
            log.exception("%s failed", environ.get("PATH_INFO"))
            return _reply(start_response, 500, error_body(500, f"internal error ({type(err).__name__})"))
        return _reply(start_response, status, answer)

    def _refuse(self, start_response: Callable, endpoint: str, code: int, message: str) -> list[bytes]:
        try:
            self.refused(endpoint, code)
        except Exception:  # counting it must not turn the answer into a 500
            log.exception("counting a %d answer failed", code)
        return _reply(start_response, code, error_body(code, message))

    def _body(self, environ: dict[str, Any]) -> bytes | None:
        """The whole body, or ``None`` when it is over the limit (then drained, up to
        ``DRAIN_LIMIT``: an unread body makes the socket close with a reset, and the client
        would never see the 413).

        Without a Content-Length, a body is read only when the server says where it ends
        (``wsgi.input_terminated``: chunked requests under gunicorn), as Werkzeug does.
        """
        stream = environ.get("wsgi.input")
        try:
            length = int(environ.get("CONTENT_LENGTH") or -1)
        except ValueError:
            length = -1
        if length > self.max_body_bytes:
            _drain(stream, min(length, DRAIN_LIMIT))
            return None
        if length >= 0:
            return stream.read(length) if length and stream is not None else b""
        if not environ.get("wsgi.input_terminated") or stream is None:
            return b""
        body = stream.read(self.max_body_bytes + 1)
        if len(body) > self.max_body_bytes:
            _drain(stream, DRAIN_LIMIT)
            return None
        return body


def _reply(
    start_response: Callable, status: int, body: bytes, extra: list[tuple[str, str]] | None = None
) -> list[bytes]:
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body))), *(extra or ())]
    start_response(_STATUS_LINES[status], headers)
    return [body]


def error_body(code: int, message: str) -> bytes:
    """What every error answer of the guard holds: ``{"error": ..., "code": ...}``."""
    return orjson.dumps({"error": message, "code": code})


def _drain(stream, remaining: int) -> None:
    """Read and drop ``remaining`` bytes of the request body (less if it ends early)."""
    while stream is not None and remaining > 0:
        chunk = stream.read(min(remaining, 65536))
        if not chunk:
            break
        remaining -= len(chunk)
