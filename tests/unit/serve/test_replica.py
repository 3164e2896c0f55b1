"""One cluster state per replica: the master's informer, workers forked from it, renewed."""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass, field

import orjson
import pytest

from tests.helpers.builders import node, pod
from tests.helpers.fake_apiserver import Cluster, FakeApiServer
from tests.helpers.informer import converged, eventually
from webhook.serve import replica as replica_module
from webhook.serve.replica import AwaitingLeader, Renewal, ReplicaState
from webhook.state.apiserver import ApiServer
from webhook.state.informer import Informer, Timing

FAST = Timing(page_size=2, watch_timeout=3, read_timeout=1.0, backoff_base=0.02, backoff_cap=0.2, max_age=30)
MIB = 1 << 20


@pytest.fixture
def cluster():
    cluster = Cluster(bookmark_every=0.2)
    cluster.load("nodes", [node(f"n{i}", cpu="4") for i in range(3)])
    cluster.load("pods", [pod(f"p{i}", node_name=f"n{i % 3}", requests={"cpu": "1"}) for i in range(5)])
    return cluster


@pytest.fixture
def kubeconfig(cluster, tmp_path):
    server = FakeApiServer(cluster)
    yield server.kubeconfig(tmp_path / "kubeconfig")
    server.close()


def _in_forked_child(replica: ReplicaState, kubeconfig: str, cluster: Cluster) -> dict:
    """Fork as gunicorn does; in the child, follow the leader until a pod put after the fork
    shows, and report what it saw."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        report = {}
        try:
            os.close(read)
            source = replica.follow(ApiServer.connect(kubeconfig=kubeconfig))
            report["follows"] = isinstance(source, Informer)
            report["ready"] = source.readiness().ready
            if report["follows"]:
                report["saw_late_pod"] = eventually(lambda: "uid-late" in source.state.pods)
                report["cpu_on_n1"] = source.state.usage("n1").requested.get("cpu")
                source.stop()
        finally:
            os.write(write, orjson.dumps(report))
            os._exit(0)
    os.close(write)
    cluster.put("pods", pod("late", node_name="n1", requests={"cpu": "2"}, uid="uid-late"))
    with os.fdopen(read, "rb") as pipe:
        report = orjson.loads(pipe.read())
    os.waitpid(pid, 0)
    return report


def test_a_worker_forked_from_the_leader_lists_nothing_and_watches_on_from_its_state(cluster, kubeconfig):
    leader = Informer(ApiServer.connect(kubeconfig=kubeconfig), FAST).start()
    try:
        assert leader.wait_synced(10)
        replica = ReplicaState(leader).hold_across_forks()
        lists = dict(cluster.lists)
        report = _in_forked_child(replica, kubeconfig, cluster)
        assert replica.forked_resumable
        assert report == {"follows": True, "ready": True, "saw_late_pod": True, "cpu_on_n1": 4000}
        assert cluster.lists == lists  # the child listed nothing
        assert converged(leader, cluster)  # and the leader goes on in the master
    finally:
        leader.stop()


def test_a_worker_forked_while_the_leader_lists_waits_not_ready(cluster, kubeconfig):
    cluster.list_delay = 2.0
    leader = Informer(ApiServer.connect(kubeconfig=kubeconfig), FAST).start()
    try:
        replica = ReplicaState(leader)
        source = replica.follow(ApiServer.connect(kubeconfig=kubeconfig))
        assert isinstance(source, AwaitingLeader)
        readiness = source.readiness()
        assert not readiness.ready and "not synced yet" in readiness.reason
        with source.reading() as view:
            assert view.state is None and "not synced yet" in view.unavailable
    finally:
        leader.stop()


def test_a_leader_in_the_middle_of_a_relist_cannot_be_followed(cluster, kubeconfig):
    leader = Informer(ApiServer.connect(kubeconfig=kubeconfig), FAST).start()
    try:
        assert leader.wait_synced(10) and leader.resumable
        leader.versions.pop("pods")  # what ``_list`` does from its first page
        assert not leader.resumable
        assert Informer.following(ApiServer.connect(kubeconfig=kubeconfig), leader) is None
    finally:
        leader.stop()


def _fork_and_reap() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def test_what_a_fork_left_its_child_is_known_per_forking_thread(cluster, kubeconfig):
    """gunicorn's loop forks the workers and the periodic audit forks its passes, each from a
    thread of its own: a pass forked just after a worker must not answer for that worker."""
    leader = Informer(ApiServer.connect(kubeconfig=kubeconfig), FAST).start()
    try:
        assert leader.wait_synced(10)
        replica = ReplicaState(leader).hold_across_forks()
        listed = leader.versions.pop("pods")  # a relist under way: a worker forked now has no state
        _fork_and_reap()
        leader.versions["pods"] = listed
        audit = threading.Thread(target=_fork_and_reap)
        audit.start()
        audit.join()
        assert not replica.forked_resumable
    finally:
        leader.stop()


# -- Renewal: which worker the master forks again, and when -----------------------------------


@dataclass
class FakeLeader:
    resumable: bool = True
    events: int = 0


@dataclass
class FakeReplica:
    leader: FakeLeader = field(default_factory=FakeLeader)


@dataclass
class FakeArbiter:
    """What ``Renewal.step`` uses of gunicorn's Arbiter; ``manage`` plays its worker count."""

    WORKERS: dict[int, object] = field(default_factory=lambda: {101: object(), 102: object()})
    num_workers: int = 2
    killed: list[tuple[int, int]] = field(default_factory=list)
    next_pid: int = 200

    def kill_worker(self, pid: int, sig: int) -> None:
        self.killed.append((pid, sig))

    def manage(self) -> None:
        while len(self.WORKERS) < self.num_workers:
            self.next_pid += 1
            self.WORKERS[self.next_pid] = object()


def _renewal(**kwargs) -> Renewal:
    return Renewal(FakeReplica(), **kwargs)  # type: ignore[arg-type]


def test_a_worker_forked_before_the_leader_synced_is_retired_before_its_fresh_one_beside_another():
    """It has no state to serve with, and holds as its own what the leader wrote since its
    fork: a third worker beside it and the leader's newly listed state was the replica's peak."""
    renewal, arbiter = _renewal(), FakeArbiter()
    renewal.forked(101, resumable=False)
    renewal.forked(102, resumable=True)
    renewal.step(arbiter, now=0.0)
    assert arbiter.killed == [(101, signal.SIGTERM)] and arbiter.num_workers == 2
    arbiter.manage()
    assert set(arbiter.WORKERS) == {101, 102}  # no fresh one while it is still there
    renewal.step(arbiter, now=0.5)
    del arbiter.WORKERS[101]  # it exited
    renewal.step(arbiter, now=1.0)
    arbiter.manage()
    assert arbiter.num_workers == 2 and set(arbiter.WORKERS) == {102, 201}
    renewal.step(arbiter, now=1.6)
    assert renewal.old is None and renewal.renewals == 1  # 102 followed the leader: kept


def test_workers_forked_before_the_leader_synced_are_retired_together_and_renewed_one_at_a_time():
    """None of them can serve, and each holds as its own what the leader wrote since its fork:
    one beside a fresh one was the replica's peak. The second fresh one is forked once the
    first had time to listen and the leader caught up on the watch backlog: forked earlier,
    it applies the backlog itself, into pages of its own."""
    renewal, arbiter = _renewal(), FakeArbiter()
    leader = renewal.replica.leader
    renewal.forked(101, resumable=False)
    renewal.forked(102, resumable=False)
    renewal.step(arbiter, now=0.0)
    assert sorted(arbiter.killed) == [(101, signal.SIGTERM), (102, signal.SIGTERM)]
    assert arbiter.num_workers == 1
    del arbiter.WORKERS[101]  # it exited; 102 is still exiting
    renewal.step(arbiter, now=0.5)
    arbiter.manage()
    assert set(arbiter.WORKERS) == {102}  # no fresh one beside an old one
    del arbiter.WORKERS[102]
    renewal.step(arbiter, now=1.0)
    arbiter.manage()
    assert set(arbiter.WORKERS) == {201}
    for now, applied in ((1.5, 10), (2.1, 20_000), (3.1, 20_000)):
        leader.events += applied
        renewal.step(arbiter, now=now)
        arbiter.manage()
        assert set(arbiter.WORKERS) == {201}, now  # too soon to listen, then the backlog
    leader.events += 40
    renewal.step(arbiter, now=4.1)
    arbiter.manage()
    assert arbiter.num_workers == 2 and set(arbiter.WORKERS) == {201, 202}
    renewal.step(arbiter, now=4.2)
    assert arbiter.num_workers == 2 and len(arbiter.killed) == 2 and renewal.renewals == 2


def test_the_fresh_workers_wait_for_a_busy_leader_only_so_long():
    renewal, arbiter = _renewal(), FakeArbiter()
    renewal.forked(101, resumable=False)
    renewal.forked(102, resumable=False)
    renewal.step(arbiter, now=0.0)
    arbiter.WORKERS.clear()
    renewal.step(arbiter, now=0.1)
    arbiter.manage()
    for second in range(1, 31):
        renewal.replica.leader.events += 5_000
        renewal.step(arbiter, now=0.1 + second)
        arbiter.manage()
    assert arbiter.num_workers == 2 and len(arbiter.WORKERS) == 2


def test_a_lone_worker_forked_before_the_leader_synced_is_renewed_fresh_one_first():
    renewal, arbiter = _renewal(), FakeArbiter({101: object()}, num_workers=1)
    renewal.forked(101, resumable=False)
    renewal.step(arbiter, now=0.0)
    arbiter.manage()
    assert arbiter.num_workers == 2 and set(arbiter.WORKERS) == {101, 201}  # the fresh one forked
    renewal.step(arbiter, now=0.1)
    renewal.step(arbiter, now=0.5)
    assert arbiter.killed == []  # it has not had time to listen
    renewal.step(arbiter, now=1.2)
    assert arbiter.killed == [(101, signal.SIGTERM)]
    del arbiter.WORKERS[101]  # it exited
    renewal.step(arbiter, now=1.5)
    assert arbiter.num_workers == 1 and set(arbiter.WORKERS) == {201}
    renewal.step(arbiter, now=1.6)
    assert renewal.old is None and renewal.renewals == 1


def test_no_worker_is_renewed_while_the_leader_cannot_be_followed():
    renewal, arbiter = _renewal(), FakeArbiter()
    renewal.replica.leader.resumable = False
    renewal.forked(101, resumable=False)
    renewal.step(arbiter, now=0.0)
    assert arbiter.num_workers == 2 and renewal.old is None


def test_the_worker_furthest_over_its_memory_budget_is_renewed_one_at_a_time(monkeypatch):
    private = {101: 80 * MIB, 102: 120 * MIB, 201: 90 * MIB}
    monkeypatch.setattr(replica_module, "private_bytes", lambda pid: private.get(pid, 0))
    renewal, arbiter = _renewal(budget=64 * MIB), FakeArbiter()
    renewal.step(arbiter, now=0.0)
    assert renewal.old == 102 and arbiter.num_workers == 3
    arbiter.manage()
    for now in (0.1, 1.2):
        renewal.step(arbiter, now=now)
    del arbiter.WORKERS[102]
    renewal.step(arbiter, now=1.3)
    assert arbiter.num_workers == 2
    renewal.step(arbiter, now=20.0)
    assert renewal.old is None  # 101 is over too, but renewals are spaced
    private[201] = 10 * MIB  # the fresh one
    renewal.step(arbiter, now=32.0)
    assert renewal.old == 101


def test_a_leader_that_wrote_past_the_budget_since_the_fork_has_its_oldest_worker_renewed(monkeypatch):
    """What the leader writes after a fork (watch events, its periodic audit) it copies: the
    workers keep the pages as they were, shared among themselves, so no worker's memory is its
    own. The leader's private memory tells: the worker forked longest ago is renewed, and the
    fresh one shares the leader's pages."""
    private = {101: 10 * MIB, 102: 10 * MIB, os.getpid(): 200 * MIB}
    monkeypatch.setattr(replica_module, "private_bytes", lambda pid: private.get(pid, 0))
    renewal, arbiter = _renewal(budget=64 * MIB), FakeArbiter()
    renewal.forked(102, resumable=True)
    renewal.forked(101, resumable=True)
    renewal.step(arbiter, now=0.0)
    assert renewal.old == 102 and arbiter.num_workers == 3


def test_a_worker_within_its_budget_is_kept(monkeypatch):
    monkeypatch.setattr(replica_module, "private_bytes", lambda pid: 10 * MIB)
    renewal, arbiter = _renewal(budget=64 * MIB), FakeArbiter()
    for now in (0.0, 11.0, 22.0):
        renewal.step(arbiter, now=now)
    assert renewal.old is None and arbiter.num_workers == 2 and renewal.renewals == 0


def test_a_worker_that_dies_while_renewed_ends_the_renewal_without_a_kill():
    renewal, arbiter = _renewal(), FakeArbiter({101: object()}, num_workers=1)
    renewal.forked(101, resumable=False)
    renewal.step(arbiter, now=0.0)
    arbiter.manage()
    del arbiter.WORKERS[101]  # crashed before the fresh one settled
    renewal.step(arbiter, now=0.2)
    assert arbiter.killed == [] and arbiter.num_workers == 1 and renewal.old is None


def test_private_bytes_reads_this_process_and_is_zero_for_a_process_gone():
    assert replica_module.private_bytes(os.getpid()) > MIB
    assert replica_module.private_bytes(2**22 + 1) == 0
