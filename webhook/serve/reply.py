"""The socket a pool thread answers through (``Reply``): the thread never waits on a client.

``GuardWorker.handle_request`` (``worker.py``) puts it in place of the connection's socket for
the thread's answer, and the event loop sends what it leaves. It also carries, to the WSGI
environ, whether the connection's client certificate verified (``with_client_identity``).
"""

from __future__ import annotations

import ssl

from .wsgi import CLIENT_VERIFIED

# What a non-blocking socket (TLS or not) raises when it must wait to read or write.
WOULD_BLOCK = (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError, InterruptedError)


class Reply:
    """The socket a pool thread answers through: the response is collected and sent in one go.

    One send makes a small response one TLS record. ``send_now`` does not wait: what a slow
    reader leaves in ``rest`` is sent by the event loop (``GuardWorker.finish_request``) under
    the request deadline, the way requests are read. A blocking send with a timeout would still
    hold a thread for the whole timeout per slow reader, and as many clients as there are
    threads, pipelining requests and never reading, would stop every decision for that long;
    in the loop such a client holds a registered socket, not a thread. The responses are small
    JSON documents and metrics, so holding one whole costs little.

    ``client_verified``: the connection presented a client certificate the server verified
    (and whose name is allowed); the app reads it from the WSGI environ (``CLIENT_VERIFIED``).
    """

    def __init__(self, sock, client_verified: bool = False) -> None:
        self._sock = sock
        self._out = bytearray()
        self.rest = memoryview(b"")
        self.client_verified = client_verified

    def sendall(self, data) -> None:
        self._out += data

    def send_now(self) -> None:
        timeout = self._sock.gettimeout()
        self._sock.setblocking(False)
        try:
            self.rest = send_without_waiting(self._sock, self._out)
        finally:
            self._sock.settimeout(timeout)

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


def send_without_waiting(sock, data: bytes | bytearray) -> memoryview:
    """Send what a non-blocking ``sock`` takes now; the rest is the loop's to send."""
    rest = memoryview(data)
    try:
        while rest:
            # TLS: after a would-block the same bytes are offered again, as OpenSSL requires.
            rest = rest[sock.send(rest) :]
    except WOULD_BLOCK:
        pass
    return rest


def with_client_identity(app):
    """WSGI middleware: ``environ[CLIENT_VERIFIED]`` from the connection the request came on."""

    def wsgi(environ, start_response):
        reply = environ.get("gunicorn.socket")
        environ[CLIENT_VERIFIED] = isinstance(reply, Reply) and reply.client_verified
        return app(environ, start_response)

    return wsgi
