"""Slow or broken clients cannot hold the threads that serve decisions.

The worker's event loop does the TLS handshake and reads each request whole before a pool
thread sees it (webhook/serve/worker.py); these tests hold many trickling connections against a real
server with few threads and require a normal client to be served meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import re
import selectors
import socket
import ssl
import threading
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.live_server import live_server, post_json
from tests.helpers.paths import EXAMPLES
from webhook.serve.framing import COMPLETE, INCOMPLETE, MALFORMED, TOO_LARGE, RequestFraming

REVIEW = (EXAMPLES / "admission" / "good-deployment.json").read_bytes()


def _head(extra: str) -> bytes:
    return f"POST /validate HTTP/1.1\r\nHost: guard\r\nContent-Type: application/json\r\n{extra}\r\n".encode()


def _chunked(body: bytes, sizes: list[int]) -> bytes:
    out, at = b"", 0
    for size in sizes:
        piece = body[at : at + size]
        if not piece:
            break
        out += b"%x\r\n%s\r\n" % (len(piece), piece)
        at += len(piece)
    if at < len(body):
        out += b"%x\r\n%s\r\n" % (len(body) - at, body[at:])
    return out + b"0\r\n\r\n"


@st.composite
def requests(draw) -> bytes:
    body = draw(st.binary(max_size=300))
    if draw(st.booleans()):
        return _head(f"Content-Length: {len(body)}\r\n") + body
    sizes = draw(st.lists(st.integers(1, 64), max_size=8))
    return _head("Transfer-Encoding: chunked\r\n") + _chunked(body, sizes)


@given(request=requests(), cuts=st.lists(st.integers(0, 2000), max_size=6), pipelined=st.binary(max_size=20))
def test_a_request_is_complete_exactly_when_its_last_byte_arrives(request, cuts, pipelined):
    framing = RequestFraming(max_body=1 << 20)
    data = bytearray()
    for cut in sorted({c for c in cuts if 0 < c < len(request)}):
        data += request[len(data) : cut]
        assert framing.progress(data) == INCOMPLETE
    data += request[len(data) :] + pipelined
    assert framing.progress(data) == COMPLETE
    assert framing.end == len(request)


def test_a_declared_body_over_the_limit_is_too_large_before_it_arrives():
    assert RequestFraming(max_body=1000).progress(bytearray(_head("Content-Length: 1001\r\n"))) == TOO_LARGE


def test_a_chunked_body_is_too_large_as_soon_as_it_passes_the_limit():
    first_chunk = b"400\r\n" + b"x" * 1024 + b"\r\n"
    data = bytearray(_head("Transfer-Encoding: chunked\r\n") + first_chunk + b"400\r\n")
    assert RequestFraming(max_body=1500).progress(data) == TOO_LARGE


@pytest.mark.parametrize(
    "data",
    [b"x" * (70 * 1024), _head("Content-Length: -1\r\n"), _head("Content-Length: ten\r\n"),
     _head("Transfer-Encoding: chunked\r\n") + b"zz\r\n"],
)  # fmt: skip
def test_malformed_framing_is_refused(data):
    assert RequestFraming(max_body=1 << 20).progress(bytearray(data)) == MALFORMED


@pytest.mark.parametrize("size", [b"-2", b"0x10", b"1_0", b" 10", b"+a", b"10 ", b"1" * 17, b""])
def test_a_chunk_size_is_plain_hex(size):
    value = int(size or b"0", 16)  # what int() makes of it: the chunk is sent to match
    chunk = b"x" * value + b"\r\n" if 0 < value < 100 else b""
    data = bytearray(_head("Transfer-Encoding: chunked\r\n") + size + b"\r\n" + chunk + b"0\r\n\r\n")
    assert RequestFraming(max_body=1 << 20).progress(data) == MALFORMED


def test_a_chunks_data_must_end_with_crlf_before_the_next_size():
    data = bytearray(_head("Transfer-Encoding: chunked\r\n") + b"2\r\n{}XY0\r\n\r\n")
    assert RequestFraming(max_body=1 << 20).progress(data) == MALFORMED


def test_negative_chunk_sizes_cannot_hide_a_body_over_the_limit():
    data = bytearray(_head("Transfer-Encoding: chunked\r\n") + b"-2\r\n" * 2000)
    data += b"%x\r\n%s\r\n0\r\n\r\n" % (4000, b"x" * 4000)
    assert RequestFraming(max_body=1000).progress(data) != COMPLETE


def test_chunk_extensions_are_accepted():
    data = bytearray(_head("Transfer-Encoding: chunked\r\n") + b"2;name=value\r\n{}\r\n0 ; last\r\n\r\n")
    framing = RequestFraming(max_body=1 << 20)
    assert framing.progress(data) == COMPLETE and framing.end == len(data)


@pytest.mark.parametrize(
    "tail",
    [b"0\r\nX-Trailer: " + b"a" * 9000,  # still arriving
     b"0\r\nX-Trailer: " + b"a" * 9000 + b"\r\n\r\n",  # arrived at once
     b"1;" + b"e" * 2000 + b"\r\nx\r\n"],  # a chunk-size line with a long extension
)  # fmt: skip
def test_trailers_and_chunk_size_lines_are_capped(tail):
    data = bytearray(_head("Transfer-Encoding: chunked\r\n") + b"2\r\n{}\r\n" + tail)
    assert RequestFraming(max_body=1 << 20).progress(data) == MALFORMED


def test_chunk_extensions_cannot_make_a_body_buffer_more_than_twice_the_limit():
    data = bytearray(_head("Transfer-Encoding: chunked\r\n") + (b"1;" + b"e" * 500 + b"\r\nx\r\n") * 5)
    assert RequestFraming(max_body=1000).progress(data) == TOO_LARGE


class _CountingBuffer(bytearray):
    """A request buffer that counts the bytes ``find`` looks at."""

    scanned = 0

    def find(self, sub, start=0, *args):
        self.scanned += len(self) - start
        return super().find(sub, start, *args)


def test_a_trickled_request_is_scanned_once_not_on_every_read():
    request = (
        _head("Transfer-Encoding: chunked\r\n" + "X-Pad: p\r\n" * 300)
        + b"2\r\n{}\r\n0\r\n" + b"X-Trailer: t\r\n" * 400 + b"\r\n"
    )  # fmt: skip
    framing, data = RequestFraming(max_body=1 << 20), _CountingBuffer()
    for byte in request[:-1]:
        data.append(byte)
        assert framing.progress(data) == INCOMPLETE
    data.append(request[-1])
    assert framing.progress(data) == COMPLETE
    assert data.scanned < 5 * len(request)  # every byte once, give or take the terminators


class _Firehose:
    """A client socket with always another tiny TLS record to read, until ``pause``."""

    def __init__(self, fd: int, pause: int = 100_000):
        self.fd, self.pause, self.reads, self.sent = fd, pause, 0, b""

    def fileno(self):
        return self.fd

    def setblocking(self, flag):
        pass

    def recv(self, size):
        self.reads += 1
        if self.reads > self.pause:
            raise BlockingIOError  # the client pauses at last
        return b"X-T: t\r\n"

    def send(self, data):
        self.sent += bytes(data)
        return len(data)


def test_a_client_that_always_has_more_gets_a_turn_not_the_loop():
    from webhook.serve.worker import GuardWorker

    class Conn:
        def __init__(self, sock):
            self.sock = sock

        def close(self):
            pass

    worker = GuardWorker.__new__(GuardWorker)
    worker.app = None
    worker._init_loop()
    worker.poller, worker.nr_conns = selectors.DefaultSelector(), 1
    worker.request_timeout, worker.max_body = 3.0, 1 << 20
    left, right = socket.socketpair()
    with left, right:
        client = _Firehose(left.fileno())
        conn = Conn(client)
        worker._start(
            conn, handshake=False, data=_head("Transfer-Encoding: chunked\r\n") + b"2\r\n{}\r\n0\r\n"
        )
        assert client.reads <= 64  # back to the poller, which calls again while the socket is readable
        for _ in range(100):  # the trailers pass their cap: 400, then what follows is drained
            reads = client.reads
            worker._advance(worker.pending_requests[conn])
            assert client.reads - reads <= 2 * 64  # the turn that ends in the 400 starts the drain too
        assert client.sent.startswith(b"HTTP/1.1 400 ")
        worker.poller.close()


# -- against a real server ------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("slow")
    with live_server(
        workdir, "--cluster", str(EXAMPLES / "cluster"), "--request-timeout", "3", workers=1, threads=2
    ) as s:
        yield s


def _client_hello() -> bytes:
    """The first flight of a real TLS client, to trickle byte by byte."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    return outgoing.read()


def _trickle(server, stop: threading.Event, tls_first: bool) -> None:
    """Send a request a byte every 0.2 s: the ClientHello itself, or headers after a handshake."""
    try:
        raw = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        if tls_first:
            conn, payload = raw, _client_hello()
        else:
            conn = server.tls_context().wrap_socket(raw, server_hostname="localhost")
            payload = _head(f"Content-Length: {len(REVIEW)}\r\n") + REVIEW
        for byte in payload:
            if stop.wait(0.2):
                break
            conn.sendall(bytes([byte]))
        conn.close()
    except OSError:
        pass  # the server closed it: the deadline worked


def test_trickling_connections_do_not_stall_a_normal_keep_alive_client(server):
    stop = threading.Event()
    slow = [
        threading.Thread(target=_trickle, args=(server, stop, i % 2 == 0), daemon=True) for i in range(24)
    ]
    for thread in slow:
        thread.start()
    try:
        time.sleep(1.0)  # every slow connection is open and trickling
        conn = server.connect()
        conn.timeout = 2.0  # far below the 3 s deadline the slow ones are held to
        for _ in range(20):
            status, reply = post_json(conn, "/validate", REVIEW)
            assert status == 200 and reply["response"]["allowed"] is True
        conn.close()
    finally:
        stop.set()
        for thread in slow:
            thread.join(10)


def _raw_tls(server) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return server.tls_context().wrap_socket(raw, server_hostname="localhost")


def _answer(conn: ssl.SSLSocket) -> tuple[int, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_a_body_shorter_than_its_content_length_is_answered_408_at_the_deadline(server):
    conn = _raw_tls(server)
    conn.sendall(_head(f"Content-Length: {1024 * 1024}\r\n") + b"{" * 100)
    status, body = _answer(conn)
    assert status == 408 and json.loads(body)["code"] == 408
    conn.close()


def test_a_declared_body_over_the_limit_is_answered_413_without_waiting_for_it(server):
    conn = _raw_tls(server)
    conn.sendall(_head(f"Content-Length: {4 * 1024 * 1024}\r\n") + b"{" * 100)
    status, _ = _answer(conn)
    assert status == 413
    conn.close()


def test_a_chunked_body_over_the_limit_is_answered_413(server):
    conn = _raw_tls(server)
    conn.sendall(_head("Transfer-Encoding: chunked\r\n"))
    chunk = b"%x\r\n%s\r\n" % (1024 * 1024, b"x" * (1024 * 1024))
    try:
        for _ in range(4):
            conn.sendall(chunk)
    except OSError:
        pass
    status, _ = _answer(conn)
    assert status == 413
    conn.close()


def test_trailers_over_the_cap_are_answered_400_at_once(server):
    conn = _raw_tls(server)
    conn.sendall(_head("Transfer-Encoding: chunked\r\n") + b"2\r\n{}\r\n0\r\n" + b"X-Trailer: t\r\n" * 1000)
    status, _ = _answer(conn)
    assert status == 400  # not 408 at the deadline: the loop stopped buffering at the cap
    conn.close()


def _statuses(conn: ssl.SSLSocket, count: int) -> list[int]:
    data = b""
    while data.count(b"HTTP/1.1 ") < count or not data.endswith(b"}"):
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", data)]


@pytest.mark.parametrize(
    "second, status",
    [(_head(f"Content-Length: {4 * 1024 * 1024}\r\n"), 413),
     (_head("Content-Length: 1000\r\n") + b"{", 408),
     (_head("Transfer-Encoding: chunked\r\n") + b"-2\r\n", 400)],
)  # fmt: skip
def test_a_pipelined_request_is_held_to_the_rules_of_the_first(server, second, status):
    conn = _raw_tls(server)
    conn.sendall(_head(f"Content-Length: {len(REVIEW)}\r\n") + REVIEW + second)
    assert _statuses(conn, 2) == [200, status]
    conn.close()


def _pipeline_and_never_read(server, count: int) -> ssl.SSLSocket:
    raw = socket.socket()
    # A small window and segment size keep the server's send buffer small (on loopback it grows
    # to megabytes): its replies back up after a few dozen, not thousands.
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
    raw.settimeout(2)
    raw.connect(("127.0.0.1", server.port))
    conn = server.tls_context().wrap_socket(raw, server_hostname="localhost")
    with contextlib.suppress(OSError):
        conn.sendall(b"GET /metrics HTTP/1.1\r\nHost: guard\r\n\r\n" * count)
    return conn


def test_clients_that_pipeline_and_never_read_do_not_hold_the_threads(server):
    hogs = [_pipeline_and_never_read(server, 3000) for _ in range(2)]  # as many as the threads
    try:
        time.sleep(1.0)  # their replies have filled the socket buffers
        conn = server.connect()
        conn.timeout = 2.0  # below the 3 s deadline the hogs' replies are held to
        for _ in range(5):
            status, _ = post_json(conn, "/validate", REVIEW)
            assert status == 200
        conn.close()
    finally:
        for hog in hogs:
            hog.close()


def test_a_slow_reader_still_gets_every_reply_whole(server):
    conn = _pipeline_and_never_read(server, 200)
    time.sleep(0.5)  # the replies back up: the loop holds the rest of one, the others wait
    conn.settimeout(5)
    data, replies = b"", 0
    while replies < 200:
        head_end = data.find(b"\r\n\r\n")
        length = re.search(rb"Content-Length: (\d+)", data[:head_end]) if head_end >= 0 else None
        if length and len(data) >= head_end + 4 + int(length[1]):
            assert data.startswith(b"HTTP/1.1 200 ") and b"# TYPE" in data[head_end : head_end + 200]
            data, replies = data[head_end + 4 + int(length[1]) :], replies + 1
            continue
        chunk = conn.recv(4096)
        assert chunk, f"closed after {replies} replies"
        data += chunk
    conn.close()


def test_clients_that_keep_a_closed_connection_open_do_not_stall_the_loop(server):
    conn = server.connect()
    post_json(conn, "/validate", REVIEW)  # connected and kept alive before them
    holders = [_raw_tls(server) for _ in range(3)]
    for holder in holders:  # answered with "Connection: close"; they neither close nor send more
        holder.sendall(b"GET /healthz HTTP/1.1\r\nHost: guard\r\nConnection: close\r\n\r\n")
    try:
        time.sleep(0.2)
        conn.sock.settimeout(1.0)  # below the 2 s each of them lingers
        for _ in range(3):
            status, _ = post_json(conn, "/validate", REVIEW)
            assert status == 200
        conn.close()
        for holder in holders:
            assert _answer(holder)[0] == 200
            assert holder.recv(100) == b""  # half-closed by the server at once
    finally:
        for holder in holders:
            holder.close()


def test_the_server_still_answers_after_the_hostile_connections(server):
    conn = server.connect()
    status, _ = post_json(conn, "/validate", REVIEW)
    assert status == 200
    conn.close()


class _SmallSocket:
    """A non-blocking socket stand-in that takes ``room`` bytes, then would block."""

    def __init__(self, room: int = 1 << 20):
        self.room, self.sent, self.timeout = room, [], 5.0

    def send(self, data):
        if not self.room:
            raise ssl.SSLWantWriteError()
        taken = bytes(data[: self.room])
        self.room -= len(taken)
        self.sent.append(taken)
        return len(taken)

    def gettimeout(self):
        return self.timeout

    def setblocking(self, flag):
        self.timeout = None if flag else 0.0

    def settimeout(self, timeout):
        self.timeout = timeout


def test_headers_and_body_leave_in_one_write():
    from webhook.serve.reply import Reply

    sock = _SmallSocket()
    out = Reply(sock)
    out.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
    out.sendall(b"{}")
    assert sock.sent == []
    out.send_now()
    assert sock.sent == [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"] and not out.rest
    assert sock.timeout == 5.0  # as the thread had it


def test_what_a_slow_reader_does_not_take_is_left_for_the_loop_not_waited_for():
    from webhook.serve.reply import Reply

    sock = _SmallSocket(room=10)
    out = Reply(sock)
    out.sendall(b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 100)
    out.send_now()  # returns at once
    assert b"".join(sock.sent) + bytes(out.rest) == b"HTTP/1.1 200 OK\r\n\r\n" + b"x" * 100
    assert len(out.rest) == 19 + 100 - 10
