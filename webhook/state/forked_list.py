"""The replica's first pod list, fetched and decoded in a child process, filed by the parent.

At 65,000 nodes / 1.3 M pods the replica's start-up is its pod list, and in one process all of
it ran on one core: the HTTP reads, the typed decode of each page, each pod's record, and its
filing in the state. A child forked for the list (``child_process``) does the first three on
the other core and sends each page as rows of plain values (``marshal``: the fastest format to
load, and a string interned in the child is interned in the parent), with the requests, ports
and NUMA footprint of each derivation once; the parent builds each ``PodRecord`` from its row
and files it, as ``ClusterState.set_pod`` always has.

The state is the one the list in the parent would build: a row is the record the child read
(``listed_pods.listed_fields``), and a page the child cannot carry as rows goes whole, for the
parent to read as its own list would (``apiserver.page_of``):

- a page that does not decode typed, or holds a pod ``listed_pods.pod_page`` keeps whole (a
  pending pod, a pod the storm breakers read);
- once a page with a Failed pod went whole, every page with a Running pod: the breakers are the
  parent's, and only the Failed pods of this list can open one meanwhile (the pod watch starts
  after the list), whereupon the parent reads Running pods too.

A page too large to be read whole ends the child, and the parent lists the rest itself (streamed).
Only the first list is forked: the state is empty then, and the fork costs nothing. Forked for a
relist, the child would keep the old state's pages while the parent rewrote them: the replica's
memory would double for the length of the list.
"""

from __future__ import annotations

import contextlib
import fcntl
import gc
import marshal
import os
import pickle
import select
import struct
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

from ..kube.errors import FieldError
from .apiserver import ApiError, ApiServer, Page, page_of
from .child_process import end, forked
from .listed_pods import ListedPod, listed_fields, listed_key, listed_phase, page_token, pod_page
from .model import PodRecord
from .storm import StormBreakers

_RESOURCE = "pods"
_HEADER = struct.Struct("<I")  # each frame: its length, then its pickle
_PIPE_BYTES = 1 << 20  # the child may run a few pages ahead of the parent
_DERIVATIONS = 65_536  # derivations the child names before it starts afresh (bounded memory)


@dataclass(frozen=True, slots=True)
class Unlisted:
    """A pod of a forked list that files no record: a terminal one (``field`` empty), or one
    whose fields could not be read (``pod_record``'s ``FieldError``)."""

    key: str
    field: str = ""
    message: str = ""

    def record(self) -> None:
        """None for a terminal pod; raises the field's error for an unreadable one."""
        if self.field:
            raise FieldError(self.field, self.message)


# -- the parent ---------------------------------------------------------------------------------


def forked_pages(
    api: ApiServer,
    page_size: int,
    storm: StormBreakers | None,
    stopped: threading.Event,
    timeout: float,
) -> Generator[Page, None, str | None]:
    """The pages of a pod list read by a child; their items are ``PodRecord`` and ``Unlisted``,
    or pods as ``listed_pods.pod_page`` reads them. Returns None once the list is whole, else the
    continue token from which the caller lists the rest itself.

    Raises ``ApiError`` for what failed the child's list (its status, its message), or where the
    child sent nothing for ``timeout`` seconds or ended part way; gives up once ``stopped``."""
    pid, read = forked(lambda out: _list_in_child(api, page_size, storm, out))
    with contextlib.suppress(OSError):  # a pipe bigger than the default 64 KiB, where allowed
        fcntl.fcntl(read, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
    frames, alive = _Frames(read, stopped, timeout), True
    try:
        derivations: dict[int, tuple] = {}
        while True:
            frame = frames.next()
            if frame is None:
                alive = False
                raise ApiError(0, "list pods: the process listing them ended part way")
            kind, ends, *payload = frame
            if kind == "rows":
                rows, named, afresh, version, following = payload
                if afresh:
                    derivations.clear()
                derivations.update(named)
                yield Page(_items(rows, derivations), version, following)
            elif kind == "page":
                page = page_of(_RESOURCE, payload[0], lambda body: pod_page(body, storm))
                yield page
                following = page.continue_token
            elif kind == "rest":
                return payload[0]
            else:
                raise ApiError(*payload)
            if not following:
                return None
            if ends:
                return following
    finally:
        os.close(read)
        # Alive: the parent gave up on it, or it is on its way out (its last frame was read).
        end(pid, kill=alive and not frames.last)


class _Frames:
    """The frames a child writes to ``fd``, read as they come; ``last`` once the final one is."""

    def __init__(self, fd: int, stopped: threading.Event, timeout: float) -> None:
        self.fd, self.stopped, self.timeout = fd, stopped, timeout
        self.last = False

    def next(self) -> tuple | None:
        """The next frame; None where the child closed its pipe first."""
        header = self._exactly(_HEADER.size)
        if header is None:
            return None
        data = self._exactly(_HEADER.unpack(header)[0])
        if data is None:
            return None
        frame = pickle.loads(data)
        self.last = frame[1]  # the child sends nothing after it
        return frame

    def _exactly(self, size: int) -> bytes | None:
        chunks, left = [], size
        deadline = time.monotonic() + self.timeout
        while left:
            if self.stopped.is_set():
                raise ApiError(0, "list pods: stopped")
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise ApiError(0, f"list pods: its process sent nothing for {self.timeout:.0f} s")
            if not select.select([self.fd], [], [], min(wait, 0.5))[0]:
                continue
            chunk = os.read(self.fd, left)
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


def _items(rows: bytes, derivations: dict[int, tuple]) -> list[PodRecord | Unlisted]:
    items: list[PodRecord | Unlisted] = []
    for row in marshal.loads(rows):
        items.append(_record(row, derivations) if len(row) == 8 else Unlisted(*row))
    return items


def _row(fields: tuple, derivation: int) -> tuple:
    """A bound pod's record (its ``model.record_fields``) as plain values; ``derivation`` names
    its requests, ports and footprint. ``_record`` reads it back."""
    key, node, _, _, scheduler, priority, critical, _, name, _, ident = fields
    return (key, node, derivation, scheduler, priority, critical, name, ident)


def _record(row: tuple, derivations: dict[int, tuple]) -> PodRecord:
    key, node, derivation, scheduler, priority, critical, name, ident = row
    requests, host_ports, numa = derivations[derivation]
    return PodRecord(key, node, requests, host_ports, scheduler, priority, critical, None, name, numa, ident)


# -- the child ----------------------------------------------------------------------------------


def _list_in_child(api: ApiServer, page_size: int, storm: StormBreakers | None, out: int) -> None:
    """The child's job: every frame of the list, then its exit (``child_process.forked``)."""
    gc.disable()  # what it builds has no cycles, and a collection would touch the parent's pages
    try:
        for frame in _frames(api.fresh(), page_size, storm):
            _send(out, frame)
    except BrokenPipeError:
        return  # the parent gave up
    except Exception as err:  # every failure reaches the parent, which retries the list
        status, message = (err.status, err.message) if isinstance(err, ApiError) else (0, repr(err))
        with contextlib.suppress(OSError):
            _send(out, ("failed", True, status, message))


def _send(out: int, frame: tuple) -> None:
    data = pickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL)
    for part in (_HEADER.pack(len(data)), data):
        view = memoryview(part)
        while view:
            view = view[os.write(out, view) :]


def _frames(api: ApiServer, page_size: int, storm: StormBreakers | None) -> Iterator[tuple]:
    """The list's frames, each ``(kind, ends, ...)``: a page as rows, a page whole, or where the
    parent takes over; ``ends`` where the child sends nothing after it."""

    def fetch(token: str) -> tuple[str, bytes | None, Page | None]:
        body = api.page_body(_RESOURCE, page_size, token)
        return token, body, None if body is None else pod_page(body, storm)

    derivations = _Derivations()
    failed_seen = False  # a Failed pod went whole: the parent's breakers may count
    fetched = fetch("")
    while True:
        token, body, page = fetched
        if body is None:
            yield ("rest", True, token)
            return
        following = page.continue_token if page is not None else page_token(body)
        if page is None or _whole(page, storm, failed_seen):
            if storm is not None and (page is None or any(map(_failed, page.items))):
                failed_seen = True
            yield ("page", not following, body)
        else:
            afresh = derivations.start_page()
            rows = [_pod_row(pod, derivations) for pod in page.items]
            yield ("rows", not following, marshal.dumps(rows), derivations.take_new(), afresh,
                   page.resource_version, following)  # fmt: skip
        if not following:
            return
        fetched = fetch(following)


def _pod_row(pod: ListedPod, derivations: _Derivations) -> tuple:
    try:
        fields = listed_fields(pod)
    except FieldError as err:
        return (listed_key(pod), err.field, err.message)
    if fields is None:
        return (listed_key(pod),)
    return _row(fields, derivations.id_of(fields))


class _Derivations:
    """Names each derivation (the requests, ports and footprint records share: ``derived_once``)
    once, by the identity of its requests, and keeps what it named until the parent has it."""

    def __init__(self) -> None:
        self._ids: dict[int, int] = {}
        self._kept: list[Any] = []  # the requests named: their identities stay theirs
        self._new: list[tuple[int, tuple]] = []

    def start_page(self) -> bool:
        """Before a page's rows: whether the names start afresh (for the parent to forget the
        old ones, as the child has), which they do past ``_DERIVATIONS``."""
        if len(self._ids) < _DERIVATIONS:
            return False
        self._ids.clear()
        self._kept.clear()
        return True

    def id_of(self, fields: tuple) -> int:
        """The name of a record's derivation (its ``model.record_fields``)."""
        requests, host_ports, numa = fields[2], fields[3], fields[9]
        derivation = self._ids.get(id(requests))
        if derivation is None:
            derivation = self._ids[id(requests)] = len(self._ids)
            self._kept.append(requests)
            self._new.append((derivation, (requests, host_ports, numa)))
        return derivation

    def take_new(self) -> list[tuple[int, tuple]]:
        new, self._new = self._new, []
        return new


def _whole(page: Page, storm: StormBreakers | None, failed_seen: bool) -> bool:
    """Whether the parent reads this page itself (see the module's docstring)."""
    if any(isinstance(item, dict) for item in page.items):
        return True
    return storm is not None and failed_seen and any(listed_phase(pod) == "Running" for pod in page.items)


def _failed(item: ListedPod | dict[str, Any]) -> bool:
    if isinstance(item, dict):
        status = item.get("status")
        return isinstance(status, dict) and status.get("phase") == "Failed"
    return listed_phase(item) == "Failed"
