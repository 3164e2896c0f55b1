"""Slow or broken clients cannot hold the threads that serve decisions.

The worker's event loop does the TLS handshake and reads each request whole before a pool
thread sees it (webhook/worker.py); these tests hold many trickling connections against a real
server with few threads and require a normal client to be served meanwhile.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.live_server import live_server, post_json
from webhook.worker import COMPLETE, INCOMPLETE, MALFORMED, TOO_LARGE, RequestFraming

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
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


def test_the_server_still_answers_after_the_hostile_connections(server):
    conn = server.connect()
    status, _ = post_json(conn, "/validate", REVIEW)
    assert status == 200
    conn.close()


def test_headers_and_body_leave_in_one_write():
    from webhook.worker import OneWrite

    class Recorder:
        def __init__(self):
            self.sent = []

        def sendall(self, data):
            self.sent.append(bytes(data))

    sock = Recorder()
    out = OneWrite(sock)
    out.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")
    assert sock.sent == []
    out.sendall(b"{}")
    out.flush()
    assert sock.sent == [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"]
    out.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
    out.flush()  # a response without a body still leaves
    assert sock.sent[-1] == b"HTTP/1.1 204 No Content\r\n\r\n"
