"""Requests answered from the head the event loop parsed (``serve/direct.py``): the same environ
gunicorn builds, replies HTTP/1.x clients read right, and every head that is not plain left to
gunicorn's parser."""

from __future__ import annotations

import socket

import pytest
from gunicorn.config import Config
from gunicorn.http import get_parser, wsgi

from webhook.serve.direct import Exchange
from webhook.serve.framing import COMPLETE, RequestFraming

REVIEW = (
    b"POST /validate?timeout=10s HTTP/1.1\r\nHost: guard.svc:443\r\nUser-Agent: kube-apiserver-admission\r\n"
    b"Content-Type: application/json\r\nAccept: application/json, */*\r\nAccept-Encoding: gzip\r\n"
    b"X-Seen: one\r\nx-seen: two\r\nContent-Length: 15\r\n\r\n"
    b'{"kind": "Pod"}'
)


def framed(request: bytes) -> RequestFraming:
    framing = RequestFraming(max_body=1024)
    assert framing.progress(bytearray(request)) == COMPLETE
    return framing


def gunicorns_environ(request: bytes) -> dict:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(request)
        theirs.shutdown(socket.SHUT_WR)
        req = next(get_parser(Config(), ours, ("10.0.0.1", 51000)))
        _, environ = wsgi.create(req, ours, ("10.0.0.1", 51000), ("10.0.0.2", 8443), Config())
        environ["body"] = environ["wsgi.input"].read()
    return environ


def test_the_environ_is_the_one_gunicorn_builds_for_the_same_request():
    framing = framed(REVIEW)
    body = REVIEW[framing.head_end : framing.end]
    exchange = Exchange(lambda environ, start: [], secure=False, multiprocess=True)
    ours = exchange.environ(framing.head, body, ("10.0.0.1", 51000), ("10.0.0.2", 8443))
    theirs = gunicorns_environ(REVIEW)
    compared = [key for key in theirs if key.isupper() and key != "SCRIPT_NAME"]
    assert {key: ours.get(key) for key in compared} == {key: theirs[key] for key in compared}
    assert ours["HTTP_X_SEEN"] == "one,two"  # repeated names joined, as RFC 9110 5.3 reads them
    assert ours["wsgi.input"].read() == theirs["body"] == b'{"kind": "Pod"}'


@pytest.mark.parametrize(
    "head",
    [
        b"POST /v HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",  # chunked: gunicorn decodes
        b"POST /v HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n",  # a second length
        b"POST /v HTTP/1.1\r\nX_Forwarded: 1\r\n\r\n",  # gunicorn drops names with _
        b"POST /v HTTP/1.1\r\nHost : a\r\n\r\n",  # space before the colon
        b"POST /v HTTP/1.1\r\nHost: a\r\n b\r\n\r\n",  # obsolete line folding
        b"POST /v HTTP/1.1\r\nX: \x01\r\n\r\n",  # a control character in a value
        b"POST http://a/v HTTP/1.1\r\n\r\n",  # absolute-form
        b"POST /v HTTP/1.1\r\nUpgrade: h2c\r\n\r\n",  # a protocol upgrade
        b"POST /v HTTP/1.1\r\nExpect: magic\r\nContent-Length: 0\r\n\r\n",  # an expectation not met
        b"post /v HTTP/1.1\r\n\r\n",
        b"POST /v HTTP/2.0\r\n\r\n",
        b"POST /v%s HTTP/1.1\r\n\r\n" % (b"a" * 5000),
    ],
)
def test_a_head_that_is_not_plain_is_left_to_gunicorns_parser(head):
    assert framed(head).head is None


def app_answering(status: str, headers: list, body: bytes):
    def app(environ, start_response):
        start_response(status, headers)
        return [body]

    return app


def answer(app, request: bytes, keep_alive: bool = True) -> tuple[bytes, bool]:
    framing = framed(request)
    exchange = Exchange(app, secure=True, multiprocess=True)
    environ = exchange.environ(framing.head, b"", ("10.0.0.1", 1), ("10.0.0.2", 2))
    return exchange.answer(environ, framing.head, keep_alive)


@pytest.mark.parametrize(
    ("request_head", "kept"),
    [
        (b"GET / HTTP/1.1\r\n\r\n", True),
        (b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n", False),
        (b"GET / HTTP/1.0\r\n\r\n", False),
        (b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", True),
    ],
)
def test_a_connection_persists_as_http_1_0_and_1_1_define_it(request_head, kept):
    reply, keep_alive = answer(app_answering("200 OK", [], b"{}"), request_head)
    assert keep_alive is kept
    assert (b"Connection: keep-alive\r\n" if kept else b"Connection: close\r\n") in reply
    assert reply.startswith(request_head.split(b"\r\n")[0][-8:] + b" 200 OK\r\n")


def test_a_worker_that_may_not_keep_the_connection_closes_it():
    reply, keep_alive = answer(app_answering("200 OK", [], b"{}"), b"GET / HTTP/1.1\r\n\r\n", False)
    assert not keep_alive and b"Connection: close\r\n" in reply


def test_a_reply_says_its_length_dates_itself_and_head_gets_no_body():
    app = app_answering("200 OK", [("Content-Type", "application/json")], b'{"ok": true}')
    reply, _ = answer(app, b"GET /readyz HTTP/1.1\r\n\r\n")
    head, _, body = reply.partition(b"\r\n\r\n")
    assert body == b'{"ok": true}'
    assert b"\r\nContent-Length: 12\r\n" in head + b"\r\n" and b"\r\nDate: " in head
    reply, _ = answer(app, b"HEAD /readyz HTTP/1.1\r\n\r\n")
    assert reply.endswith(b"\r\n\r\n") and b"Content-Length: 12\r\n" in reply


def test_a_body_longer_than_the_declared_length_is_cut_to_it():
    app = app_answering("200 OK", [("Content-Length", "2")], b"{}xx")
    reply, keep_alive = answer(app, b"GET / HTTP/1.1\r\n\r\n")
    assert reply.endswith(b"\r\n\r\n{}") and keep_alive


def test_no_content_status_gets_no_body():
    reply, _ = answer(app_answering("204 No Content", [], b"x"), b"GET / HTTP/1.1\r\n\r\n")
    assert reply.endswith(b"\r\n\r\n") and b"Content-Length" not in reply
