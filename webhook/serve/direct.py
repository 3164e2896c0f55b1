"""A request the loop parsed, answered by a pool thread without gunicorn's parser (issue 31).

The event loop reads a whole request before a thread sees it (``worker.py``), and parses a
plain head on the way (``framing.Head``). gunicorn's thread then parsed the same bytes again
into its own request object, built the environ from that and wrote the response through its
``Response``: about 100 µs a review, a fifth of the guard's CPU per review. ``Exchange`` builds
the PEP 3333 environ from the parsed head and the buffered body, and the reply from what the
app returns, in one buffer (sent by ``reply.send_without_waiting``).

What gunicorn does for a request that the guard does not need is left out, and documented
here: no access log (``serve`` configures none), no ``pre_request``/``post_request`` hooks
(none set), no forwarded-header or PROXY-protocol handling (the API server calls the pod
directly). What it does need is kept: ``Server``, ``Date`` and ``Connection`` on every reply,
a Content-Length when the app gives none (the whole body is in hand), no body for HEAD, 1xx,
204 and 304, keep-alive as HTTP/1.0 and 1.1 define it, repeated header names joined with
commas (as gunicorn and RFC 9110 section 5.3 do). A head that is not plain never gets here.
"""

from __future__ import annotations

import io
import sys
import time
from collections.abc import Callable, Iterable
from email.utils import formatdate
from typing import Any
from urllib.parse import unquote_to_bytes

from gunicorn import SERVER, SERVER_SOFTWARE
from gunicorn.http.wsgi import FileWrapper

from .framing import Head

_NO_BODY = frozenset((204, 304))
# Names the environ keeps without the ``HTTP_`` prefix (PEP 3333).
_UNPREFIXED = {"CONTENT_TYPE", "CONTENT_LENGTH"}


class Exchange:
    """The environ for a parsed request, and the reply's bytes for what the app answers."""

    def __init__(self, app: Callable, *, secure: bool, multiprocess: bool) -> None:
        self.app = app
        self.base = {
            "wsgi.errors": sys.stderr,
            "wsgi.version": (1, 0),
            "wsgi.multithread": True,
            "wsgi.multiprocess": multiprocess,
            "wsgi.run_once": False,
            "wsgi.file_wrapper": FileWrapper,
            "wsgi.input_terminated": True,
            "wsgi.url_scheme": "https" if secure else "http",
            "SERVER_SOFTWARE": SERVER_SOFTWARE,
            "SCRIPT_NAME": "",
        }
        self._date = (0, "")

    def environ(self, head: Head, body: bytes, client: Any, server: Any) -> dict[str, Any]:
        """PEP 3333, as gunicorn's ``wsgi.create`` builds it for the same request."""
        environ = self.base.copy()
        path, _, query = head.target.partition("?")
        environ.update(
            {
                "wsgi.input": io.BytesIO(body),
                "REQUEST_METHOD": head.method,
                "RAW_URI": head.target,
                "PATH_INFO": unquote_to_bytes(path).decode("latin-1") if "%" in path else path,
                "QUERY_STRING": query,
                "SERVER_PROTOCOL": f"HTTP/1.{head.minor}",
            }
        )
        if isinstance(client, tuple):
            environ["REMOTE_ADDR"], environ["REMOTE_PORT"] = client[0], str(client[1])
        if isinstance(server, tuple):
            environ["SERVER_NAME"], environ["SERVER_PORT"] = server[0], str(server[1])
        for name, value in head.fields:
            key = name.upper().replace("-", "_")
            if key not in _UNPREFIXED:
                key = "HTTP_" + key
            environ[key] = f"{environ[key]},{value}" if key in environ else value
        return environ

    def answer(self, environ: dict[str, Any], head: Head, keep_alive: bool) -> tuple[bytes, bool]:
        """The whole reply to ``environ`` and whether the connection stays open: ``keep_alive``
        (the worker's say) and the request's own (``Connection``, HTTP/1.0 or 1.1)."""
        keep_alive = keep_alive and _client_keeps_alive(environ, head.minor)
        started: list = []
        written: list[bytes] = []

        def start_response(status: str, headers: list[tuple[str, str]], exc_info=None):
            if exc_info is not None and started:
                raise exc_info[1].with_traceback(exc_info[2])
            started[:] = [status, headers]
            return written.append

        result: Iterable[bytes] = self.app(environ, start_response)
        try:
            written.extend(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        status, headers = started
        body = b"".join(written)
        code = int(status[:3])
        lines = [f"HTTP/1.{head.minor} {status}\r\n"]
        length = None
        for name, value in headers:
            if name.lower() == "content-length":
                length = int(value)
            lines.append(f"{name}: {value}\r\n")
        if code < 200 or code in _NO_BODY:
            body = b""
        elif length is None:
            lines.append(f"Content-Length: {len(body)}\r\n")
        elif len(body) != length:  # what the app declared is what the client reads
            body, keep_alive = body[:length], keep_alive and len(body) > length
        if head.method == "HEAD":
            body = b""
        connection = "keep-alive" if keep_alive else "close"
        lines.append(f"Server: {SERVER}\r\nDate: {self._http_date()}\r\nConnection: {connection}\r\n\r\n")
        return "".join(lines).encode("latin-1") + body, keep_alive

    def _http_date(self) -> str:
        """RFC 9110's ``Date``, formatted once a second rather than once a reply."""
        now = int(time.time())
        if self._date[0] != now:
            self._date = (now, formatdate(now, usegmt=True))
        return self._date[1]


def _client_keeps_alive(environ: dict[str, Any], minor: int) -> bool:
    """RFC 9112 section 9.3: HTTP/1.1 persists unless ``close``; 1.0 only with ``keep-alive``."""
    options = {token.strip().lower() for token in environ.get("HTTP_CONNECTION", "").split(",")}
    return "close" not in options if minor else "keep-alive" in options
