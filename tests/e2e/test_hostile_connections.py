"""Connections that try to exhaust a worker: resets before TLS, silent sockets by the thousand,
more buffered bodies than memory holds, and requests framed to confuse the loop.

Each attack here ended a worker, locked clients out or answered wrongly before: no connection's
error may end a worker; a silent connection is closed at the first-byte timeout; at the
connection limit the oldest idle connection makes room for a new client; the request bytes a
worker buffers are capped (503 with Retry-After past the cap); malformed framing gets 400 at
once, and ``Expect: 100-continue`` its interim answer before the body is sent.
"""

from __future__ import annotations

import contextlib
import json
import logging
import selectors
import socket
import ssl
import struct
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.helpers.live_server import live_server, metric_sum, post_json
from tests.helpers.paths import EXAMPLES
from webhook.serve.limits import PARSED_COST
from webhook.serve.worker import GuardWorker

REVIEW = (EXAMPLES / "admission" / "good-deployment.json").read_bytes()


def _head(extra: str) -> bytes:
    return f"POST /validate HTTP/1.1\r\nHost: guard\r\nContent-Type: application/json\r\n{extra}\r\n".encode()


def _worker_pids(server, count: int = 2) -> list[int]:
    """The server's worker processes, once all ``count`` have started (the server answers as
    soon as one has)."""
    pid = server.process.pid
    deadline = time.monotonic() + 10
    while True:
        pids = sorted(int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())
        if len(pids) >= count or time.monotonic() > deadline:
            return pids
        time.sleep(0.05)


def _raw_tls(server) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return server.tls_context().wrap_socket(raw, server_hostname="localhost")


def _reply(conn, limit: float = 10.0) -> bytes:
    """Everything the server sends until it closes or a whole JSON answer has arrived."""
    conn.settimeout(limit)
    data = b""
    with contextlib.suppress(OSError):
        while not (b"\r\n\r\n" in data and data.rstrip().endswith(b"}")):
            chunk = conn.recv(65536)
            if not chunk:
                break
            data += chunk
    return data


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("hostile")
    with live_server(
        workdir,
        "--cluster", str(EXAMPLES / "cluster"), "--request-timeout", "10", "--first-byte-timeout", "1",
        workers=2, threads=2,
    ) as s:  # fmt: skip
        yield s


def test_clients_that_reset_before_tls_do_not_end_a_worker(server):
    before = _worker_pids(server)
    for _ in range(25):
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.connect(("127.0.0.1", server.port))
        client.close()  # a reset, before a single byte
    time.sleep(0.5)  # every worker has accepted its share
    conn = server.connect()
    status, reply = post_json(conn, "/validate", REVIEW)
    conn.close()
    assert status == 200 and reply["response"]["allowed"] is True
    assert _worker_pids(server) == before  # no worker died and was replaced


def test_a_connection_that_sends_nothing_is_closed_at_the_first_byte_timeout(server):
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=8)
    started = time.monotonic()
    try:
        assert silent.recv(1) == b""  # closed by the server
    except ConnectionResetError:
        pass
    finally:
        silent.close()
    assert time.monotonic() - started < 5  # the first-byte timeout (1 s), not the request timeout (10 s)


def _closed_after(server, started: float) -> float:
    """Seconds from ``started`` until the server closes a connection that sends nothing."""
    silent = socket.create_connection(("127.0.0.1", server.port), timeout=8)
    try:
        assert silent.recv(1) == b""
    except ConnectionResetError:
        pass
    finally:
        silent.close()
    return time.monotonic() - started


def test_a_silent_connection_is_closed_within_a_tenth_of_a_second_of_its_first_byte_timeout(tmp_path):
    """The loop wakes for the nearest deadline, not on its one-second poll: a 0.5 s first-byte
    timeout closed silent connections at 1.0 s."""
    with live_server(
        tmp_path, "--cluster", str(EXAMPLES / "cluster"), "--first-byte-timeout", "0.5", workers=2, threads=2
    ) as s:
        for _ in range(3):
            took = _closed_after(s, time.monotonic())
            assert 0.5 <= took < 0.8, took


def test_a_bare_lf_request_gets_400_at_once(server):
    conn = _raw_tls(server)
    started = time.monotonic()
    conn.sendall(b"POST /validate HTTP/1.1\nHost: guard\nContent-Length: %d\n\n%s" % (len(REVIEW), REVIEW))
    answer = _reply(conn)
    conn.close()
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert time.monotonic() - started < 5  # not a 408 at the 10 s request timeout


def test_a_content_length_trailer_gets_400_not_500(server):
    conn = _raw_tls(server)
    chunked = b"%x\r\n%s\r\n0\r\nContent-Length: 5\r\n\r\n" % (len(REVIEW), REVIEW)
    conn.sendall(_head("Transfer-Encoding: chunked\r\n") + chunked)
    answer = _reply(conn)
    conn.close()
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"Traceback" not in server.log.read_bytes()


def test_expect_100_continue_gets_the_interim_answer_before_the_body_is_sent(server):
    conn = _raw_tls(server)
    conn.sendall(_head(f"Expect: 100-continue\r\nContent-Length: {len(REVIEW)}\r\n"))
    conn.settimeout(5)
    interim = conn.recv(100)
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    conn.sendall(REVIEW)
    answer = _reply(conn)
    conn.close()
    assert answer.startswith(b"HTTP/1.1 200 ") and b"100 Continue" not in answer


def test_a_new_client_is_answered_with_more_idle_connections_than_the_limit(tmp_path):
    with live_server(
        tmp_path,
        "--cluster", str(EXAMPLES / "cluster"), "--worker-connections", "16",
        "--first-byte-timeout", "10", "--request-timeout", "10",
        workers=1, threads=2,
    ) as s:  # fmt: skip
        idle = [socket.create_connection(("127.0.0.1", s.port), timeout=10) for _ in range(60)]
        try:
            time.sleep(0.5)  # all accepted (the oldest closed to make room)
            conn = s.connect()
            conn.timeout = 3.0  # far below the 10 s a silent connection could otherwise hold its slot
            status, _ = post_json(conn, "/validate", REVIEW)
            conn.close()
            assert status == 200
        finally:
            for sock in idle:
                sock.close()


# -- the buffer budget, measured on the worker's own counter ---------------------------------


class _Conn:
    """What the loop needs of gunicorn's TConn."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def close(self) -> None:
        self.sock.close()


def _loop_worker(max_buffered: int) -> GuardWorker:
    worker = GuardWorker.__new__(GuardWorker)
    worker.app = SimpleNamespace(max_buffered_bytes=max_buffered, request_timeout=30.0)
    worker._init_loop()
    worker.poller, worker.nr_conns = selectors.DefaultSelector(), 0
    worker.log = logging.getLogger("test-worker")
    return worker


_CHUNKED_START = _head("Transfer-Encoding: chunked\r\n") + b"%x\r\n" % (2 * 1024 * 1024)


def _send_body(sock: socket.socket, size: int, answers: list[bytes]) -> None:
    """Start a chunked body (no size declared: only what arrives counts), send ``size`` bytes of
    its first 2 MiB chunk, and keep what the server answers (nothing, for a body it buffered and
    still waits the rest of)."""
    with contextlib.suppress(OSError):
        sock.sendall(_CHUNKED_START + b"x" * size)
    answers.append(_reply(sock, limit=2.0))


def test_buffered_bodies_never_exceed_the_cap_and_those_past_it_get_503_with_retry_after():
    cap, body = 8 * 1024 * 1024, 1024 * 1024
    worker = _loop_worker(cap)
    clients, answers, threads = [], [], []
    for _ in range(24):  # 24 bodies of 1 MiB each, still arriving: three times the cap
        client, served = socket.socketpair()
        worker.nr_conns += 1
        worker._start(_Conn(served), handshake=False)
        clients.append(client)
        threads.append(threading.Thread(target=_send_body, args=(client, body, answers)))
    for thread in threads:
        thread.start()
    peak, deadline = 0, time.monotonic() + 30
    while any(t.is_alive() for t in threads) and time.monotonic() < deadline:
        worker.wait_for_and_dispatch_events(0.01)
        peak = max(peak, worker.buffered)
    for client in clients:
        client.close()
    refused = [a for a in answers if a.startswith(b"HTTP/1.1 503 ")]
    assert 0 < peak <= cap
    held_whole = cap // (body + len(_CHUNKED_START))  # 7 fit whole
    assert len(refused) >= 24 - held_whole
    assert all(b"\r\nRetry-After: " in a for a in refused)


def test_a_declared_body_that_could_not_be_parsed_within_the_budget_gets_503_before_it_is_sent():
    """Once whole, a request counts ``PARSED_COST`` times its size: one whose head already says
    it cannot fit is refused at once, not after its body arrived. Nothing is reserved for one
    that fits: a client declaring a body it never sends holds only what it sent."""
    cap = 8 * 1024 * 1024
    worker = _loop_worker(cap)
    too_large, fits = cap // PARSED_COST + 1, cap // PARSED_COST - 1024  # 1 KiB: room for the head
    answers = {}
    for declared in (too_large, fits):
        client, served = socket.socketpair()
        worker.nr_conns += 1
        worker._start(_Conn(served), handshake=False)
        client.sendall(_head(f"Content-Length: {declared}\r\n"))
        for _ in range(5):
            worker.wait_for_and_dispatch_events(0.01)
        client.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            answers[declared] = client.recv(200)
        client.close()
    assert answers[too_large].startswith(b"HTTP/1.1 503 ")
    assert fits not in answers  # still waiting for its body
    assert worker.buffered == len(_head(f"Content-Length: {fits}\r\n"))


def test_a_client_closing_while_the_budget_is_spent_is_not_refused_but_a_request_is():
    """A keep-alive client that closes while threads hold the whole budget sent no request: it
    is not answered 503, nor counted as refused. Before, the loop answered 503 before it read
    a byte, and the refusals counted overran the 503s clients saw."""
    worker = _loop_worker(1024 * 1024)
    worker.buffered = worker.max_buffered  # what requests in threads hold
    answers = []
    for sends in (b"", _head("Content-Length: 0\r\n")):
        client, served = socket.socketpair()
        worker.nr_conns += 1
        worker._start(_Conn(served), handshake=False)
        client.sendall(sends)
        client.shutdown(socket.SHUT_WR)
        for _ in range(3):
            worker.wait_for_and_dispatch_events(0.01)
        answers.append(_reply(client, limit=1.0))
        client.close()
    assert answers[0] == b""
    assert answers[1].startswith(b"HTTP/1.1 503 ")
    assert worker.buffered == worker.max_buffered and worker.nr_conns == 0


# -- the buffer budget, measured on a live worker's memory ------------------------------------

MAX_BODY = 3 * 1024 * 1024


def _max_size_review() -> bytes:
    """A valid review of exactly the body limit: a Deployment with a large annotation."""
    review = json.loads(REVIEW)
    review["request"]["object"]["metadata"]["annotations"] = {"pad": ""}
    pad = MAX_BODY - len(json.dumps(review).encode())
    review["request"]["object"]["metadata"]["annotations"]["pad"] = "x" * pad
    return json.dumps(review).encode()


def _memory(pid: int, field: str) -> int:
    """``VmRSS`` or ``VmHWM`` (the peak RSS) of a process, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise LookupError(field)


def _send_at_once(server, body: bytes, start: threading.Barrier, answers: list[bytes]) -> None:
    """A fast sender: TLS up first, then the whole request in one write, with the others."""
    try:
        conn = _raw_tls(server)
        start.wait()
        conn.sendall(_head(f"Content-Length: {len(body)}\r\n") + body)
        answers.append(_reply(conn, limit=30.0))
        conn.close()
    except (OSError, threading.BrokenBarrierError) as err:
        answers.append(repr(err).encode())


def test_worker_memory_stays_bounded_under_fast_senders(tmp_path):
    """60 clients write a 3 MiB review each at once. A request counts against the budget from
    its first byte until its answer is out, its parsed copies included: past the budget clients
    get 503 (counted in a metric), and the worker's peak RSS grows by less than one and a half
    budgets (the half: a growing buffer's slack, the connections' TLS state, the allocator's).
    Before, a body handed to a thread left the budget (and stayed in memory until its
    deadline): the same 60 took a worker twice its budget over its baseline, and more."""
    budget, connections = 48 * 1024 * 1024, 60  # room for one parsed 3 MiB review (39 MiB)
    body = _max_size_review()
    with live_server(
        tmp_path, "--cluster", str(EXAMPLES / "cluster"), "--max-buffered-bytes", str(budget),
        workers=1, threads=4,
    ) as s:  # fmt: skip
        (worker,) = _worker_pids(s, 1)
        warm = s.connect()
        assert post_json(warm, "/validate", REVIEW)[0] == 200
        baseline = _memory(worker, "VmRSS")
        start, answers = threading.Barrier(connections), []
        senders = [
            threading.Thread(target=_send_at_once, args=(s, body, start, answers)) for _ in range(connections)
        ]
        for sender in senders:
            sender.start()
        for sender in senders:
            sender.join(60)
        grown = _memory(worker, "VmHWM") - baseline
        metrics = s.connect()
        metrics.request("GET", "/metrics")
        scraped = metrics.getresponse().read().decode()
        assert _worker_pids(s, 1) == [worker] and s.process.poll() is None  # nothing killed
    statuses = [a.split(b" ", 2)[1] if a.startswith(b"HTTP/1.1 ") else a for a in answers]
    refused = [a for a in answers if a.startswith(b"HTTP/1.1 503 ")]
    print(f"peak RSS {grown >> 20} MiB over a baseline of {baseline >> 20} MiB; "
          f"{statuses.count(b'200')} answered 200, {len(refused)} 503")  # fmt: skip
    assert len(answers) == connections and set(statuses) == {b"200", b"503"}, statuses
    assert all(b"\r\nRetry-After: " in a for a in refused)
    assert grown <= budget * 3 // 2, f"peak RSS {grown >> 20} MiB over baseline, budget {budget >> 20} MiB"
    refusals = metric_sum(scraped, "admit_guard_requests_refused_total", reason="buffer-budget")
    assert refusals == len(refused), f"{refusals} refusals counted, {len(refused)} 503s received"


@pytest.mark.parametrize(
    ("cgroup", "files"),
    [
        ("0::/kubepods/pod1/c1\n", {"kubepods/pod1/c1/memory.max": "1073741824\n", "memory.max": "max\n"}),
        ("0::/\n", {"memory.max": "1073741824\n"}),  # a cgroup namespace: the root is the container's
        ("4:memory:/docker/c1\n", {"memory/docker/c1/memory.limit_in_bytes": "1073741824\n"}),
    ],
    ids=["cgroup-v2", "cgroup-v2-namespaced", "cgroup-v1"],
)
def test_the_default_buffer_budget_is_a_share_of_the_containers_memory_limit(tmp_path, cgroup, files):
    from webhook.serve.limits import container_memory_limit, default_buffered_bytes

    (tmp_path / "cgroup").write_text(cgroup)
    for name, text in files.items():
        (tmp_path / "fs" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "fs" / name).write_text(text)
    limit = container_memory_limit(tmp_path / "cgroup", tmp_path / "fs")
    assert limit == 1 << 30
    assert default_buffered_bytes(2, 3 << 20, limit) == 128 << 20  # a quarter of 1 GiB, per worker of 2


def test_without_a_memory_limit_the_buffer_budget_is_fixed_and_fits_one_largest_request_parsed(tmp_path):
    from webhook.serve.limits import (
        DEFAULT_BUFFERED_BYTES,
        container_memory_limit,
        default_buffered_bytes,
        parsed_cost,
    )

    (tmp_path / "cgroup").write_text("4:memory:/\n")
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert container_memory_limit(tmp_path / "cgroup", tmp_path) is None
    assert default_buffered_bytes(2, 3 << 20, None) == DEFAULT_BUFFERED_BYTES
    assert default_buffered_bytes(64, 3 << 20, 256 << 20) == parsed_cost((3 << 20) + 64 * 1024)
