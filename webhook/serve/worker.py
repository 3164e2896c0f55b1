"""A gthread worker whose pool threads only ever see whole requests.

gunicorn's ``gthread`` hands a new connection to a pool thread, which then does the TLS
handshake and reads the request on a blocking socket. A client that trickles one byte a second
holds that thread for as long as it likes: a dozen such connections stalled every decision of a
worker. ``GuardWorker`` keeps the handshake and the reading of the request (headers and body) in
the worker's event loop, on non-blocking sockets, under one deadline per request
(``--request-timeout``). Only a complete request reaches a thread, with its bytes already
buffered, so a thread never reads from a client. Requests over the body limit are answered 413
from the loop (chunked ones too, as soon as they pass it); requests that miss the deadline are
answered 408 and closed; framing the loop cannot trust (``framing.py``: a chunk size that is
not plain hex, chunk data not ended by CRLF, a chunk-size line or trailer section over its cap)
is answered 400. Pipelined and keep-alive
requests go through the loop the same way. A thread never waits to write either: what a slow
reader does not take at once is sent from the loop (``Reply``). Flask and the app are unchanged.

While the loop has nothing else to do, an admission review (the paths the app names in
``ANSWERS_WITHOUT_WAITING``) is decided in the loop itself, without waking a thread and handing
the reply back (``_loop_is_free``), unless its decision would wait: it then raises ``WouldWait``
before it changed anything (``state/waiting.py``), and goes to a thread like any other request.

What the loop holds is bounded per worker. A new connection is not even wrapped in TLS until
its first byte arrives, and one that sends nothing for ``--first-byte-timeout`` is closed; at
``--worker-connections`` the oldest connection that sent nothing (else one stalled past the
first-byte timeout, else the oldest idle keep-alive one) is closed to let a new client in, so
idle sockets cannot lock anyone out. Requests count against ``--max-buffered-bytes`` from their
first byte until their answer is out: once per byte while they arrive, and at what they cost
parsed (``limits.PARSED_COST`` times their size) from their hand-over to a thread. A request that
does not fit, by its declared size, its next read or once whole, is answered 503 with
``Retry-After``. No error of one connection (a reset before TLS, a failed handshake, an
``accept`` out of descriptors) ends the worker.

Each worker accepts from a listening socket of its own (``SO_REUSEPORT``: ``gunicorn.py``), so
the kernel, not a race between the workers' loops, decides where a new connection goes. It
listens only once its cluster state is ready, or when no sibling listens (``listening.py``,
``_join_when_ready``), so a restarted worker takes no review it cannot judge while a sibling
can. A stopping worker closes its listener at once (``_stop_listening``), so that new
connections go to its siblings while it finishes its own.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import heapq
import itertools
import resource
import selectors
import socket
import ssl
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from functools import partial

from gunicorn import http, sock, util
from gunicorn.workers.gthread import TConn, ThreadWorker

from ..state.waiting import WouldWait, without_waiting
from .app import ANSWERS_WITHOUT_WAITING, SOURCE_EXTENSION
from .direct import Exchange
from .framing import COMPLETE, INCOMPLETE, TOO_LARGE, Head, RequestFraming
from .limits import (
    DEFAULT_BUFFERED_BYTES,
    DRAIN_LIMIT,
    FIRST_BYTE_TIMEOUT,
    LINGER_LIMIT,
    LINGER_SECONDS,
    MAX_BODY_BYTES,
    MAX_BODY_ON_LOOP,
    MAX_HEAD,
    PARSED_COST,
    REQUEST_TIMEOUT,
    parsed_cost,
)
from .listening import Membership
from .metrics import BUFFER_BUDGET, count_refused
from .reply import WOULD_BLOCK, Reply, send_without_waiting, with_client_identity
from .wsgi import CLIENT_VERIFIED, error_body

_READ_SIZE = 256 * 1024
# Reads for one connection before the loop turns to the others (it comes back: the socket is
# still readable). A read costs the same for one byte as for a full TLS record, and a client
# sending tiny records as fast as the loop reads them would otherwise never let it go.
_READS_PER_TURN = 64

# Descriptors a worker needs besides its connections: listeners, poller, pipes, log, metric
# and reservation table files, the informer's connections.
_SPARE_DESCRIPTORS = 256
# accept() errors that mean "no room for another descriptor or socket buffer right now".
_OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_ACCEPT_PAUSE = 0.1  # seconds accepting stops after one of them
_ACCEPTS_PER_TURN = 16
# Connections closed at their deadline per turn of the loop: thousands of silent connections
# opened together expire together, and closing them all at once stalled every other client.
_EXPIRIES_PER_TURN = 128
_REFUSAL_LOG_SECONDS = 10.0
# How often a worker not yet listening asks whether it may (its state ready, or no sibling
# listening): the longest a ready worker stays out of the port.
_JOIN_POLL_SECONDS = 0.05

_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_REASONS = {
    400: "Bad Request",
    408: "Request Timeout",
    413: "Content Too Large",
    503: "Service Unavailable",
}


def _waiting_for(err: Exception, otherwise: int = selectors.EVENT_READ) -> int:
    """What the socket must become before the step can go on (TLS may read while writing, or write
    while reading)."""
    if isinstance(err, ssl.SSLWantWriteError):
        return selectors.EVENT_WRITE
    if isinstance(err, ssl.SSLWantReadError):
        return selectors.EVENT_READ
    return otherwise


@dataclass(slots=True)
class _Pending:
    """A connection the loop works on: its request is still arriving, or its reply leaving."""

    conn: TConn
    deadline: float
    framing: RequestFraming
    handshake: bool
    started: float = 0.0  # monotonic: when this step (first byte, request, reply) began
    silent: bool = False  # accepted, and not a byte received yet: not wrapped in TLS either
    data: bytearray = field(default_factory=bytearray)
    held: int = 0  # what ``data`` counts against the worker's buffer budget
    sized: bool = False  # the size its head declares was checked against the budget
    continued: bool = False  # ``100 Continue`` sent
    events: int = 0  # what the poller watches for it (0: not registered)
    drain: int = -1  # answered already: bytes still to read and drop before closing
    unsent: memoryview | None = None  # the rest of a reply the client is slow to take
    then: Callable[[], None] | None = None  # what gunicorn does once the reply is out


class GuardWorker(ThreadWorker):
    """``gthread`` with the TLS handshake and the request read in the event loop."""

    def init_process(self) -> None:
        self._init_loop()
        port = getattr(self.app, "port", None)
        self.membership = Membership(port.lock) if port is not None else None
        self._warn_of_a_small_budget()
        self._fit_descriptor_limit()
        super().init_process()

    def _init_loop(self) -> None:
        """The loop's own state, and its settings from the application (``GuardServer``)."""
        self.pending_requests: OrderedDict[TConn, _Pending] = OrderedDict()  # oldest first
        self.silent: OrderedDict[TConn, _Pending] = OrderedDict()  # no byte yet; oldest first
        self.deadlines: list[tuple[float, int, _Pending]] = []  # a heap; stale entries skipped
        self._sequence = itertools.count()
        self.buffered = 0  # what requests in the loop, or handed to a thread, count (``_submit``)
        self.events_this_turn = 0  # what the loop's last wait returned (``_loop_is_free``)
        self.in_threads = 0  # requests handed to a thread and not finished yet
        self._accept_paused_until = 0.0
        self._refused, self._refusal_logged = 0, float("-inf")
        app = self.app
        self.request_timeout = float(getattr(app, "request_timeout", REQUEST_TIMEOUT))
        self.first_byte_timeout = min(
            float(getattr(app, "first_byte_timeout", FIRST_BYTE_TIMEOUT)), self.request_timeout
        )
        self.max_body = int(getattr(app, "max_body_bytes", MAX_BODY_BYTES))
        self.max_buffered = int(getattr(app, "max_buffered_bytes", DEFAULT_BUFFERED_BYTES))
        self.client_auth = getattr(app, "client_auth", None)
        self.membership: Membership | None = None  # None: gunicorn's listeners, from the fork
        self.readiness: Callable[[], bool] = lambda: True

    def _warn_of_a_small_budget(self) -> None:
        """A budget below one largest request once parsed refuses every such request: say so."""
        largest = parsed_cost(self.max_body + MAX_HEAD)
        if self.max_buffered < largest:
            self.log.warning(
                "--max-buffered-bytes %d is less than one %d-byte request once parsed (%d): "
                "requests that large will always get 503",
                self.max_buffered,
                self.max_body,
                largest,
            )

    def load_wsgi(self) -> None:
        super().load_wsgi()
        source = getattr(self.wsgi, "extensions", {}).get(SOURCE_EXTENSION)
        if source is not None:
            self.readiness = lambda: source.readiness().ready
        self.exchange = Exchange(self.wsgi, secure=self.cfg.is_ssl, multiprocess=self.cfg.workers > 1)
        self.on_loop = frozenset(getattr(self.wsgi, ANSWERS_WITHOUT_WAITING, ()))
        self.wsgi = with_client_identity(self.wsgi)  # for the requests gunicorn parses
        gc.freeze()  # the app, once built, is never garbage: full collections need not scan it

    def _fit_descriptor_limit(self) -> None:
        """Raise the soft descriptor limit to what ``worker_connections`` needs (up to the hard
        limit), or lower the connection limit to what the descriptors allow: ``accept`` failing
        with EMFILE under load is worse than a limit known in advance."""
        needed = self.worker_connections + _SPARE_DESCRIPTORS
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < needed:
            raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
            with contextlib.suppress(ValueError, OSError):
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
        if soft != resource.RLIM_INFINITY and soft < needed:
            self.worker_connections = max(16, soft - _SPARE_DESCRIPTORS)
            self.max_keepalived = self.worker_connections - self.cfg.threads
            self.log.warning(
                "open files limited to %d: at most %d connections per worker", soft, self.worker_connections
            )

    # -- the event loop: no connection's error may end it ------------------------------------

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        """gunicorn's, except that an error in one connection's callback closes that connection
        and the loop goes on: an exception escaping here ends the worker and every connection
        it holds. The wait ends at the nearest deadline (zero when one passed already): gunicorn
        waits a whole second, so a 0.5 s first-byte timeout closed connections after 1.0 s."""
        if self.membership is not None and not self.membership.joined and self.alive:
            self._join_when_ready()
            timeout = min(timeout, _JOIN_POLL_SECONDS)
        if self.deadlines:
            timeout = min(timeout, max(0.0, self.deadlines[0][0] - time.monotonic()))
        try:
            events = self.poller.select(timeout)
        except OSError as err:
            if err.errno != errno.EINTR:
                raise
            return
        self.events_this_turn = len(events)
        for key, _ in events:
            try:
                key.data(key.fileobj)
            except Exception:
                self.log.exception("closing a connection after an error in the event loop")
                self._abandon(key)

    def _abandon(self, key: selectors.SelectorKey) -> None:
        """Close the connection behind a poller callback that failed (never a listener)."""
        callback = key.data
        target = callback.args[0] if isinstance(callback, partial) and callback.args else None
        if isinstance(target, _Pending):
            self._drop(target)
        elif isinstance(target, TConn):
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.poller.unregister(key.fileobj)
            if target in self.keepalived_conns:
                self.keepalived_conns.remove(target)
            self.nr_conns -= 1
            target.close()

    def _join_when_ready(self) -> None:
        """Listen on the port once the state is ready, or no sibling listens (``listening.py``):
        a worker gunicorn restarts takes no connection before it can judge a pinned pod."""
        if not self.membership.may_join(self._ready):
            return
        listeners = [sock.TCPSocket(address, self.cfg, self.log) for address in self.app.port.addresses]
        for listener in listeners:
            util.close_on_exec(listener)
        accepting = self._accepting
        super().set_accept_enabled(False)
        self.sockets = listeners
        self.set_accept_enabled(accepting)

    def _ready(self) -> bool:
        try:
            return self.readiness()
        except Exception:  # a source that cannot say is not ready
            self.log.exception("reading the state's readiness failed")
            return False

    def set_accept_enabled(self, enabled: bool) -> None:
        """Accepting stays off for a moment after the process ran out of descriptors; once the
        worker is stopping, its listeners close (``_stop_listening``)."""
        if not self.alive:
            super().set_accept_enabled(False)
            self._stop_listening()
            return
        if enabled and time.monotonic() < self._accept_paused_until:
            enabled = False
        super().set_accept_enabled(enabled)

    def _stop_listening(self) -> None:
        """Close this worker's own listeners (``SO_REUSEPORT``, see the module doc) as soon as
        it stops: the kernel then sends new connections to its siblings, where a listener left
        open but no longer accepted from would collect them until the worker exits, and reset
        them. What already waits in its queue is accepted first, and answered within the
        graceful timeout."""
        listeners, self.sockets = self.sockets, []  # once: accepting may come back here (EMFILE)
        for listener in listeners:
            if listener.sock is None:
                continue
            with contextlib.suppress(OSError):
                while self.accept(listener) == _ACCEPTS_PER_TURN:
                    pass
            listener.close()
        if self.membership is not None:
            self.membership.leave()

    def accept(self, listener) -> int:
        """Take new connections (a few per turn: under a flood of them, one per turn of the loop
        made the loop's own work the cost), but neither wrap them in TLS nor count on them
        before their first byte. Returns how many it took."""
        taken = 0
        for _ in range(_ACCEPTS_PER_TURN):
            if self.nr_conns >= self.worker_connections:
                break  # nothing left to close for room: the loop stops accepting
            try:
                client, address = listener.accept()
            except OSError as err:
                if err.errno in _OUT_OF_RESOURCES:
                    self._out_of_descriptors(err)
                    break
                if isinstance(err, BlockingIOError | InterruptedError):
                    break
                continue  # ECONNABORTED and the like: that client is gone; the worker is not
            self._take(client, address, listener)
            taken += 1
        return taken

    def _take(self, client: socket.socket, address, listener) -> None:
        """A new connection, parked in the poller until its first byte. ``TCP_NODELAY``, set
        here rather than trusted to be inherited from the listener: a reply is one send, and
        Nagle's algorithm holds a small one back behind the client's delayed ACK (issue 31's
        prototype: a p99.9 of 41-49 ms at 500 req/s without it)."""
        self.nr_conns += 1
        if client.family != socket.AF_UNIX:
            with contextlib.suppress(OSError):
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            conn = TConn(self.cfg, client, address, listener.getsockname())  # non-blocking
        except OSError:
            self.nr_conns -= 1
            client.close()
            return
        conn.client_verified = False
        self._make_room()
        now = time.monotonic()
        pending = _Pending(
            conn, now + self.first_byte_timeout, RequestFraming(self.max_body), False, now, silent=True
        )
        self.pending_requests[conn] = pending
        self.silent[conn] = pending
        self._arm(pending)
        self._watch(pending, selectors.EVENT_READ)

    def _out_of_descriptors(self, err: OSError) -> None:
        """Make room by closing an idle connection; with none to close, stop accepting briefly
        (the listener stays readable, and retrying at once would spin)."""
        if self._evict_one():
            return
        self.log.warning("cannot accept a connection (%s): pausing accept for %.1f s", err, _ACCEPT_PAUSE)
        self._accept_paused_until = time.monotonic() + _ACCEPT_PAUSE
        self.set_accept_enabled(False)

    def _make_room(self) -> None:
        """At the connection limit, close an idle connection so the new one is served."""
        while self.nr_conns >= self.worker_connections and self._evict_one():
            pass

    def _evict_one(self) -> bool:
        """Close the oldest connection that sent nothing; else the oldest one stalled past the
        first-byte timeout; else the oldest idle keep-alive one. False when there is none."""
        if self.silent:
            self._drop(next(iter(self.silent.values())))
            return True
        if self.pending_requests:
            oldest = next(iter(self.pending_requests.values()))
            if oldest.started <= time.monotonic() - self.first_byte_timeout:
                self._drop(oldest)
                return True
        if self.keepalived_conns:
            conn = self.keepalived_conns.popleft()
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.poller.unregister(conn.sock)
            self.nr_conns -= 1
            conn.close()
            return True
        return False

    def enqueue_req(self, conn: TConn) -> None:
        """Every request goes through the loop first: keep-alive and pipelined ones too."""
        leftover = conn.parser.unreader.take_buffered() if conn.parser is not None else b""
        self._start(conn, handshake=False, data=leftover)

    def on_client_socket_readable(self, conn: TConn, client) -> None:
        self.poller.unregister(client)
        self.keepalived_conns.remove(conn)
        self._start(conn, handshake=False)

    def murder_pending(self) -> None:
        """A connection that sent nothing by the first-byte timeout is closed; a request that
        missed its deadline is answered 408; a handshake, a drain or a reply that missed it is
        closed."""
        super().murder_pending()
        now = time.monotonic()
        for _ in range(_EXPIRIES_PER_TURN):
            if not self.deadlines or self.deadlines[0][0] > now:
                return
            deadline, _, pending = heapq.heappop(self.deadlines)
            if self.pending_requests.get(pending.conn) is not pending or pending.deadline != deadline:
                continue  # done with, or given a new deadline since
            try:
                if pending.data and not pending.handshake and pending.drain < 0 and pending.then is None:
                    self._reject(pending, 408, "the request did not arrive in time")
                else:
                    self._drop(pending)
            except Exception:  # called from gunicorn's loop itself: nothing else would catch it
                self.log.exception("closing a connection after an error at its deadline")
                if self.pending_requests.get(pending.conn) is pending:
                    self._drop(pending)

    def handle(self, conn: TConn):
        """In a pool thread: a request whose head the loop parsed is answered from it
        (``direct.py``); any other goes through gunicorn's parser."""
        request = getattr(conn, "request", None)
        if request is None:
            return super().handle(conn)
        conn.request = None
        try:
            return self._answer_directly(conn, *request)
        except OSError:  # the client went away
            return False

    def _answer_on_loop(self, conn: TConn) -> bool:
        """In the loop: answer a request the app decides without waiting (``state/waiting.py``),
        as ``handle`` would in a thread; False when it would wait, and so goes to a thread."""
        head, body, may_keep_alive = conn.request
        fs: Future = Future()
        try:
            with without_waiting():
                fs.set_result(self._answer_directly(conn, head, body, may_keep_alive))
        except WouldWait:
            return False
        except OSError:  # the client went away
            fs.set_result(False)
        except Exception as err:  # as a thread's error would reach ``finish_request``
            fs.set_exception(err)
        conn.request = None
        self.finish_request(conn, fs)
        return True

    def _answer_directly(
        self, conn: TConn, head: Head, body: bytes, may_keep_alive: bool | None = None
    ) -> bool:
        """The reply in one send, what the client does not take left to the loop (as ``Reply``
        does for gunicorn's); whether the connection stays open. ``may_keep_alive``: counted
        already (``_may_keep_alive``), by an answer the loop gave up for a thread."""
        environ = self.exchange.environ(head, body, conn.client, conn.server)
        environ[CLIENT_VERIFIED] = getattr(conn, "client_verified", False)
        if may_keep_alive is None:
            may_keep_alive = self._may_keep_alive()
        try:
            reply, keep_alive = self.exchange.answer(environ, head, may_keep_alive)
        except WouldWait:
            raise
        except Exception:  # the app's bug: still an answer, and the connection closes
            self.log.exception("Error handling request %s", head.target)
            body = error_body(500, "internal error")
            reply = (
                b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
            )
            keep_alive = False
        conn.unsent = send_without_waiting(conn.sock, reply)
        return keep_alive

    def _may_keep_alive(self) -> bool:
        """gunicorn's rule (``ThreadWorker.handle_request``), counting the request toward
        ``max_requests``: not while stopping, nor past the keep-alive connection limit."""
        self.nr += 1
        if self.nr >= self.max_requests and self.alive:
            self.log.info("Autorestarting worker after current request.")
            self.alive = False
        return self.alive and bool(self.cfg.keepalive) and len(self.keepalived_conns) < self.max_keepalived

    def handle_request(self, req, conn: TConn):
        """Answer into a ``Reply``; what the client does not take at once is left to the loop."""
        sock = conn.sock
        sock.settimeout(self.request_timeout)  # bounds what else a thread sends (an error page)
        conn.sock = reply = Reply(sock, getattr(conn, "client_verified", False))
        # The loop answered ``Expect: 100-continue`` before reading the body (or had the body
        # already): a second interim response from gunicorn, now, would come after the body.
        req._expected_100_continue = False
        try:
            keepalive = super().handle_request(req, conn)
        finally:
            conn.sock = sock
        reply.send_now()
        conn.unsent = reply.rest
        return keepalive

    def finish_request(self, conn: TConn, fs) -> None:
        """Send the rest of a reply from the loop, then carry on as gunicorn would have. Called
        from the loop's queue of callbacks, outside the guard of ``wait_for_and_dispatch_events``
        for the connection: an error closes the connection here."""
        self._release_request(conn)
        if getattr(conn, "in_thread", False):
            conn.in_thread = False
            self.in_threads -= 1
        try:
            unsent, conn.unsent = getattr(conn, "unsent", None), None
            if not unsent:
                self._after_reply(conn, fs)
                return
            conn.sock.setblocking(False)
            pending = self._track(conn, self.request_timeout, handshake=False)
            pending.unsent = unsent
            pending.then = partial(self._after_reply, conn, fs)
            self._send(pending)
        except Exception:
            self.log.exception("closing a connection after an error finishing its request")
            pending = self.pending_requests.get(conn)
            if pending is not None:
                self._drop(pending)
            else:
                self.nr_conns -= 1
                conn.close()

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
        pending = self._track(conn, LINGER_SECONDS, handshake=False)
        pending.drain = LINGER_LIMIT
        self._drain(pending)

    # -- one request at a time, in the loop -----------------------------------------------

    def _track(self, conn: TConn, timeout: float, *, handshake: bool, data: bytes = b"") -> _Pending:
        """A new step for ``conn`` in the loop, due in ``timeout`` seconds."""
        now = time.monotonic()
        pending = _Pending(
            conn, now + timeout, RequestFraming(self.max_body), handshake, now, data=bytearray(data)
        )
        self._hold(pending, len(data))
        self.pending_requests[conn] = pending
        self._arm(pending)
        return pending

    def _arm(self, pending: _Pending) -> None:
        heapq.heappush(self.deadlines, (pending.deadline, next(self._sequence), pending))

    def _start(self, conn: TConn, *, handshake: bool, data: bytes = b"") -> None:
        conn.sock.setblocking(False)
        self._advance(self._track(conn, self.request_timeout, handshake=handshake, data=data))

    def _wake(self, pending: _Pending) -> bool:
        """The first byte of a new connection arrived: wrap it in TLS, under the request deadline
        (counted from the accept). False when the connection is gone."""
        conn = pending.conn
        pending.silent = False
        self.silent.pop(conn, None)
        pending.deadline = pending.started + self.request_timeout
        self._arm(pending)
        if not self.cfg.is_ssl:
            return True
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.poller.unregister(conn.sock)  # the TLS socket replaces it (same descriptor)
        pending.events = 0
        try:
            # Wrapping reads from the socket when it is not connected: a reset surfaces here.
            conn.sock = sock.ssl_wrap_socket(conn.sock, self.cfg)
        except (OSError, ValueError) as err:
            self.log.debug("connection from %s lost before TLS: %s", conn.client, err)
            self._drop(pending)
            return False
        pending.handshake = True
        return True

    def _advance(self, pending: _Pending, _fileobj=None) -> None:
        if pending.then is not None:
            self._send(pending)
            return
        if pending.drain >= 0:
            self._drain(pending)
            return
        if pending.silent and not self._wake(pending):
            return
        conn = pending.conn
        try:
            if pending.handshake:
                conn.sock.do_handshake()
                pending.handshake = False
                conn.client_verified = self._client_verified(conn.sock)
            verdict = pending.framing.progress(pending.data) if pending.data else INCOMPLETE
            reads = 0
            while verdict == INCOMPLETE:
                if not self._declared_fits(pending):
                    self._over_budget(pending)
                    return
                wants_continue = pending.framing.expects_continue and not pending.continued
                if wants_continue and not self._continue(pending):
                    return
                if reads == _READS_PER_TURN:
                    self._watch(pending, selectors.EVENT_READ)
                    return
                room = self.max_buffered - self.buffered
                if room <= 0 and pending.data:
                    self._over_budget(pending)
                    return
                reads += 1
                # With the budget spent, one byte tells a request (refused next turn of this
                # loop) from a keep-alive client closing (no request: neither answered nor counted).
                chunk = conn.sock.recv(min(_READ_SIZE, max(room, 1)))
                if not chunk:
                    self._drop(pending)  # the client went away
                    return
                pending.data += chunk
                self._hold(pending, len(chunk))
                verdict = pending.framing.progress(pending.data)
        except WOULD_BLOCK as err:
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

    def _client_verified(self, tls) -> bool:
        """Whether the peer's certificate was verified against the client CA and its name is
        allowed. With no client CA configured, nothing is verified."""
        if self.client_auth is None:
            return False
        try:
            certificate = tls.getpeercert()
        except (OSError, ValueError):
            return False
        return bool(certificate) and self.client_auth.allows(certificate_name(certificate))

    def _largest_fitting(self, pending: _Pending) -> int:
        """The largest request ``pending`` could be and still fit the budget once parsed, beside
        what the worker holds besides it."""
        return (self.max_buffered - (self.buffered - pending.held)) // PARSED_COST

    def _declared_fits(self, pending: _Pending) -> bool:
        """Whether the request, at the size its head declares, could be parsed within the budget
        beside what the worker holds now: else 503 before its body is sent (and before ``100
        Continue``). Checked once, and nothing is reserved: a client that declares a large body
        and sends nothing holds only its head. While the body arrives, requests finishing make
        room: the check that holds is the one when it is whole (``_submit``)."""
        if pending.sized or pending.framing.end < 0:
            return True
        pending.sized = True
        return pending.framing.end <= self._largest_fitting(pending)

    def _continue(self, pending: _Pending) -> bool:
        """``Expect: 100-continue``: the interim answer (the declared size was checked already)."""
        pending.continued = True
        # Sent only while the request is incomplete: the first write on the connection, so the
        # socket buffer is empty and takes it; a would-block leaves the client to its own timer.
        with contextlib.suppress(*WOULD_BLOCK):
            pending.conn.sock.send(_CONTINUE)
        return True

    def _over_budget(self, pending: _Pending) -> None:
        """503: the worker holds ``max_buffered`` bytes' worth of requests. Counted in
        ``admit_guard_requests_refused_total``; logged at most every ``_REFUSAL_LOG_SECONDS``, with
        the count: a flood must not become a flood of log lines."""
        count_refused(BUFFER_BUDGET)
        self._refused += 1
        now = time.monotonic()
        if now >= self._refusal_logged + _REFUSAL_LOG_SECONDS:
            self.log.warning(
                "%d request(s) answered 503: %d bytes of requests buffered (--max-buffered-bytes %d)",
                self._refused,
                self.buffered,
                self.max_buffered,
            )
            self._refused, self._refusal_logged = 0, now
        self._reject(pending, 503, "the server is buffering too many requests; retry shortly")

    def _hold(self, pending: _Pending, size: int) -> None:
        pending.held += size
        self.buffered += size

    def _release(self, pending: _Pending) -> None:
        self.buffered -= pending.held
        pending.held = 0

    def _release_request(self, conn: TConn) -> None:
        """A thread is done with the request handed to it: its bytes no longer count."""
        self.buffered -= getattr(conn, "held", 0)
        conn.held = 0

    def _send(self, pending: _Pending) -> None:
        try:
            while pending.unsent:
                pending.unsent = pending.unsent[pending.conn.sock.send(pending.unsent) :]
        except WOULD_BLOCK as err:
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
        """The loop is done with this step. Its buffer goes now: the deadline heap still holds
        the step until its deadline, and with it a whole body nobody counts any more."""
        pending.data = bytearray()
        if self.pending_requests.get(pending.conn) is pending:
            del self.pending_requests[pending.conn]
        if self.silent.get(pending.conn) is pending:
            del self.silent[pending.conn]
        if pending.events:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self.poller.unregister(pending.conn.sock)
            pending.events = 0

    def _submit(self, pending: _Pending) -> None:
        """Hand the whole request, already buffered, to a pool thread, counted at what it costs
        parsed (``parsed_cost``) until the thread is done with it (``finish_request``): the copies
        a thread makes are where a worker's memory grew. 503 when that does not fit the budget."""
        size = len(pending.data)
        if size > self._largest_fitting(pending):
            self._over_budget(pending)
            return
        self._hold(pending, parsed_cost(size) - pending.held)
        data = pending.data
        self._forget(pending)
        conn = pending.conn
        if conn.parser is None:
            conn.parser = http.get_parser(self.cfg, conn.sock, conn.client)
            conn.initialized = True
        framing = pending.framing
        head = framing.head
        if head is not None:  # answered from the loop's parse (``handle``)
            conn.request = (head, bytes(data[framing.head_end : framing.end]))
            data = data[framing.end :]  # pipelined: the next request's first bytes
        if data:
            conn.parser.unreader.unread(data)  # copied into the unreader's buffer; ``data`` goes
        conn.held, pending.held = pending.held, 0
        conn.data_ready = True
        if self._loop_is_free() and on_loop(head, framing.end - framing.head_end, bool(data), self.on_loop):
            conn.request = (*conn.request, self._may_keep_alive())
            if self._answer_on_loop(conn):
                return
        super().enqueue_req(conn)
        self.in_threads += 1
        conn.in_thread = True

    def _loop_is_free(self) -> bool:
        """Whether the loop has nothing else to do: this request was all its last wait returned,
        and no thread is deciding one. Then deciding here saves waking a thread and the hand-back
        (at 500 req/s, 86-266 µs of CPU a review). Under load a thread decides while the loop
        reads and handshakes for the others: always deciding here, 2 workers under ``wrk`` gave
        4,130-4,293 req/s against 4,876-5,581 with threads, and 4,748-5,330 deciding here
        only when free."""
        return self.events_this_turn <= 1 and not self.in_threads

    def _reject(self, pending: _Pending, code: int, message: str) -> None:
        """Answer from the loop, then drop what the client still sends, then close."""
        self._release(pending)
        pending.data = bytearray()
        body = b'{"error": "%s", "code": %d}' % (message.encode(), code)
        retry = "Retry-After: 1\r\n" if code == 503 else ""
        head = (
            f"HTTP/1.1 {code} {_REASONS[code]}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n{retry}Connection: close\r\n\r\n"
        )
        try:
            pending.conn.sock.send(head.encode() + body)  # small: fits the socket buffer
        except OSError:  # ssl.SSLError too
            self._drop(pending)
            return
        if code == 408:
            self._drop(pending)
            return
        pending.drain = DRAIN_LIMIT
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
        except WOULD_BLOCK as err:
            self._watch(pending, _waiting_for(err))
            return
        except OSError:  # ssl.SSLError too
            pass
        self._drop(pending)

    def _drop(self, pending: _Pending) -> None:
        self._forget(pending)
        self._release(pending)
        self.nr_conns -= 1
        pending.conn.close()


def on_loop(head: Head | None, body_length: int, pipelined: bool, paths: frozenset[str]) -> bool:
    """Whether the loop answers a whole request itself: one on ``paths`` (the app's, which
    never wait there: ``state/waiting.py``), with a plain head, a body that is not large
    (``MAX_BODY_ON_LOOP``), and nothing pipelined after it, which would be answered from within
    this answer, and so on down the stack."""
    return (
        head is not None
        and not pipelined
        and body_length <= MAX_BODY_ON_LOOP
        and head.target.partition("?")[0] in paths
    )


def certificate_name(certificate: dict) -> str | None:
    """The name Kubernetes reads from a client certificate (``SSLSocket.getpeercert()``): the
    subject's last common name. Go's ``pkix.Name`` sets ``CommonName`` from every CN attribute in
    order, so with two (``CN=kube-apiserver, CN=attacker``) the API server sees the last; an
    allowed name earlier in the subject must not let the certificate in."""
    names = [value for rdn in certificate.get("subject", ()) for key, value in rdn if key == "commonName"]
    return names[-1] if names else None
