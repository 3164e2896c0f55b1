"""A gthread worker whose pool threads only ever see whole requests.

gunicorn's ``gthread`` hands a new connection to a pool thread, which then does the TLS
handshake and reads the request on a blocking socket. A client that trickles one byte a second
holds that thread for as long as it likes: a dozen such connections stalled every decision of a
worker. ``GuardWorker`` keeps the handshake and the reading of the request (headers and body) in
the worker's event loop, on non-blocking sockets, under one deadline per request
(``--request-timeout``). Only a complete request reaches a thread, with its bytes already
buffered, so a thread never reads from a client. Requests over the body limit are answered 413
from the loop (chunked ones too, as soon as they pass it); requests that miss the deadline are
answered 408 and closed; framing the loop cannot trust (a chunk size that is not plain hex, a
chunk-size line or trailer section over its cap) is answered 400. Pipelined and keep-alive
requests go through the loop the same way. A thread never waits to write either: what a slow
reader does not take at once is sent from the loop (``Reply``). Flask and the app are unchanged.
"""

from __future__ import annotations

import contextlib
import errno
import re
import selectors
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

from gunicorn import http, sock
from gunicorn.workers.gthread import TConn, ThreadWorker

DEFAULT_REQUEST_TIMEOUT = 10.0
DEFAULT_MAX_BODY = 3 * 1024 * 1024
MAX_HEAD = 64 * 1024  # request line and headers; gunicorn's own limits are below this
MAX_CHUNK_LINE = 1024  # a chunk-size line with its extensions
MAX_TRAILERS = 8 * 1024  # the trailer section after the last chunk: header lines, capped like them
# A chunk size is hex digits, nothing else (no sign, prefix, underscore or space: ``int(x, 16)``
# takes all of those, and a negative size would lower the body count under the limit), at most
# 16 of them; extensions may follow after ";".
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})(?:[ \t]*;.*)?", re.DOTALL)
# After a 413 the rest of the body is read and dropped (up to this much), or the client, still
# sending, would meet a reset instead of the answer.
DRAIN_LIMIT = 16 * 1024 * 1024
# A connection the server closes lingers this long, reading and dropping what the client still
# sends, so that a reset does not cut the last reply (what gunicorn's close_graceful does).
LINGER_SECONDS, LINGER_LIMIT = 2.0, 64 * 1024
_READ_SIZE = 256 * 1024
# Reads for one connection before the loop turns to the others (it comes back: the socket is
# still readable). A read costs the same for one byte as for a full TLS record, and a client
# sending tiny records as fast as the loop reads them would otherwise never let it go.
_READS_PER_TURN = 64

INCOMPLETE, COMPLETE, TOO_LARGE, MALFORMED = "incomplete", "complete", "too large", "malformed"


@dataclass(slots=True)
class RequestFraming:
    """How far a buffered HTTP/1.1 request has arrived; resumable as more bytes come in.

    Only the framing is read (where the head ends, Content-Length or chunk sizes): gunicorn
    parses the request itself once it is whole. Each piece (the head, a chunk-size line, the
    trailer section) has a cap that holds however its bytes arrive, and the search for its end
    resumes where the last one stopped: a client that trickles bytes makes the loop look at each
    byte once, not rescan everything it has sent on every read.
    """

    max_body: int
    head_end: int = -1
    length: int | None = None  # Content-Length
    chunked: bool = False
    scan: int = 0  # where the piece being read starts
    searched: int = 0  # how far the search for that piece's end got
    body: int = 0  # chunked: bytes of body seen so far
    last_chunk: bool = False  # chunked: only the trailer section is left
    end: int = -1  # where the request ends, once known

    def progress(self, data: bytearray) -> str:
        if self.head_end < 0:
            at = self._find(data, b"\r\n\r\n")
            if self._over(data, at, MAX_HEAD):
                return MALFORMED
            if at < 0:
                return INCOMPLETE
            verdict = self._read_head(bytes(data[:at]))
            self.head_end = self.scan = self.searched = at + 4
            if verdict is not None:
                return verdict
        if self.chunked:
            return self._chunks(data)
        self.end = self.head_end + (self.length or 0)
        return COMPLETE if len(data) >= self.end else INCOMPLETE

    def _find(self, data: bytearray, terminator: bytes) -> int:
        """Where ``terminator`` first occurs from ``scan`` on, searching only bytes not searched yet."""
        at = data.find(terminator, max(self.scan, self.searched - len(terminator) + 1))
        self.searched = len(data) if at < 0 else at
        return at

    def _over(self, data: bytearray, at: int, limit: int) -> bool:
        """Whether the piece from ``scan`` to ``at`` (or to what has arrived so far) exceeds ``limit``."""
        return (at if at >= 0 else len(data)) - self.scan > limit

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
        while not self.last_chunk:
            line_end = self._find(data, b"\r\n")
            if self._over(data, line_end, MAX_CHUNK_LINE):
                return MALFORMED
            if line_end < 0:
                return INCOMPLETE
            size = _CHUNK_SIZE.fullmatch(data, self.scan, line_end)
            if size is None:
                return MALFORMED
            size = int(size[1], 16)
            if size == 0:
                self.last_chunk = True
                self.scan = self.searched = line_end  # the trailers end at the first CRLFCRLF from here
                break
            if self.body + size > self.max_body:
                return TOO_LARGE
            chunk_end = line_end + 2 + size + 2
            # Extensions are not body, but the loop buffers them: 1-byte chunks with 1 KiB of
            # extensions each would make it hold a thousand times the limit.
            if chunk_end - self.head_end > 2 * self.max_body:
                return TOO_LARGE
            if len(data) < chunk_end:
                return INCOMPLETE
            self.body += size
            self.scan = self.searched = chunk_end
        at = self._find(data, b"\r\n\r\n")
        if self._over(data, at, MAX_TRAILERS):
            return MALFORMED
        if at < 0:
            return INCOMPLETE
        self.end = at + 4
        return COMPLETE


_WOULD_BLOCK = (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError, InterruptedError)


def _waiting_for(err: Exception, otherwise: int = selectors.EVENT_READ) -> int:
    """What the socket must become before the step can go on (TLS may read while writing, or write
    while reading)."""
    if isinstance(err, ssl.SSLWantWriteError):
        return selectors.EVENT_WRITE
    if isinstance(err, ssl.SSLWantReadError):
        return selectors.EVENT_READ
    return otherwise


class Reply:
    """The socket a pool thread answers through: the response is collected and sent in one go.

    One send makes a small response one TLS record. ``send_now`` does not wait: what a slow
    reader leaves in ``rest`` is sent by the event loop (``GuardWorker.finish_request``) under
    the request deadline, the way requests are read. A blocking send with a timeout would still
    hold a thread for the whole timeout per slow reader, and as many clients as there are
    threads, pipelining requests and never reading, would stop every decision for that long;
    in the loop such a client holds a registered socket, not a thread. The responses are small
    JSON documents and metrics, so holding one whole costs little.
    """

    def __init__(self, sock) -> None:
        self._sock = sock
        self._out = bytearray()
        self.rest = memoryview(b"")

    def sendall(self, data) -> None:
        self._out += data

    def send_now(self) -> None:
        timeout = self._sock.gettimeout()
        self._sock.setblocking(False)
        self.rest = memoryview(self._out)
        try:
            while self.rest:
                # TLS: after a would-block the same bytes are offered again, as OpenSSL requires.
                self.rest = self.rest[self._sock.send(self.rest) :]
        except _WOULD_BLOCK:
            pass
        finally:
            self._sock.settimeout(timeout)

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


@dataclass(slots=True)
class _Pending:
    """A connection the loop works on: its request is still arriving, or its reply leaving."""

    conn: TConn
    deadline: float
    framing: RequestFraming
    handshake: bool
    data: bytearray = field(default_factory=bytearray)
    events: int = 0  # what the poller watches for it (0: not registered)
    drain: int = -1  # answered already: bytes still to read and drop before closing
    unsent: memoryview | None = None  # the rest of a reply the client is slow to take
    then: Callable[[], None] | None = None  # what gunicorn does once the reply is out


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
        """A request that missed its deadline is answered 408; a handshake, a drain or a reply
        that missed it is closed."""
        super().murder_pending()
        now = time.monotonic()
        for pending in [p for p in self.pending_requests.values() if p.deadline <= now]:
            if pending.data and not pending.handshake and pending.drain < 0 and pending.then is None:
                self._reject(pending, 408, "the request did not arrive in time")
            else:
                self._drop(pending)

    def handle_request(self, req, conn: TConn):
        """Answer into a ``Reply``; what the client does not take at once is left to the loop."""
        sock = conn.sock
        sock.settimeout(self.request_timeout)  # bounds what else a thread sends (an error page)
        conn.sock = reply = Reply(sock)
        try:
            keepalive = super().handle_request(req, conn)
        finally:
            conn.sock = sock
        reply.send_now()
        conn.unsent = reply.rest
        return keepalive

    def finish_request(self, conn: TConn, fs) -> None:
        """Send the rest of a reply from the loop, then carry on as gunicorn would have."""
        unsent, conn.unsent = getattr(conn, "unsent", None), None
        if not unsent:
            self._after_reply(conn, fs)
            return
        conn.sock.setblocking(False)
        pending = _Pending(
            conn,
            time.monotonic() + self.request_timeout,
            RequestFraming(self.max_body),
            handshake=False,
            unsent=unsent,
            then=partial(self._after_reply, conn, fs),
        )
        self.pending_requests[conn] = pending
        self._send(pending)

    def _after_reply(self, conn: TConn, fs) -> None:
        """What gunicorn does once a reply is out, except that closing lingers in the loop.

        gunicorn half-closes and then reads what the client still sends for up to 2 s on a
        blocking socket, in the loop's thread: a client that took a ``Connection: close`` reply
        and kept the connection open stalled every other connection of the worker for 2 s.
        """
        if fs.cancelled() or fs.exception() is not None or fs.result() is not False:
            super().finish_request(conn, fs)
            return
        try:
            conn.sock.shutdown(socket.SHUT_WR)  # a TLS socket drops its TLS state: raw reads follow
            conn.sock.setblocking(False)
        except OSError:  # closed already
            self.nr_conns -= 1
            conn.close()
            return
        pending = _Pending(
            conn,
            time.monotonic() + LINGER_SECONDS,
            RequestFraming(self.max_body),
            handshake=False,
            drain=LINGER_LIMIT,
        )
        self.pending_requests[conn] = pending
        self._drain(pending)

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
        if pending.then is not None:
            self._send(pending)
            return
        if pending.drain >= 0:
            self._drain(pending)
            return
        conn = pending.conn
        try:
            if pending.handshake:
                conn.sock.do_handshake()
                pending.handshake = False
            verdict = pending.framing.progress(pending.data) if pending.data else INCOMPLETE
            reads = 0
            while verdict == INCOMPLETE:
                if reads == _READS_PER_TURN:
                    self._watch(pending, selectors.EVENT_READ)
                    return
                reads += 1
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

    def _send(self, pending: _Pending) -> None:
        try:
            while pending.unsent:
                pending.unsent = pending.unsent[pending.conn.sock.send(pending.unsent) :]
        except _WOULD_BLOCK as err:
            self._watch(pending, _waiting_for(err, selectors.EVENT_WRITE))
            return
        except OSError:  # ssl.SSLError too
            self._drop(pending)
            return
        self._forget(pending)
        pending.then()

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
            for _ in range(_READS_PER_TURN):
                chunk = pending.conn.sock.recv(min(_READ_SIZE, pending.drain))
                pending.drain -= len(chunk)
                if not chunk or pending.drain <= 0:
                    break
            else:
                self._watch(pending, selectors.EVENT_READ)
                return
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
