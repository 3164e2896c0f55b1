"""A thread that promised not to wait (``state/waiting.py``): every wait point on the decision's
path raises ``WouldWait`` there, before it changed anything, and waits as before elsewhere."""

from __future__ import annotations

import fcntl
import os
import threading
import time

import pytest

from tests.helpers.builders import node
from tests.helpers.fake_apiserver import Cluster, FakeApiServer
from webhook.coordination.budget import Busy
from webhook.coordination.names import table_file_name
from webhook.coordination.reservations import node_table
from webhook.state.apiserver import ApiServer
from webhook.state.informer import Informer, Timing
from webhook.state.waiting import WouldWait, acquire, before_waiting, without_waiting


def test_a_free_lock_is_taken_without_waiting():
    lock = threading.Lock()
    with without_waiting():
        assert acquire(lock)
    assert lock.locked()


def test_a_lock_another_thread_holds_raises_would_wait_at_once():
    lock = threading.Lock()
    lock.acquire()
    started = time.monotonic()
    with without_waiting(), pytest.raises(WouldWait):
        acquire(lock, timeout=5)
    assert time.monotonic() - started < 1  # not the 5 s its timeout allows


def test_outside_the_promise_a_held_lock_is_waited_for_up_to_its_timeout():
    lock = threading.Lock()
    lock.acquire()
    assert acquire(lock, timeout=0.05) is False
    before_waiting("anything")  # no promise, no error


def test_the_promise_is_the_calling_threads_alone():
    seen: list[BaseException | None] = []

    def elsewhere() -> None:
        try:
            before_waiting("the API server")
            seen.append(None)
        except WouldWait as err:
            seen.append(err)

    with without_waiting():
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        with pytest.raises(WouldWait, match="the API server"):
            before_waiting("the API server")
    assert seen == [None]
    before_waiting("the API server")  # the promise ended with the block


def test_a_node_table_another_process_holds_raises_would_wait_and_is_left_as_it_was(tmp_path):
    table = node_table(tmp_path)
    table.hold("node-1", time.monotonic() + 1).release()  # the file exists, as after a first bind
    other = os.open(tmp_path / table_file_name("node-1"), os.O_RDWR)  # another worker's descriptor
    try:
        fcntl.flock(other, fcntl.LOCK_EX)
        with without_waiting(), pytest.raises(WouldWait, match="the lock of"):
            table.hold("node-1", time.monotonic() + 5)
        with pytest.raises(Busy):  # outside the promise it waits, then gives up as before
            table.hold("node-1", time.monotonic() + 0.05)
    finally:
        os.close(other)
    held = table.hold("node-1", time.monotonic() + 1)  # the failed attempts released its own lock
    held.release()


def test_a_node_table_another_thread_holds_raises_would_wait(tmp_path):
    table = node_table(tmp_path)
    held = table.hold("node-1", time.monotonic() + 1)
    try:
        outcome: list[BaseException] = []

        def decide() -> None:
            with without_waiting():
                try:
                    table.hold("node-1", time.monotonic() + 5)
                except WouldWait as err:
                    outcome.append(err)

        thread = threading.Thread(target=decide)
        thread.start()
        thread.join(2)
        assert len(outcome) == 1
    finally:
        held.release()


def test_reading_a_state_its_informer_is_writing_raises_would_wait(tmp_path):
    cluster = Cluster()
    cluster.load("nodes", [node("n0")])
    server = FakeApiServer(cluster)
    api = ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))
    informer = Informer(api, Timing(watch_timeout=3, read_timeout=1.0)).start()
    try:
        assert informer.wait_synced(10)
        # The informer applies an event.
        with informer.lock, without_waiting(), pytest.raises(WouldWait), informer.reading():
            pass
        with without_waiting(), informer.reading() as view:  # free: read at once
            assert view.state is informer.state
        # Readiness is asked after a review was answered, when a retry is too late: no lock.
        answers: list = []
        with informer.lock:
            asking = threading.Thread(target=lambda: answers.append(informer.readiness()))
            asking.start()
            asking.join(2)
            answered_while_held = not asking.is_alive()
        asking.join()
        assert answered_while_held
        assert [(r.ready, r.nodes) for r in answers] == [(True, 1)]
    finally:
        informer.stop()
        server.close()


def test_a_call_to_the_api_server_raises_would_wait_before_it_is_sent():
    api = ApiServer.__new__(ApiServer)  # no pool: a request sent would fail otherwise
    with without_waiting(), pytest.raises(WouldWait, match="PUT /apis/coordination"):
        api.request_json("PUT", "/apis/coordination.k8s.io/v1/namespaces/g/leases/node-1", {})
