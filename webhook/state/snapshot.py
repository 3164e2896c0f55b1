"""Cluster state from ``kubectl get nodes,pods -A -o yaml|json`` files.

A big cluster's JSON snapshot is streamed item by item (``json_items``), so only compact
records are kept and peak memory stays near the size of the file's text; every other input
is read the ordinary way, with the same records and the same errors.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from ..json_items import NotStreamable
from ..json_items import list_items as json_list_items
from ..kube.errors import FieldError
from ..manifests import Document, Location, ManifestError, list_item, manifest_files, read_documents
from ..yaml_items import list_items as yaml_list_items
from .model import ClusterState, node_from, object_key, pod_record
from .storm import StormBreakers

if TYPE_CHECKING:
    from ..config import StormBreakerConfig

T = TypeVar("T")


class SnapshotError(ValueError):
    """Snapshot files the guard cannot use; ``problems`` lists each with its location."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def load_snapshot(paths: Iterable[str], storm: StormBreakerConfig | None = None) -> ClusterState:
    """Build a ``ClusterState`` from Node and Pod objects; other kinds are ignored.

    With ``storm`` settings, Failed pods are recorded as admission rejections at their
    creation time, in breakers with those settings.
    """
    return read_snapshot(paths, lambda documents: _build(documents, storm))


def read_snapshot(paths: Iterable[str], build: Callable[[Iterable[Document | ManifestError]], T]) -> T:
    """``build`` over the documents of ``paths``: streamed when every file is a JSON ``List``,
    else (``build`` is called again, from scratch) read whole.

    The collector is paused meanwhile: millions of new dicts and records with no cycles make
    its full passes cost as much as the parse itself at 150,000 pods.
    """
    paths = list(paths)
    with collector_paused():
        try:
            return build(_streamed_documents(paths))
        except NotStreamable:
            return build(read_documents(paths))


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a bulk build of acyclic objects."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _build(documents: Iterable[Document | ManifestError], storm: StormBreakerConfig | None) -> ClusterState:
    state = ClusterState(StormBreakers.from_config(storm) if storm is not None else None)
    problems: list[str] = []
    for doc in documents:
        if isinstance(doc, ManifestError):
            problems.append(str(doc))
            continue
        kind = doc.obj["kind"]
        try:
            if kind == "Node":
                state.set_node(node_from(doc.obj))
            elif kind == "Pod":
                if state.storm is not None:
                    state.storm.observe(doc.obj, None)
                state.set_pod(object_key(doc.obj), pod_record(doc.obj))
        except FieldError as err:
            problems.append(f"{doc.location}: {kind}: field {err}")
    if problems:
        raise SnapshotError(problems)
    return state


def _streamed_documents(paths: list[str]) -> Iterator[Document | ManifestError]:
    """Documents of JSON ``List`` files, one item at a time; ``NotStreamable`` for any other file."""
    for path in manifest_files(paths):
        if isinstance(path, ManifestError) or path == "-":
            raise NotStreamable("not a file")
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            raise NotStreamable("unreadable") from None
        items = json_list_items(text) if text.lstrip().startswith("{") else yaml_list_items(text)
        for number, item in enumerate(items, start=1):
            yield list_item(item, Location(path, 1, number))
