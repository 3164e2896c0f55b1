"""The replica's first pod list, forked to a child process, files exactly the state the list in
process files: the same records, sums, device holders, unreadable pods and storm breakers, and
every failure of the child's list fails the list."""

from __future__ import annotations

import json
import os
import pickle
import threading
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.builders import node, pod
from tests.helpers.fake_apiserver import Cluster, FakeApiServer, Fault
from tests.helpers.informer import converged, eventually
from tests.helpers.pod_shapes import pods
from tests.helpers.storm import owned, rejected
from webhook.kube.errors import FieldError
from webhook.state import forked_list
from webhook.state import informer as informer_module
from webhook.state.apiserver import WHOLE_PAGE_BYTES, ApiError, ApiServer, _streamed_page, page_of
from webhook.state.forked_list import Unlisted, _record, _row
from webhook.state.informer import Informer, Timing, _kinds
from webhook.state.listed_pods import listed_fields, pod_page
from webhook.state.model import PodRecord
from webhook.state.storm import StormBreakers


class Pages(ApiServer):
    """A list served from memory, one body per page (tokens ``p1``, ``p2``, ...): the child
    reads it as its copy of this object, the parent as itself. ``fail`` maps a token to what
    the child's request for it does instead."""

    def __init__(self, bodies: list[bytes], whole_page_bytes: int = WHOLE_PAGE_BYTES, fail=None) -> None:
        self.bodies = {("" if i == 0 else f"p{i}"): body for i, body in enumerate(bodies)}
        self.whole_page_bytes = whole_page_bytes
        self.fail = fail or {}
        self.asked: list[str] = []  # the pages the parent asked for itself

    def fresh(self) -> Pages:
        return self

    def page_body(
        self, resource: str, limit: int, continue_token: str = "", timeout: float = 60
    ) -> bytes | None:
        if continue_token in self.fail:
            self.fail[continue_token]()
        body = self.bodies[continue_token]
        return None if len(body) > self.whole_page_bytes else body

    def list_page(self, resource, limit, continue_token="", timeout=60, decode=None):
        self.asked.append(continue_token)
        body = self.bodies[continue_token]
        if len(body) > self.whole_page_bytes:
            return _streamed_page(resource, [body], (block for block in ()))
        return page_of(resource, body, decode)


def bodies(listed: list[Any], per_page: int) -> list[bytes]:
    chunks = [listed[i : i + per_page] for i in range(0, len(listed), per_page)] or [[]]
    made = []
    for i, chunk in enumerate(chunks):
        metadata = {"resourceVersion": "42", **({"continue": f"p{i + 1}"} if i + 1 < len(chunks) else {})}
        made.append(json.dumps({"kind": "PodList", "metadata": metadata, "items": chunk}).encode())
    return made


def listed(
    api: ApiServer, *, fork: bool, storm: StormBreakers | None = None, timeout: float = 30
) -> Informer:
    informer = Informer(api, Timing(page_size=3, read_timeout=timeout), storm, fork_first_list=fork)
    informer._list(next(kind for kind in _kinds(informer.state) if kind.name == "pods"))
    return informer


def held(informer: Informer) -> tuple:
    """Everything a list leaves in the informer and its state."""
    state = informer.state
    usage = {
        name: (u.requested, dict(u.pods), dict(u.host_ports), list(u.unaccounted))
        for name, u in state._usage.items()
    }
    breakers = None
    if state.storm is not None:
        breakers = {
            o: (b.state, b.total, list(b.seen), b.running_at) for o, b in state.storm.breakers.items()
        }
    return (
        state.pods,
        usage,
        state._node_devices,
        state._pending_names,
        informer.skipped,
        informer.versions,
        breakers,
    )


def both(pages: list[bytes], storm: bool = False, **api: Any) -> tuple[tuple, tuple]:
    """What the list in process, then the forked list, leave of the same pages (a breaker, with
    ``storm``, trips at the first rejection)."""
    in_process, forked = (
        held(listed(Pages(pages, **api), fork=fork, storm=StormBreakers(threshold=1) if storm else None))
        for fork in (False, True)
    )
    return in_process, forked


def keyed(listed_pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Distinct uids where a pod has metadata, as a list's pods have."""
    for i, obj in enumerate(listed_pods):
        if isinstance(obj.get("metadata"), dict):
            obj["metadata"]["uid"] = f"uid-{i}"
    return listed_pods


# -- the same state -----------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(pods(), min_size=0, max_size=12).map(keyed), st.integers(1, 4), st.booleans())
def test_a_forked_list_files_what_the_list_in_process_files(listed_pods, per_page, storm):
    in_process, forked = both(bodies(listed_pods, per_page), storm=storm)
    assert forked == in_process


def gpu_pod(i: int, **kwargs) -> dict[str, Any]:
    return pod(f"p{i}", node_name=f"n{i % 3}", requests={"cpu": "1", "nvidia.com/gpu": str(i % 2)}, **kwargs)


def test_a_forked_list_of_real_shapes_files_records_sums_and_device_holders():
    listed_pods = [gpu_pod(i, scheduler="volcano" if i > 10 else None) for i in range(20)]
    listed_pods[3]["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    listed_pods[5]["status"] = {"phase": "Succeeded"}
    listed_pods[7]["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "lots"
    in_process, forked = both(bodies(listed_pods, 3))
    assert forked == in_process
    records, _, devices, _, skipped, versions, _ = forked
    assert len(records) == 18 and skipped == 1 and versions == {"pods": "42"}
    assert devices["n1"]["nvidia.com/gpu"] == {"default-scheduler": 1, "volcano": 2}  # p1; p13, p19


def test_once_a_failed_pod_may_have_opened_a_breaker_running_pods_are_read_by_the_parent():
    # Page 1 counts a rejection of the owner; the parent's breaker then notes the Running pod of
    # page 2 only where the parent reads that pod (the child's copy of the breakers is stale).
    listed_pods = [rejected("r0", created="2026-11-27T00:00:00Z"), owned("x", node_name="gpu-1")]
    listed_pods[1]["status"] = {"phase": "Running"}
    listed_pods[1]["metadata"]["creationTimestamp"] = "2026-11-27T00:00:01Z"
    in_process, forked = both(bodies(listed_pods, 1), storm=True)
    assert forked == in_process
    ((_, total, seen, running_at),) = in_process[-1].values()
    assert (total, seen) == (1, ["uid-r0"]) and running_at > 0


def test_a_page_too_large_to_read_whole_hands_the_rest_of_the_list_to_the_parent():
    listed_pods = [gpu_pod(i) for i in range(9)]
    for obj in listed_pods[3:6]:
        obj["metadata"]["annotations"] = {"note": "x" * 1000}
    pages = bodies(listed_pods, 3)
    big = len(pages[1]) - 1  # the second page is over the limit: read streamed, by the parent
    api = Pages(pages, whole_page_bytes=big)
    forked = held(listed(api, fork=True))
    assert api.asked == ["p1", "p2"]
    assert forked == held(listed(Pages(pages, whole_page_bytes=big), fork=False))


def test_derivations_named_afresh_part_way_read_as_before(monkeypatch):
    monkeypatch.setattr(forked_list, "_DERIVATIONS", 2)  # the child is forked with this bound
    listed_pods = [pod(f"p{i}", node_name="n", requests={"cpu": f"{i + 1}"}, uid=f"u{i}") for i in range(12)]
    in_process, forked = both(bodies(listed_pods, 2))
    assert forked == in_process and len(forked[0]) == 12


def test_a_row_reads_back_as_the_record_it_was_made_of():
    obj = gpu_pod(1, priority=2_000_000_000)
    obj["spec"]["containers"][0]["ports"] = [{"containerPort": 80, "hostPort": 8080}]
    (listed_pod,) = pod_page(bodies([obj], 1)[0], None).items
    fields = listed_fields(listed_pod)
    record = PodRecord(*fields)
    assert record.name and record.host_ports and record.critical and record.ident  # nothing left default
    derivation = pickle.loads(pickle.dumps((record.requests, record.host_ports, record.numa)))
    assert _record(_row(fields, 7), {7: derivation}) == record


def test_an_unlisted_pod_files_nothing_or_raises_its_field_error():
    assert Unlisted("uid-1").record() is None
    with pytest.raises(FieldError, match=r"spec.containers\[0\].resources.requests.cpu: bad"):
        Unlisted("uid-1", "spec.containers[0].resources.requests.cpu", "bad").record()


# -- the child's failures fail the list ---------------------------------------------------------


@pytest.fixture
def children(monkeypatch) -> list[int]:
    """The pids of the children forked for lists."""
    pids: list[int] = []
    original = forked_list.forked

    def recorded(job):
        pid, read = original(job)
        pids.append(pid)
        return pid, read

    monkeypatch.setattr(forked_list, "forked", recorded)
    return pids


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def expired() -> None:
    raise ApiError(410, "the provided continue parameter is too old")


def test_an_api_error_of_the_childs_list_fails_the_list_with_its_status(children):
    api = Pages(bodies([gpu_pod(i) for i in range(9)], 3), fail={"p1": expired})
    with pytest.raises(ApiError) as raised:
        listed(api, fork=True)
    assert raised.value.status == 410 and "continue parameter is too old" in str(raised.value)
    assert gone(children[0])


def test_a_child_that_ends_part_way_fails_the_list(children):
    api = Pages(bodies([gpu_pod(i) for i in range(9)], 3), fail={"p2": lambda: os._exit(0)})
    with pytest.raises(ApiError, match="ended part way"):
        listed(api, fork=True)
    assert gone(children[0])


def test_a_child_that_sends_nothing_in_time_is_killed_and_fails_the_list(children):
    api = Pages(bodies([gpu_pod(i) for i in range(9)], 3), fail={"p1": lambda: time.sleep(60)})
    started = time.monotonic()
    with pytest.raises(ApiError, match="sent nothing for 1 s"):
        listed(api, fork=True, timeout=1.0)
    assert time.monotonic() - started < 10
    assert gone(children[0])


def test_a_stopped_informer_leaves_its_childs_list_at_once(children):
    api = Pages(bodies([gpu_pod(i) for i in range(9)], 3), fail={"p1": lambda: time.sleep(60)})
    informer = Informer(api, Timing(page_size=3), fork_first_list=True)
    threading.Timer(0.3, informer._stop.set).start()
    started = time.monotonic()
    with pytest.raises(ApiError, match="stopped"):
        informer._list(next(kind for kind in _kinds(informer.state) if kind.name == "pods"))
    assert time.monotonic() - started < 5
    assert gone(children[0])


# -- live: only the first list is forked ---------------------------------------------------------


def test_only_the_first_pod_list_is_forked_a_relist_runs_in_process(tmp_path, monkeypatch):
    forks = []
    monkeypatch.setattr(
        informer_module, "forked_pages", lambda *args: forks.append(args) or forked_list.forked_pages(*args)
    )
    cluster = Cluster(bookmark_every=0.2)
    cluster.load("nodes", [node(f"n{i}") for i in range(3)])
    cluster.load("pods", [gpu_pod(i) for i in range(7)])
    server = FakeApiServer(cluster)
    api = ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))
    informer = Informer(api, Timing(page_size=2, read_timeout=5.0, backoff_base=0.02), fork_first_list=True)
    try:
        assert informer.start().wait_synced(10)
        assert converged(informer, cluster)
        cluster.inject("pods", Fault("gone"))
        cluster.end_watches()
        cluster.put("pods", gpu_pod(8))
        assert eventually(lambda: informer.relists >= 1)
        assert converged(informer, cluster)
        assert len(forks) == 1
    finally:
        informer.stop()
        server.close()
