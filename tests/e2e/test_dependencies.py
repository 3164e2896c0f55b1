"""Dependencies that cannot drift: what GuardWorker builds on in gunicorn is there in the
installed release, and the image installs exactly the pinned, hashed versions."""

from __future__ import annotations

import inspect
import os
import re
import socket
import tomllib
from concurrent.futures import Future

import pytest
from gunicorn import http, sock
from gunicorn.config import Config
from gunicorn.workers.gthread import TConn, ThreadWorker
from packaging.requirements import Requirement

from tests.helpers.paths import ROOT
from webhook.serve.worker import GuardWorker


def defined_in(cls: type) -> list[str]:
    return [name for name, value in vars(cls).items() if inspect.isfunction(value)]


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


def test_every_method_guard_worker_overrides_is_gunicorns_with_the_same_parameters():
    overridden = [name for name in defined_in(GuardWorker) if not name.startswith("_")]
    assert {"accept", "enqueue_req", "finish_request", "handle_request", "murder_pending"} <= set(overridden)
    for name in overridden:
        assert hasattr(ThreadWorker, name), f"gunicorn's ThreadWorker has no {name}: GuardWorker overrides it"
        assert parameters(getattr(ThreadWorker, name)) == parameters(getattr(GuardWorker, name)), name


def test_guard_workers_own_helpers_shadow_nothing_of_gunicorns():
    helpers = [name for name in defined_in(GuardWorker) if name.startswith("_") and not name.startswith("__")]
    assert [name for name in helpers if hasattr(ThreadWorker, name)] == []


@pytest.fixture
def worker():
    worker = ThreadWorker(1, os.getpid(), [], None, 30, Config(), None)
    yield worker
    worker.tmp.close()


@pytest.fixture
def conn(worker):
    ours, theirs = socket.socketpair()
    conn = TConn(worker.cfg, ours, ("127.0.0.1", 40000), ("127.0.0.1", 8443))
    yield conn
    ours.close()
    theirs.close()


def test_the_worker_and_connection_state_guard_worker_reads_is_there(worker, conn):
    for name in ("nr_conns", "keepalived_conns", "poller", "cfg", "log", "app"):
        assert hasattr(worker, name), name
    assert not worker.cfg.is_ssl  # computed from certfile and keyfile
    for name in ("sock", "parser", "initialized", "data_ready", "client"):
        assert hasattr(conn, name), name
    parser = http.get_parser(worker.cfg, conn.sock, conn.client)
    assert callable(parser.unreader.take_buffered) and callable(parser.unreader.unread)
    assert parameters(sock.ssl_wrap_socket) == ["sock", "conf"]


def test_gunicorn_hands_a_request_read_ahead_after_a_keep_alive_reply_to_enqueue_req(worker, conn):
    """GuardWorker reads every request in its loop, entered through ``enqueue_req``; before 27.0
    gunicorn parked such a connection in the poller, where the buffered request waited forever."""
    enqueued = []
    worker.enqueue_req = enqueued.append
    conn.parser = http.get_parser(worker.cfg, conn.sock, conn.client)
    conn.parser.unreader.unread(b"GET /healthz HTTP/1.1\r\n")
    done: Future = Future()
    done.set_result(True)  # the reply announced keep-alive
    worker.finish_request(conn, done)
    assert enqueued == [conn]


def locked() -> dict[str, str]:
    text = (ROOT / "requirements.lock").read_text()
    return {name.lower(): version for name, version in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M)}


def test_the_lock_pins_every_runtime_dependency_within_pyprojects_bounds_with_hashes():
    pins = locked()
    for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement = Requirement(line)
        name = requirement.name.lower()
        assert name in pins, f"{name} is not in requirements.lock: run make lock"
        assert requirement.specifier.contains(pins[name]), f"{name}=={pins[name]} is outside {line!r}"
    entries = re.split(r"\n(?=[A-Za-z0-9])", (ROOT / "requirements.lock").read_text().split("\n\n")[-1])
    assert all("--hash=sha256:" in entry for entry in entries if "==" in entry)


def test_the_image_installs_the_lock_file_and_nothing_unpinned():
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert "--require-hashes" in dockerfile and "-r /tmp/requirements.lock" in dockerfile
    assert "pip install --no-cache-dir --no-deps /wheels/" in dockerfile  # the guard itself only
