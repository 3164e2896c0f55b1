"""A gthread worker whose pool threads only ever see whole requests.

gunicorn's ``gthread`` hands a new connection to a pool thread, which then does the TLS
handshake and reads the request on a blocking socket. A client that trickles one byte a second
holds that thread for as long as it likes: a dozen such connections stalled every decision of a
worker. ``GuardWorker`` keeps the handshake and the reading of the request (headers and body) in
the worker's event loop, on non-blocking sockets, under one deadline per request
(``--request-timeout``). Only a complete request reaches a thread, with its bytes already
buffered, so a thread never waits on a client. Requests over the body limit are answered 413
from the loop (chunked ones too, as soon as they pass it); requests that miss the deadline are
answered 408 and closed. Flask and the app are unchanged.
"""

from __future__ import annotations

import contextlib
import errno
import selectors
import ssl
import time
from dataclasses import dataclass, field
from functools import partial

from gunicorn import http, sock
from gunicorn.workers.gthread import TConn, ThreadWorker

DEFAULT_REQUEST_TIMEOUT = 10.0
DEFAULT_MAX_BODY = 3 * 1024 * 1024
MAX_HEAD = 64 * 1024  # request line and headers; gunicorn's own limits are below this
# After a 413 the rest of the body is read and dropped (up to this much), or the client, still
# sending, would meet a reset instead of the answer.
DRAIN_LIMIT = 16 * 1024 * 1024
_READ_SIZE = 256 * 1024

INCOMPLETE, COMPLETE, TOO_LARGE, MALFORMED = "incomplete", "complete", "too large", "malformed"


@dataclass(slots=True)
class RequestFraming:
    """How far a buffered HTTP/1.1 request has arrived; resumable as more bytes come in.

    Only the framing is read (where the head ends, Content-Length or chunk sizes): gunicorn
    parses the request itself once it is whole.
    """

    max_body: int
    head_end: int = -1
    length: int | None = None  # Content-Length
    chunked: bool = False
    scan: int = 0  # chunked: where the next chunk-size line starts
    body: int = 0  # chunked: bytes of body seen so far
    end: int = -1  # where the request ends, once known

    def progress(self, data: bytearray) -> str:
        if self.head_end < 0:
            at = data.find(b"\r\n\r\n")
            if at < 0:
                return MALFORMED if len(data) > MAX_HEAD else INCOMPLETE
            verdict = self._read_head(bytes(data[:at]))
            self.head_end = self.scan = at + 4
            if verdict is not None:
                return verdict
        if self.chunked:
            return self._chunks(data)
        self.end = self.head_end + (self.length or 0)
        return COMPLETE if len(data) >= self.end else INCOMPLETE

    def _read_head(self, head: bytes) -> str | None:
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                try:
                    self.length = int(value.strip())
                except ValueError:
                    return MALFORMED
                if self.length < 0:
                    return MALFORMED
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                self.chunked = True
        if self.length is not None and self.length > self.max_body:
            return TOO_LARGE
        return None

    def _chunks(self, data: bytearray) -> str:
        while True:
            line_end = data.find(b"\r\n", self.scan)
            if line_end < 0:
                return MALFORMED if len(data) - self.scan > 1024 else INCOMPLETE
            size_text = bytes(data[self.scan : line_end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                return MALFORMED
            if size == 0:
                trailer_end = data.find(b"\r\n\r\n", line_end)
                if data[line_end + 2 : line_end + 4] == b"\r\n":
                    self.end = line_end + 4
                elif trailer_end >= 0:
                    self.end = trailer_end + 4
                else:
                    return INCOMPLETE
                return COMPLETE
            self.body += size
            if self.body > self.max_body:
                return TOO_LARGE
            chunk_end = line_end + 2 + size + 2
            if len(data) < chunk_end:
                self.body -= size  # counted again when the whole chunk is here
                return INCOMPLETE
            self.scan = chunk_end


_WOULD_BLOCK = (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError, InterruptedError)


def _waiting_for(err: Exception) -> int:
    """What the socket must become before the step can go on (TLS may need to write first)."""
    return selectors.EVENT_WRITE if isinstance(err, ssl.SSLWantWriteError) else selectors.EVENT_READ


class OneWrite:
    """A socket whose first write (gunicorn's status line and headers) waits for the next one
    (the body), so a small response leaves as one TLS record and one send, not two."""

    def __init__(self, sock) -> None:
        self._sock = sock
        self._held = b""

    def sendall(self, data) -> None:
        if self._held:
            data, self._held = self._held + bytes(data), b""
        elif bytes(data[:5]) == b"HTTP/" and len(data) < 16384:
            self._held = bytes(data)
            return
        self._sock.sendall(data)

    def flush(self) -> None:
        if self._held:
            held, self._held = self._held, b""
            self._sock.sendall(held)

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


@dataclass(slots=True)
class _Pending:
    """A connection whose request is still arriving."""

    conn: TConn
    deadline: float
    framing: RequestFraming
    handshake: bool
    data: bytearray = field(default_factory=bytearray)
    events: int = 0  # what the poller watches for it (0: not registered)
    drain: int = -1  # answered already: bytes still to read and drop before closing


class GuardWorker(ThreadWorker):
    """``gthread`` with the TLS handshake and the request read in the event loop."""

    def init_process(self) -> None:
        self.pending_requests: dict[TConn, _Pending] = {}
        self.request_timeout = float(getattr(self.app, "request_timeout", DEFAULT_REQUEST_TIMEOUT))
        self.max_body = int(getattr(self.app, "max_body_bytes", DEFAULT_MAX_BODY))
        super().init_process()

    def accept(self, listener) -> None:
        try:
            client, address = listener.accept()
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        self.nr_conns += 1
        conn = TConn(self.cfg, client, address, listener.getsockname())  # non-blocking
        if self.cfg.is_ssl:
            conn.sock = sock.ssl_wrap_socket(client, self.cfg)  # the handshake happens in _advance
        self._start(conn, handshake=self.cfg.is_ssl)

    def enqueue_req(self, conn: TConn) -> None:
        """Every request goes through the loop first: keep-alive and pipelined ones too."""
        leftover = conn.parser.unreader.take_buffered() if conn.parser is not None else b""
        self._start(conn, handshake=False, data=leftover)

    def on_client_socket_readable(self, conn: TConn, client) -> None:
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self._start(conn, handshake=False)

    def murder_pending(self) -> None:
        super().murder_pending()
        now = time.monotonic()
        for pending in [p for p in self.pending_requests.values() if p.deadline <= now]:
            if pending.data and not pending.handshake and pending.drain < 0:
                self._reject(pending, 408, "the request did not arrive in time")
            else:
                self._drop(pending)

    def handle_request(self, req, conn: TConn):
        """Answer with the status line and headers in the same TLS record as the body."""
        sock = conn.sock
        conn.sock = OneWrite(sock)
        try:
            return super().handle_request(req, conn)
        finally:
            try:
                conn.sock.flush()
            except OSError:
                pass  # the client is gone; the connection closes as gunicorn decided
            finally:
                conn.sock = sock

    # -- one request at a time, in the loop -----------------------------------------------

    def _start(self, conn: TConn, *, handshake: bool, data: bytes = b"") -> None:
        conn.sock.setblocking(False)
        pending = _Pending(
            conn,
            time.monotonic() + self.request_timeout,
            RequestFraming(self.max_body),
            handshake,
            bytearray(data),
        )
        self.pending_requests[conn] = pending
        self._advance(pending)

    def _advance(self, pending: _Pending, _fileobj=None) -> None:
        if pending.drain >= 0:
            self._drain(pending)
            return
        conn = pending.conn
        try:
            if pending.handshake:
                conn.sock.do_handshake()
                pending.handshake = False
            verdict = pending.framing.progress(pending.data) if pending.data else INCOMPLETE
            while verdict == INCOMPLETE:
                chunk = conn.sock.recv(_READ_SIZE)
                if not chunk:
                    self._drop(pending)  # the client went away
                    return
                pending.data += chunk
                verdict = pending.framing.progress(pending.data)
        except _WOULD_BLOCK as err:
            self._watch(pending, _waiting_for(err))
            return
        except ssl.SSLError as err:
            if pending.handshake:
                self.log.warning("TLS handshake with %s failed: %s", conn.client, err)
            self._drop(pending)
            return
        except OSError:
            self._drop(pending)
            return
        if verdict == COMPLETE:
            self._submit(pending)
        elif verdict == TOO_LARGE:
            self._reject(pending, 413, f"request body is larger than the {self.max_body}-byte limit")
        else:
            self._reject(pending, 400, "malformed HTTP request framing")

    def _watch(self, pending: _Pending, events: int) -> None:
        callback = partial(self._advance, pending)
        if pending.events == 0:
            self.poller.register(pending.conn.sock, events, callback)
        elif pending.events != events:
            self.poller.modify(pending.conn.sock, events, callback)
        pending.events = events

    def _forget(self, pending: _Pending) -> None:
        self.pending_requests.pop(pending.conn, None)
        if pending.events:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.poller.unregister(pending.conn.sock)
            pending.events = 0

    def _submit(self, pending: _Pending) -> None:
        """Hand the whole request, already buffered, to a pool thread."""
        self._forget(pending)
        conn = pending.conn
        if conn.parser is None:
            conn.parser = http.get_parser(self.cfg, conn.sock, conn.client)
            conn.initialized = True
        conn.parser.unreader.unread(bytes(pending.data))
        conn.data_ready = True
        super().enqueue_req(conn)

    def _reject(self, pending: _Pending, code: int, message: str) -> None:
        """Answer from the loop, then drop what the client still sends, then close."""
        body = b'{"error": "%s", "code": %d}' % (message.encode(), code)
        reason = {400: "Bad Request", 408: "Request Timeout", 413: "Content Too Large"}[code]
        head = (
            f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        try:
            pending.conn.sock.send(head.encode() + body)  # small: fits the socket buffer
        except (OSError, ssl.SSLError):
            self._drop(pending)
            return
        if code == 408:
            self._drop(pending)
            return
        pending.drain = DRAIN_LIMIT
        pending.data = bytearray()
        self._drain(pending)

    def _drain(self, pending: _Pending) -> None:
        try:
            while pending.drain > 0:
                chunk = pending.conn.sock.recv(min(_READ_SIZE, pending.drain))
                if not chunk:
                    break
                pending.drain -= len(chunk)
        except _WOULD_BLOCK as err:
            self._watch(pending, _waiting_for(err))
            return
        except (OSError, ssl.SSLError):
            pass
        self._drop(pending)

    def _drop(self, pending: _Pending) -> None:
        self._forget(pending)
        self.nr_conns -= 1
        pending.conn.close()
