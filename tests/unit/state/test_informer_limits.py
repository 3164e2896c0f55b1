"""The informer under a misbehaving API server: relists back off, and neither a 410 storm, an
oversized watch event nor a list that ignores ``limit`` can take unbounded time or memory."""

from __future__ import annotations

import random
import time
import tracemalloc
from types import SimpleNamespace

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers.builders import node, pod
from tests.helpers.fake_apiserver import Cluster, FakeApiServer, Fault
from tests.helpers.informer import Reads, chunked, converged, eventually
from webhook.state.apiserver import MAX_EVENT_BYTES, ApiServer, EventTooLarge, watch_lines
from webhook.state.informer import Informer, RelistBackoff, Timing
from webhook.state.list_body import UnreadableList, list_items

STORMY = Timing(
    page_size=2,
    watch_timeout=3,
    read_timeout=1.0,
    backoff_base=0.02,
    backoff_cap=0.2,
    max_age=30,
    relist_backoff_base=0.4,
    relist_backoff_cap=4.0,
)


@pytest.fixture
def cluster():
    cluster = Cluster(bookmark_every=0.2)
    cluster.load("nodes", [node(f"n{i}", cpu="4", pods="10") for i in range(3)])
    cluster.load("pods", [pod(f"p{i}", node_name=f"n{i % 3}", requests={"cpu": "100m"}) for i in range(5)])
    return cluster


@pytest.fixture
def api(cluster, tmp_path):
    server = FakeApiServer(cluster)
    yield ApiServer.connect(kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"))
    server.close()


@pytest.fixture
def informer(api):
    informer = Informer(api, STORMY).start()
    assert informer.wait_synced(10)
    yield informer
    informer.stop()


# -- relist backoff ------------------------------------------------------------------------


def test_the_first_relist_is_immediate_and_each_further_one_doubles_its_wait_up_to_the_cap():
    backoff = RelistBackoff(base=1.0, cap=8.0, reset=120.0)
    backoff.listed(0.0)
    rng = random.Random(7)
    delays = [backoff.delay(1.0, rng) for _ in range(7)]
    assert delays[0] == 0
    for delay, ceiling in zip(delays[1:], [1, 2, 4, 8, 8, 8], strict=True):
        assert ceiling / 2 <= delay <= ceiling  # jittered, never below half the ceiling


def test_a_list_that_stood_for_the_reset_time_ends_the_relist_streak():
    backoff = RelistBackoff(base=1.0, cap=8.0, reset=120.0)
    backoff.listed(0.0)
    assert [backoff.delay(10.0) > 0 for _ in range(3)] == [False, True, True]
    backoff.listed(10.0)
    assert backoff.delay(50.0) > 0  # a list that stood 40 s: still the same storm
    backoff.listed(60.0)
    assert backoff.delay(180.0) == 0  # watched for two minutes: healthy again


@pytest.mark.parametrize("gone", ["event", "status"])
def test_a_410_storm_lists_a_few_times_and_the_informer_stays_ready(informer, cluster, gone):
    """Every watch answers 410: the informer relists with a growing wait, not in a loop, and
    /readyz stays 200 on the state of its last list (younger than max_age), counting relists."""
    lists = dict(cluster.lists)
    cluster.gone_watches = gone
    cluster.end_watches()
    time.sleep(2.0)
    storm = {resource: cluster.lists[resource] - lists[resource] for resource in ("nodes", "pods")}
    assert 2 <= storm["pods"] <= 6 and 2 <= storm["nodes"] <= 6, storm
    readiness = informer.readiness()
    assert readiness.ready and readiness.relists >= storm["pods"] + storm["nodes"] - 2
    cluster.gone_watches = ""
    cluster.put("pods", pod("after-the-storm", node_name="n1", requests={"cpu": "1"}))
    assert converged(informer, cluster)


# -- watch events: a cap, and linear buffering ----------------------------------------------


def test_an_oversized_event_is_a_watch_error_then_a_relist_and_memory_stays_bounded(informer, cluster):
    relists = informer.relists
    cluster.inject("pods", Fault("oversized", after=1, size=MAX_EVENT_BYTES + 8 * 1024 * 1024))
    cluster.end_watches()
    assert eventually(lambda: not cluster.faults["pods"])  # the next watch has it
    cluster.put("pods", pod("before", node_name="n0", requests={"cpu": "100m"}))
    tracemalloc.start()
    try:
        cluster.put("pods", pod("behind", node_name="n0", requests={"cpu": "100m"}))
        assert eventually(lambda: informer.oversized_events == 1)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MAX_EVENT_BYTES + 4 * 1024 * 1024  # the cap and a few blocks, never the event
    assert eventually(lambda: informer.relists == relists + 1)
    cluster.put("pods", pod("after", node_name="n2", requests={"cpu": "100m"}))
    assert converged(informer, cluster)
    assert {"uid-before", "uid-behind", "uid-after"} <= set(informer.state.pods)


def chunked_response(*reads: bytes):
    """What ``watch_lines`` reads: a chunked response whose socket file returns ``reads``."""
    return SimpleNamespace(headers={}, chunked=True, _fp=SimpleNamespace(fp=Reads(*reads)))


def test_an_event_over_the_cap_is_refused_as_soon_as_the_cap_is_passed():
    body = chunked(b"a" * 1000 + b"\n", b"b" * 600, b"b" * 600, b"b" * 600 + b"\n", b"c\n")
    pieces = [body[i : i + 100] for i in range(0, len(body), 100)]
    response = chunked_response(*pieces)
    lines = watch_lines(response, max_event=1000)
    assert next(lines) == b"a" * 1000  # exactly the cap: legal
    with pytest.raises(EventTooLarge):
        next(lines)
    assert len(response._fp.fp.pieces) > 5  # it stopped reading: the rest was never buffered


@pytest.mark.parametrize("layout", ["many chunks", "one chunk in many reads"])
def test_a_large_legal_event_in_small_pieces_is_read_in_linear_time(layout):
    event = b'{"type":"MODIFIED","object":{"data":"' + b"x" * (12 * 1024 * 1024) + b'"}}\n'
    if layout == "many chunks":
        reads = [b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces_of(event, 1024)]
        reads.append(b"0\r\n\r\n")
    else:
        reads = pieces_of(chunked(event), 512)
    started = time.monotonic()
    assert list(watch_lines(chunked_response(*reads))) == [event[:-1]]
    assert time.monotonic() - started < 3  # copying what came before at each read took ~15 s


def pieces_of(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


# -- lists that ignore limit ----------------------------------------------------------------


def test_a_list_that_ignores_limit_is_applied_item_by_item_with_one_page_of_memory(cluster, api):
    cluster.load("pods", [pod(f"bulk-{i}", node_name="n0", requests={"cpu": "1m"}) for i in range(4000)])
    cluster.ignore_limit = True
    api.whole_page_bytes = 64 * 1024  # the list is ~1.6 MiB: streamed
    informer = Informer(api, Timing(page_size=100))
    informer.list_once()
    tracemalloc.start()
    try:
        informer.list_once()  # a relist: the state is there, the list replaces it
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * 1024 * 1024  # parsed whole, the list alone costs ~12 MiB
    assert cluster.lists["pods"] == 2
    assert converged(informer, cluster)


def list_body(items: list, metadata: dict) -> bytes:
    return orjson.dumps({"kind": "PodList", "apiVersion": "v1", "metadata": metadata, "items": items})


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 1 << 20])
def test_a_streamed_list_reads_what_a_whole_parse_reads_however_the_body_is_cut(size):
    items = [pod(f"p{i}", node_name="n0", requests={"cpu": "1"}, priority=i) for i in range(40)]
    body = list_body(items, {"resourceVersion": "42", "continue": "next"}) + b"\n"
    metadata: dict = {}
    streamed = list(list_items([body[i : i + size] for i in range(0, len(body), size)], metadata, 1 << 20))
    assert streamed == items and metadata == {"resourceVersion": "42", "continue": "next"}


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b'{"kind":"PodList"}',
        b'{"items":[{"a":1},]}',
        b'{"items":[{"a":1}',
        b'{"items":[]} x',
        b'{"items":[{"a":"' + b"x" * 5000 + b'"}]}',
        b'{"items":["\xff"]}',
    ],
)
def test_a_streamed_list_that_is_not_a_list_or_holds_an_item_over_the_cap_is_an_error(body):
    with pytest.raises(UnreadableList):
        list(list_items([body[i : i + 100] for i in range(0, len(body), 100)], {}, 4096))


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.sampled_from([0, 1, 2, 100, 70_000, 200_000]), min_size=1, max_size=6),
    read=st.sampled_from([1, 2, 3, 1000, 65536]),
)
def test_chunks_longer_than_a_read_are_decoded_whatever_the_read_sizes(sizes, read):
    events = [bytes([65 + n % 26]) * size + b"\n" for n, size in enumerate(sizes)]
    body = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    if read < 1000 and len(body) > 100_000:
        read = 1000  # the same cuts, fewer of them
    lines = list(watch_lines(chunked_response(*pieces_of(body, read))))
    assert lines == [e[:-1] for e in events if e.strip()]
