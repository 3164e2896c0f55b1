"""Read Kubernetes objects from files, directories and stdin, with errors that say where.

Strict, as kubectl's decoding is: a document that starts with ``{`` is JSON and nothing else
(a trailing comma is an error); anything else is YAML 1.1, read with libyaml. A duplicate
mapping key is an error naming it and its line (kubectl refuses them; silently keeping the
last one would check an object other than the one written, and ``cat a.yaml b.yaml`` without
``---`` would check one object out of two). A file with no objects is an error too. Timestamps
stay strings (Kubernetes keeps ``creationTimestamp`` a string).

Errors say what most likely went wrong: a tab where YAML wants spaces, a Helm template not yet
rendered, a ``kubectl get`` table where objects were expected.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path, PurePath
from typing import Any

import yaml
from yaml.constructor import ConstructorError

_BaseLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
MANIFEST_SUFFIXES = (".yaml", ".yml", ".json")


class StrictLoader(_BaseLoader):  # type: ignore[misc, valid-type]
    """Safe loading, timestamps left as strings, duplicate keys refused."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: set[tuple[str, str]] = set()
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise ConstructorError(
                        None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                    )
                seen.add(key)
        return super().construct_mapping(node, deep)


StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in _BaseLoader.yaml_implicit_resolvers.items()
}
StrictLoader.add_constructor("tag:yaml.org,2002:map", StrictLoader.construct_yaml_map)


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        raise _DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return obj


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_JSON = json.JSONDecoder(object_pairs_hook=_json_object, parse_constant=_no_constant)


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


@dataclass(frozen=True, slots=True)
class Manifests:
    """What a command was told to read: files and directories (``-f``), files of a directory
    left out (``--exclude``), kustomizations to render (``-k``), and the namespace of objects
    that name none (``-n``: ``explicit`` when given, as kubectl then refuses other namespaces)."""

    paths: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    kustomizations: tuple[str, ...] = ()
    namespace: str = "default"
    explicit_namespace: bool = False


def manifest_files(paths: Iterable[str], exclude: tuple[str, ...] = ()) -> Iterator[str | ManifestError]:
    """Expand directories (recursively, sorted) to their YAML/JSON files; ``-`` is stdin.
    A file under a directory is left out when a glob of ``exclude`` matches its path below
    that directory, its name, or the name of a directory on the way."""
    for path in paths:
        p = Path(path)
        if path == "-" or not p.is_dir():
            yield path
            continue
        found = sorted(
            f
            for f in p.rglob("*")
            if f.is_file() and f.suffix in MANIFEST_SUFFIXES and not excluded(f.relative_to(p), exclude)
        )
        if not found:
            what = "no .yaml, .yml or .json files" + (" left after --exclude" if exclude else "")
            yield ManifestError(Location(path), f"directory holds {what}")
        yield from (str(f) for f in found)


def excluded(relative: PurePath, globs: tuple[str, ...]) -> bool:
    text = relative.as_posix()
    return any(
        fnmatchcase(text, glob) or any(fnmatchcase(part, glob) for part in relative.parts) for glob in globs
    )


def read_documents(paths: Iterable[str] | Manifests) -> Iterator[Document | ManifestError]:
    """Every object in ``paths``; items of ``List`` kinds are yielded one by one."""
    source = paths if isinstance(paths, Manifests) else Manifests(tuple(paths))
    for path in manifest_files(source.paths, source.exclude):
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
    for directory in source.kustomizations:
        from .kustomize import KustomizeError, render

        try:
            text = render(directory)
        except KustomizeError as err:
            yield ManifestError(Location(directory), str(err))
            continue
        yield from documents_in(text, f"{directory} (kubectl kustomize)")


_TABLE = re.compile(r"\s*(?:NAMESPACE|NAME)[ \t]{2,}\S")  # the header of a ``kubectl get`` table
TEMPLATE = re.compile(r"\{\{.*?\}\}")  # a Helm (Go template) expression
HELM_HINT = (
    "an unrendered Helm template: render the chart first ('helm template RELEASE CHART') and check its output"
)


def documents_in(text: str, source: str) -> Iterator[Document | ManifestError]:
    """Parse one file's text: JSON when it starts with ``{`` (as kubectl decides), else YAML."""
    if _TABLE.match(text):
        yield ManifestError(
            Location(source), "a 'kubectl get' table, not objects: take it with -o yaml or -o json"
        )
        return
    empty = True
    for item in _parsed(text, source):
        empty = False
        yield item
    if empty:
        yield ManifestError(Location(source), "no objects (the file is empty or holds only '---')")


def _parsed(text: str, source: str) -> Iterator[Document | ManifestError]:
    if text.lstrip().startswith("{"):
        try:
            obj = _JSON.decode(text)
        except _DuplicateKey as err:
            problem = f"duplicate key {err.key!r}{_near(text, err.key)}"
            yield ManifestError(Location(source, 1), f"invalid JSON: {problem}")
            return
        except ValueError as err:
            yield ManifestError(Location(source, 1), f"invalid JSON: {_json_problem(err)}")
            return
        except RecursionError:
            yield ManifestError(Location(source, 1), "invalid JSON: nested too deeply")
            return
        yield from _objects(obj, Location(source, 1))
        return
    number = 0
    try:
        for number, raw in enumerate(yaml.load_all(text, Loader=StrictLoader), start=1):
            yield from _objects(raw, Location(source, number))
    except yaml.YAMLError as err:
        problem = yaml_problem(err, text)
        yield ManifestError(Location(source, number + 1), f"invalid YAML: {problem}")
    except RecursionError:
        yield ManifestError(Location(source, number + 1), "invalid YAML: nested too deeply")


def _json_problem(err: ValueError) -> str:
    if isinstance(err, json.JSONDecodeError):
        return f"{err.msg} (line {err.lineno}, column {err.colno})"
    return str(err)


def _near(text: str, key: str) -> str:
    """The line of the key's second appearance: where the duplicate most likely is."""
    hits = [m.start() for m in re.finditer(re.escape(json.dumps(key)) + r"\s*:", text)]
    return f" (line {text.count(chr(10), 0, hits[1]) + 1})" if len(hits) > 1 else ""


def yaml_problem(err: yaml.YAMLError, text: str = "") -> str:
    """The parser's problem and where; with ``text``, what most likely caused it: a tab, or a
    template expression YAML cannot read (``name: {{ .Release.Name }}``)."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err)
    if mark is None:
        return problem
    where = f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    lines = text.splitlines()
    line = lines[mark.line] if mark.line < len(lines) else ""
    if "'\\t'" in problem or "\t" in line:
        return f"{where}: a tab character; YAML indents with spaces only"
    if _second_object(problem, mark.column):
        return f"{where}: a second object with no '---' line before it (files joined without a separator?)"
    template = TEMPLATE.search(text)
    if template is not None:
        at = text.count("\n", 0, template.start()) + 1
        return f"{where}: {template.group()!r} on line {at} is {HELM_HINT}"
    return where


_STARTS_AN_OBJECT = ("duplicate key 'apiVersion'", "duplicate key 'kind'")


def _second_object(problem: str, column: int) -> bool:
    """A top-level ``apiVersion`` or ``kind`` seen twice is, nearly always, the next object of a
    concatenation (``cat a.yaml b.yaml``) that lacks the ``---`` between them."""
    return column == 0 and problem.startswith(_STARTS_AN_OBJECT)


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
