"""Read Kubernetes objects from files, directories and stdin, with errors that say where.

YAML is parsed with the C loader when available and without YAML 1.1 timestamps (Kubernetes
keeps ``creationTimestamp`` a string); JSON goes through orjson, which is several times faster
for the large ``kubectl get -o json`` snapshots.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml

_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


class _Loader(_BaseLoader):  # type: ignore[misc, valid-type]
    """Safe loading, with timestamps left as strings."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in _BaseLoader.yaml_implicit_resolvers.items()
}


@dataclass(frozen=True, slots=True)
class Location:
    """File, 1-based document number, and 1-based item number inside a List."""

    file: str
    document: int | None = None
    item: int | None = None

    def __str__(self) -> str:
        where = self.file
        if self.document is not None:
            where += f": document {self.document}"
        if self.item is not None:
            where += f", item {self.item}"
        return where


@dataclass(frozen=True, slots=True)
class Document:
    location: Location
    obj: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ManifestError:
    """Input the guard cannot read; yielded in place of a document so reading goes on."""

    location: Location
    message: str

    def __str__(self) -> str:
        return f"{self.location}: {self.message}"


def manifest_files(paths: Iterable[str]) -> Iterator[str | ManifestError]:
    """Expand directories (recursively, sorted) to their YAML/JSON files; ``-`` is stdin."""
    for path in paths:
        p = Path(path)
        if path == "-" or not p.is_dir():
            yield path
            continue
        found = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in MANIFEST_SUFFIXES)
        if not found:
            yield ManifestError(Location(path), "directory holds no .yaml, .yml or .json files")
        yield from (str(f) for f in found)


def read_documents(paths: Iterable[str]) -> Iterator[Document | ManifestError]:
    """Every object in ``paths``; items of ``List`` kinds are yielded one by one."""
    for path in manifest_files(paths):
        if isinstance(path, ManifestError):
            yield path
            continue
        try:
            text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) else "not UTF-8 text"
            yield ManifestError(Location(path), f"cannot read: {reason}")
            continue
        yield from documents_in(text, "<stdin>" if path == "-" else path)


def documents_in(text: str, source: str) -> Iterator[Document | ManifestError]:
    """Parse one file's text; JSON when it looks like JSON, YAML otherwise."""
    if text.lstrip().startswith(("{", "[")):
        try:
            raw_docs: Iterable[Any] = [orjson.loads(text)]
        except orjson.JSONDecodeError:
            raw_docs = _yaml_documents(text)  # YAML flow style also starts with { or [
    else:
        raw_docs = _yaml_documents(text)
    number = 0
    try:
        for number, raw in enumerate(raw_docs, start=1):
            yield from _objects(raw, Location(source, number))
    except yaml.YAMLError as err:
        yield ManifestError(Location(source, number + 1), f"invalid YAML: {_yaml_problem(err)}")


def _yaml_documents(text: str) -> Iterator[Any]:
    return yaml.load_all(text, Loader=_Loader)


def _yaml_problem(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    if mark is not None:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return problem


def _objects(raw: Any, where: Location) -> Iterator[Document | ManifestError]:
    if raw is None:
        return  # an empty document, e.g. a trailing '---'
    if not isinstance(raw, Mapping):
        yield ManifestError(where, f"expected a Kubernetes object (a mapping), got {type(raw).__name__}")
        return
    problem = _missing_type(raw)
    if problem:
        yield ManifestError(where, problem)
        return
    items = raw.get("items")
    if raw["kind"].endswith("List") and isinstance(items, list):
        for i, item in enumerate(items, start=1):
            yield list_item(item, Location(where.file, where.document, i))
        return
    yield Document(where, raw)


def list_item(item: Any, at: Location) -> Document | ManifestError:
    """One element of a ``List``'s items: an object, or the error that says why it is not."""
    if not isinstance(item, Mapping) or (problem := _missing_type(item)):
        return ManifestError(at, problem or "expected a Kubernetes object (a mapping)")
    return Document(at, item)


def _missing_type(obj: Mapping[str, Any]) -> str | None:
    for key in ("apiVersion", "kind"):
        if not isinstance(obj.get(key), str) or not obj[key]:
            return f"field {key}: missing or not a string"
    return None
