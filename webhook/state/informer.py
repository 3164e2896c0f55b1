"""Live cluster state: list, then watch, nodes and pods, applied incrementally to ClusterState.

One thread per resource follows the client-go reflector: a paginated list, then a watch from
the list's resourceVersion with bookmarks. A server-side watch timeout simply re-watches;
disconnects, stalls and unreadable lines re-watch from the last resourceVersion seen (the API
server replays what came after it) with capped, jittered backoff. ``410 Gone`` and an event
over ``MAX_EVENT_BYTES`` relist: at once the first time, then with a backoff of its own that
doubles up to ``relist_backoff_cap`` and starts again once a list has stood for
``relist_reset`` seconds, because a relist costs the API server a full list and this process
a rebuild of every record (a 410 storm without it listed 715 times in 16 s). Meanwhile the
state is that of the last list: readiness holds while it is younger than ``max_age``.
Every change goes through ``ClusterState``'s own methods, the same code paths as snapshots,
under the lock admission reads hold. An optional resource (DeviceTaintRules, alpha) that the
cluster does not serve, a 404, is said once and skipped: readiness stops waiting for it.
"""

from __future__ import annotations

import itertools
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import orjson

from ..kube.dra import claim_key
from ..kube.errors import FieldError
from . import waiting
from .apiserver import (
    DRA_GROUP_VERSION,
    MAX_EVENT_BYTES,
    RESOURCES,
    ApiError,
    ApiServer,
    EventTooLarge,
    Page,
    page_of,
    watch_lines,
)
from .devices import DeviceIndex
from .forked_list import Unlisted, forked_pages
from .gc_pause import collector_paused, freeze_survivors
from .listed_pods import ListedPod, listed_key, listed_record, pod_event, pod_page
from .model import ClusterState, PodRecord, node_from, object_key, pod_record
from .source import Readiness, StateView
from .storm import StormBreakers
from .topology import topology_from

log = logging.getLogger(__name__)
GONE = 410
NOT_FOUND = 404


class _Relist(Exception):
    """The watch cannot resume from our resourceVersion (or past an event): list again."""


@dataclass(frozen=True, slots=True)
class Timing:
    page_size: int = 500
    watch_timeout: int = 300  # seconds the API server keeps one watch open (jittered up to 2x)
    read_timeout: float = 120.0  # no byte (not even a bookmark) for this long: the stream stalled
    backoff_base: float = 0.5
    # Short: readiness must come back within seconds of the API server's return. A failing
    # server sees one request per kind and worker every few seconds, jittered.
    backoff_cap: float = 5.0
    max_age: float = 300.0  # older state than this is not trusted for node checks
    # Relists after the first in a row wait 1, 2, 4 ... 30 s (each jittered down to half): a
    # 410 storm lists a few times a minute, and the state, as fresh as its last list, stays
    # well inside ``max_age``. client-go's reflector backs off 0.8 s to 30 s the same way.
    relist_backoff_base: float = 1.0
    relist_backoff_cap: float = 30.0
    relist_reset: float = 120.0  # a list that stood this long (watched) ends the streak


@dataclass(slots=True)
class RelistBackoff:
    """How long to wait before the next relist of one resource.

    The first relist after a list that stood for ``reset`` seconds is immediate (one compaction
    costs nothing extra); each further one in the streak doubles the wait from ``base`` up to
    ``cap``, drawn between half the ceiling and the ceiling, so a storm cannot list faster than
    the ceilings add up to and workers that relist together drift apart.
    """

    base: float
    cap: float
    reset: float
    streak: int = 0
    listed_at: float | None = None

    def listed(self, now: float) -> None:
        self.listed_at = now

    def delay(self, now: float, rng: random.Random | None = None) -> float:
        if self.listed_at is not None and now - self.listed_at >= self.reset:
            self.streak = 0
        self.streak += 1
        if self.streak == 1:
            return 0.0
        ceiling = min(self.cap, self.base * 2 ** min(self.streak - 2, 32))
        return (rng or random).uniform(ceiling / 2, ceiling)


@dataclass(frozen=True, slots=True)
class _Kind:
    """How one resource maps onto ClusterState: its key, and how to set or remove it.

    ``unserved``, where set, makes the resource optional: what a cluster that answers 404 for
    it leaves out (said once in the log); readiness then no longer waits for it.
    """

    name: str
    key: Callable[[dict], str]
    build: Callable[[dict], Any]
    store: Callable[[str, Any], None]
    drop: Callable[[str], None]
    present: Callable[[], list[str]]
    unserved: str = ""
    # How a whole list page, and a watch event (its type, object and resourceVersion), are read
    # where not as parsed JSON (None: they are parsed).
    decode: Callable[[bytes], Page | None] | None = None
    decode_event: Callable[[bytes], tuple[str, Any, str | None] | None] | None = None
    # How a page's objects are set (or, built as None, removed) at once, where not one by one.
    store_page: Callable[[list[tuple[str, Any]]], None] | None = None

    def not_served(self, err: Exception) -> bool:
        """The cluster does not serve this optional resource (a 404 on its list or watch)."""
        return bool(self.unserved) and isinstance(err, ApiError) and err.status == NOT_FOUND


def _kinds(state: ClusterState) -> tuple[_Kind, ...]:
    kinds = (
        _Kind(
            "nodes",
            key=lambda obj: str((obj.get("metadata") or {}).get("name") or ""),
            build=node_from,
            store=lambda key, node: state.set_node(node),
            drop=state.remove_node,
            present=lambda: list(state.nodes),
        ),
        _Kind(
            "pods",
            key=_pod_key,
            build=_live_pod_record,
            store=state.set_pod,
            store_page=state.set_pods,
            drop=state.remove_pod,
            present=lambda: list(state.pods),
            decode=lambda body: pod_page(body, state.storm),
            decode_event=lambda line: pod_event(line, state.storm),
        ),
    )
    topologies = _Kind(
        "noderesourcetopologies",
        key=lambda obj: str((obj.get("metadata") or {}).get("name") or ""),
        build=topology_from,
        store=state.set_topology,
        drop=lambda name: state.set_topology(name, None),
        present=lambda: list(state.topologies),
        unserved="the topology manager's admission is not predicted (no NodeResourceTopology exporter)",
    )
    kinds = (*kinds, topologies)
    return kinds if state.devices is None else (*kinds, *_device_kinds(state.devices))


def _device_kinds(index: DeviceIndex) -> tuple[_Kind, ...]:
    """DRA: the objects go into the device index whole (it reads only what it keeps)."""

    def named(obj: dict) -> str:
        return str((obj.get("metadata") or {}).get("name") or "")

    def kind(name: str, key, store, drop, present, unserved: str = "") -> _Kind:
        return _Kind(
            name, key=key, build=lambda obj: obj, store=store, drop=drop, present=present, unserved=unserved
        )

    return (
        kind(
            "resourceslices",
            named,
            lambda _, obj: index.set_slice(obj),
            index.remove_slice,
            index.slice_names,
        ),
        kind(
            "resourceclaims",
            claim_key,
            lambda _, obj: index.set_claim(obj),
            index.delete_claim_key,
            index.claim_keys,
        ),
        kind(
            "deviceclasses",
            named,
            lambda _, obj: index.set_device_class(obj),
            index.remove_device_class,
            index.class_names,
        ),
        kind(
            "devicetaintrules",
            named,
            lambda _, obj: index.set_taint_rule(obj),
            index.remove_taint_rule,
            index.taint_rule_names,
            unserved="DeviceTaintRules are not applied to allocations",
        ),
    )


class Informer:
    """Keeps a ``ClusterState`` current from the API server; a ``StateSource`` for the server."""

    def __init__(
        self,
        api: ApiServer,
        timing: Timing | None = None,
        storm: StormBreakers | None = None,
        *,
        fork_first_list: bool = False,
    ) -> None:
        self.api = api
        # The first pod list in a child process (``forked_list``): the replica's start-up.
        self.fork_first_list = fork_first_list
        self.timing = timing or Timing()
        self.max_event_bytes = MAX_EVENT_BYTES
        self.state = ClusterState(storm)
        self.lock = threading.Lock()
        self.relists = 0
        self.events = 0
        self.skipped = 0  # objects whose fields could not be read (logged, left out)
        self.oversized_events = 0  # watch events over max_event_bytes (each a watch error and a relist)
        self._synced: set[str] = set()
        # Nodes and pods, plus the DRA kinds where served; an optional kind leaves on a 404.
        self._required = frozenset({"nodes", "pods"})
        # Per kind, the monotonic time of its last list page, event or bookmark: a dead node
        # watch must not hide behind a busy pod watch.
        self._heard: dict[str, float] = {}
        self._heard_wall: float | None = None
        self._stop = threading.Event()
        self._responses: dict[str, Any] = {}
        self._failures: dict[str, int] = {}  # consecutive failures per kind, for the backoff
        self._threads: list[threading.Thread] = []
        # Per kind, the resourceVersion the state holds: where a watch resumes, and where an
        # informer forked from this one starts (``following``). Absent while a kind is listed.
        self.versions: dict[str, str] = {}

    @classmethod
    def following(cls, api: ApiServer, leader: Informer) -> Informer | None:
        """In a process forked from ``leader``'s: an informer over the leader's state as the
        fork left it (its pages shared copy-on-write), watching from the leader's
        resourceVersions, so it lists nothing. None when the leader had not listed every kind
        (a fork in the middle of a list): that state cannot be resumed.

        The leader's lock may have been held by the fork (``serve.replica``): this informer
        guards the state with a lock of its own.
        """
        if not leader.resumable:
            return None
        follower = cls(api, leader.timing)
        follower.state = leader.state
        follower._required = leader._required
        follower._synced = set(leader._required)
        follower._heard = dict(leader._heard)
        follower._heard_wall = leader._heard_wall
        follower.versions = {name: leader.versions[name] for name in leader._required}
        kinds = _kinds(follower.state)  # less the kinds the leader found unserved
        return follower._watch_kinds(kind for kind in kinds if kind.name in follower._required)

    # -- the StateSource protocol -------------------------------------------------------

    @contextmanager
    def reading(self) -> Iterator[StateView]:
        problem = self._unavailable()
        if problem is not None:
            yield StateView(None, problem)
            return
        waiting.acquire(self.lock)  # an event loop's decision goes to a pool thread instead
        try:
            yield StateView(self.state)
        finally:
            self.lock.release()

    def readiness(self) -> Readiness:
        """Ready only while node checks would trust the state: synced and not too old."""
        problem = self._unavailable()
        # Without the lock: the counts are a gauge's, and a worker's event loop asks for them
        # after a review it answered (``serve/app.py``), where it must not wait for a list.
        state = self.state
        nodes, pods = len(state.nodes), len(state.pods)
        reason = problem or "nodes and pods listed and watched"
        return Readiness(problem is None, reason, nodes, pods, self._heard_wall, self.relists)

    def close(self) -> None:
        self.stop()

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        return self._synced >= self._required

    @property
    def resumable(self) -> bool:
        """Whether the state is of one resourceVersion per kind: synced, and no kind in a list."""
        return self.synced and all(name in self.versions for name in self._required)

    def start(self) -> Informer:
        self._discover_devices()
        kinds = _kinds(self.state)
        self._required = frozenset(kind.name for kind in kinds)  # an unserved one leaves on a 404
        return self._watch_kinds(kinds)

    def _watch_kinds(self, kinds: Iterable[_Kind]) -> Informer:
        """A thread per kind: list it unless its resourceVersion is known, then watch."""
        for kind in kinds:
            thread = threading.Thread(
                target=self._run, args=(kind,), name=f"informer-{kind.name}", daemon=True
            )
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        for response in list(self._responses.values()):
            _interrupt(response)
        for thread in self._threads:
            thread.join(timeout)

    def list_once(self) -> ClusterState:
        """List nodes and pods (and DRA objects, where served) once, without watching."""
        self._discover_devices()
        for kind in _kinds(self.state):
            try:
                self._list(kind)
            except ApiError as err:
                if not kind.not_served(err):
                    raise
                self._skip(kind)
        return self.state

    def wait_synced(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.synced and time.monotonic() < deadline and not self._stop.is_set():
            time.sleep(0.02)
        return self.synced

    def _discover_devices(self) -> None:
        """DRA state where the cluster serves ``resource.k8s.io/v1``; elsewhere said once, and
        the DRA checks skip (they warn that nothing was checked)."""
        try:
            served = self.api.serves(DRA_GROUP_VERSION)
        except ApiError as err:
            log.warning("DRA checks skipped: discovery of %s failed: %s", DRA_GROUP_VERSION, err)
            return
        if served:
            self.state.devices = DeviceIndex()
            self._required = frozenset(kind.name for kind in _kinds(self.state))
        else:
            log.info("the cluster does not serve %s: DRA checks skipped", DRA_GROUP_VERSION)

    def _unavailable(self) -> str | None:
        if not self.synced:
            missing = sorted(self._required - self._synced)
            return f"the guard has not finished listing {' and '.join(missing)} from the API server"
        now = time.monotonic()
        # A copy: ``_skip`` may remove a kind from another thread meanwhile.
        stalest, heard = min(list(self._heard.items()), key=lambda item: item[1])
        age = now - heard
        if age > self.timing.max_age:
            return (
                f"the guard's cluster state is {age:.0f} s old: nothing heard of {stalest} "
                f"(limit {self.timing.max_age:.0f} s)"
            )
        return None

    # -- list and watch -------------------------------------------------------------------

    def _run(self, kind: _Kind) -> None:
        resource_version = self.versions.get(kind.name, "")
        timing = self.timing
        relists = RelistBackoff(timing.relist_backoff_base, timing.relist_backoff_cap, timing.relist_reset)
        while not self._stop.is_set():
            try:
                if not resource_version:
                    resource_version = self._list(kind)
                    relists.listed(time.monotonic())
                    self._synced.add(kind.name)
                    self._know_topology_age()
                    self._failures[kind.name] = 0
                resource_version = self._watch(kind, resource_version)
            except Exception as err:
                if self._stop.is_set():
                    break
                if kind.not_served(err):
                    self._skip(kind)
                    break
                if isinstance(err, _Relist) or (isinstance(err, ApiError) and err.status == GONE):
                    resource_version = ""
                    self.relists += 1
                    delay = relists.delay(time.monotonic())
                    log.info("watch %s: %s; relisting in %.1f s", kind.name, err, delay)
                else:
                    failures = self._failures[kind.name] = min(self._failures.get(kind.name, 0) + 1, 32)
                    delay = random.uniform(0, min(timing.backoff_cap, timing.backoff_base * 2**failures))
                    log.warning("watch %s: %s; retrying in %.1f s", kind.name, err, delay)
                self._stop.wait(delay)

    def _know_topology_age(self) -> None:
        """Once synced, a pod seen bound from here on is newer than its node's NRT
        (``ClusterState.topology_age_known``). Whichever settles the last required kind says so:
        its list, or an optional kind found unserved after the others were listed (else the
        state would take every later bind as counted by an NRT that never saw it)."""
        if self.synced:
            self.state.topology_age_known = True

    def _skip(self, kind: _Kind) -> None:
        """Stop waiting for a resource the cluster does not serve, and forget what it held (a
        404 after a list means the API server came back without it)."""
        log.info("the cluster does not serve %s: %s", RESOURCES[kind.name], kind.unserved)
        self._required = self._required - {kind.name}
        self._know_topology_age()
        self._heard.pop(kind.name, None)
        with self.lock:
            for key in kind.present():
                kind.drop(key)

    def _list(self, kind: _Kind) -> str:
        """A full paginated list, applied in batches of a page; what it did not return is removed.

        A page is applied as it is read, so a relist holds the state and one page of objects at
        a time, even from a server that ignores ``limit`` and sends everything at once.
        """
        with self.lock:
            # Only a relist can leave something behind to remove: the first list's keys (1.3 M
            # of them at 65,000 nodes: 5% of the start-up, a 64 MiB set) are not kept.
            seen: set[str] | None = set() if kind.present() else None
        resource_version = ""
        self.versions.pop(kind.name, None)  # from the first page on, the state is of no one version
        for page in self._pages(kind):
            # The page's objects die before the collector runs again, and the records they become
            # are frozen: scanned, they would be promoted, and the collector would scan the whole
            # state dozens of times per list.
            with collector_paused():
                for batch in _batches(page.items, self.timing.page_size):
                    self._apply_listed(kind, batch, seen)
                    self._touch(kind)
                resource_version = resource_version or page.resource_version
                last = page.resource_version
                del page
                freeze_survivors()
            self._touch(kind)
        with self.lock:
            if seen is not None:
                for key in [k for k in kind.present() if k not in seen]:
                    kind.drop(key)
            version = self.versions[kind.name] = last or resource_version
        return version

    def _pages(self, kind: _Kind) -> Iterator[Page]:
        """The pages of one list, in order: the first pod list in a child process where the
        informer forks it (``forked_list``), up to where the child hands the rest over."""
        token: str | None = ""
        if self.fork_first_list and kind.name == "pods" and kind.name not in self._synced:
            timing = self.timing
            token = yield from forked_pages(
                self.api, timing.page_size, self.state.storm, self._stop, timing.read_timeout
            )
        if token is not None:
            yield from self._fetched_pages(kind, token)

    def _fetched_pages(self, kind: _Kind, token: str) -> Iterator[Page]:
        """The pages of one list from ``token`` on. A page read whole names the next one: its
        body is requested while this one is applied, so the API server's time and the socket's
        reads overlap the building of records (a streamed page names it only once read). It is
        decoded once this one is applied: a pod page's decode reads the storm breakers that
        this page's Failed pods may open. A body too large to be read whole is asked for again,
        to be streamed."""
        size = self.timing.page_size

        def fetch(token: str) -> Page:
            return self.api.list_page(kind.name, size, token, decode=kind.decode)

        page = fetch(token)
        while True:
            following = page.continue_token if _names_next(page) else ""
            ahead = _Ahead(self.api.page_body, kind.name, size, following) if following else None
            yield page
            if not page.continue_token:
                return
            body = ahead.result() if ahead is not None else None
            page = fetch(page.continue_token) if body is None else page_of(kind.name, body, kind.decode)

    def _apply_listed(self, kind: _Kind, objects: list[Any], seen: set[str] | None) -> None:
        if kind.name == "pods" and self.state.storm is not None:
            for obj in filter(_storm_reads, objects):
                self.state.storm.observe(obj, None, time.time())  # listed: at its creation time
        # A forked list's records (most of a big cluster's pods) are filed as they come.
        built = [
            (obj.key, obj) if type(obj) is PodRecord else (kind.key(obj), self._build(kind, obj))
            for obj in objects
        ]
        with self.lock:
            if seen is not None:
                seen.update([key for key, _ in built])
            if kind.store_page is not None:
                kind.store_page(built)
                return
            for key, value in built:
                self._set(kind, key, value)

    def _watch(self, kind: _Kind, resource_version: str) -> str:
        """Apply events until the server ends the watch; return the last resourceVersion."""
        timeout = int(self.timing.watch_timeout * random.uniform(1.0, 2.0))
        response = self.api.watch(kind.name, resource_version, timeout, self.timing.read_timeout)
        self._failures[kind.name] = 0  # the server answers again: the next failure starts small
        self._responses[kind.name] = response
        try:
            for line in watch_lines(response, self.max_event_bytes):
                if self._stop.is_set():
                    break
                resource_version = self._apply(kind, line) or resource_version
        except orjson.JSONDecodeError as err:
            raise ValueError(f"unreadable watch event: {err}") from None
        except EventTooLarge as err:
            # Watching again from the same resourceVersion would replay the same event: only a
            # list moves past it (and a Kubernetes object is never that large).
            self.oversized_events += 1
            log.warning("watch %s: %s after resourceVersion %s", kind.name, err, resource_version)
            raise _Relist(str(err)) from None
        finally:
            self._responses.pop(kind.name, None)
            _close(response)
        return resource_version

    def _apply(self, kind: _Kind, line: bytes) -> str | None:
        decoded = kind.decode_event(line) if kind.decode_event is not None else None
        if decoded is not None:
            kind_of_event, obj, resource_version = decoded
        else:
            kind_of_event, obj, resource_version = _parsed_event(line)
        if kind_of_event == "ADDED" or kind_of_event == "MODIFIED":
            if kind.name == "pods" and self.state.storm is not None and _storm_reads(obj):
                self.state.storm.observe(obj, time.time())  # first seen Failed: now
            key, value = kind.key(obj), self._build(kind, obj)
            with self.lock:
                self._set(kind, key, value)
        elif kind_of_event == "DELETED":
            key = kind.key(obj)
            with self.lock:
                kind.drop(key)
        elif kind_of_event != "BOOKMARK":
            raise ValueError(f"unknown watch event type {kind_of_event!r}")
        self.events += kind_of_event != "BOOKMARK"
        self._touch(kind)
        if not resource_version:
            return None
        # Set after the event is applied: a fork in between resumes one event early, and
        # applying an event twice leaves the state as once.
        version = self.versions[kind.name] = str(resource_version)
        return version

    def _build(self, kind: _Kind, obj: dict[str, Any]):
        try:
            return kind.build(obj)
        except FieldError as err:
            self.skipped += 1
            log.warning("%s %s left out of the state: %s", kind.name, kind.key(obj), err)
            return None

    @staticmethod
    def _set(kind: _Kind, key: str, value) -> None:
        if value is None:
            kind.drop(key)  # terminal pods and unreadable objects hold nothing
        else:
            kind.store(key, value)

    def _touch(self, kind: _Kind) -> None:
        self._heard[kind.name] = time.monotonic()
        self._heard_wall = time.time()


def _parsed_event(line: bytes) -> tuple[Any, dict[str, Any], Any]:
    """A watch event parsed as JSON: its type, object and resourceVersion; an ERROR raises."""
    event = orjson.loads(line)
    kind_of_event, obj = event.get("type"), event.get("object")
    if not isinstance(obj, dict):
        raise ValueError(f"watch event without an object: {line[:120]!r}")
    if kind_of_event == "ERROR":
        if obj.get("code") == GONE:
            raise _Relist("resourceVersion too old (410 Gone)")
        raise ApiError(int(obj.get("code") or 0), str(obj.get("message") or "watch error"))
    return kind_of_event, obj, (obj.get("metadata") or {}).get("resourceVersion")


class _Ahead:
    """A call run on a thread of its own from now on; ``result`` waits for it (or raises what
    it raised). A daemon thread, not ``concurrent.futures``' (whose threads the interpreter
    joins at exit): a list abandoned part way leaves its request to end on its own."""

    def __init__(self, call: Callable[..., Any], *args: Any) -> None:
        self._outcome: tuple[bool, Any] = (False, None)

        def run() -> None:
            try:
                self._outcome = (True, call(*args))
            except BaseException as err:  # handed to the caller of ``result``
                self._outcome = (False, err)

        self._thread = threading.Thread(target=run, name="informer-page-ahead", daemon=True)
        self._thread.start()

    def result(self) -> Any:
        self._thread.join()
        done, value = self._outcome
        if not done:
            raise value
        return value


def _names_next(page: Page) -> bool:
    """A page read whole that names another (a streamed one has not read its token yet)."""
    return isinstance(page.items, list) and bool(page.continue_token)


def _batches(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, max(size, 1))):
        yield batch


# A pod as a list page or a watch event gives it: parsed JSON, a typed decode (``listed_pods``),
# or what a forked list built of it (``forked_list``).
_Listed = dict[str, Any] | ListedPod | PodRecord | Unlisted


def _storm_reads(pod: _Listed) -> bool:
    """``StormBreakers.observe`` reads only Failed and Running pods: skip the call for others
    (only dicts can be such: ``listed_pods.pod_page``, ``forked_list``)."""
    if not isinstance(pod, dict):
        return False
    status = pod.get("status")
    return isinstance(status, dict) and status.get("phase") in ("Failed", "Running")


# A forked list's ``PodRecord``s need neither: ``Informer._apply_listed`` files them as they are.
def _pod_key(obj: _Listed) -> str:
    if isinstance(obj, Unlisted):
        return obj.key
    return listed_key(obj) if isinstance(obj, ListedPod) else object_key(obj)


def _live_pod_record(obj: _Listed) -> PodRecord | None:
    if isinstance(obj, Unlisted):
        return obj.record()
    if isinstance(obj, ListedPod):
        return listed_record(obj)
    return pod_record(obj, parsed_json=True)  # orjson's output: requests may be shared


def live_snapshot(api: ApiServer, page_size: int = 500, storm: StormBreakers | None = None) -> ClusterState:
    """One paginated list of nodes and pods, for a dry run against the live cluster."""
    return Informer(api, Timing(page_size=page_size), storm).list_once()


def _interrupt(response) -> None:
    """Wake a thread blocked reading ``response``: shut its socket down (closing the file
    would wait for the reader's lock, i.e. for the next byte from the server)."""
    sock = getattr(getattr(response, "connection", None), "sock", None)
    if sock is not None:
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)


def _close(response) -> None:
    """Close the watch's connection (a stream read part way cannot carry another request),
    and give its slot back to the pool."""
    try:
        response.close()
        response.release_conn()
    except Exception:  # closing a stream another thread is reading may raise; it is closed either way
        pass
