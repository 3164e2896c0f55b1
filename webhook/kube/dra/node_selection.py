"""Where a slice's devices are, or a claim's allocation may be used: node names, node
selectors and "all nodes", parsed once per distinct input and shared."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ..errors import MAPPING, FieldError
from ..selectors import node_selector_terms_match
from .fields import _boolean, _intern, _mappings, _string

Requirement = tuple[str, str, tuple[str, ...]]  # key, operator, values
_SHARED_MAX = 16_384  # distinct inputs remembered per kind: a cluster has a few per node type
_SHARED_KEY_BYTES = 2048  # larger inputs are parsed every time, never kept
_selectors: dict[str, NodeSelector] = {}


def _shared(cache: dict[str, Any], inputs: object, parse: Callable[[], Any]) -> Any:
    """``parse()``, once per distinct JSON of ``inputs`` (everything ``parse`` reads): the
    devices of every node of a type, and the node selectors of a node's claims, are one object.
    Errors are never cached; inputs that are not plain JSON are parsed every time."""
    try:
        # As a str: orjson's bytes keep a 4 KiB buffer whatever their length.
        key = orjson.dumps(inputs).decode()
    except TypeError:  # orjson.JSONEncodeError
        return parse()
    found = cache.get(key)
    if found is None:
        found = parse()
        if len(key) <= _SHARED_KEY_BYTES:
            if len(cache) >= _SHARED_MAX:
                cache.clear()
            cache[key] = found
    return found


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    match_expressions: tuple[Requirement, ...]
    match_fields: tuple[Requirement, ...]

    def as_mapping(self) -> dict[str, Any]:
        def listed(requirements):
            return [{"key": k, "operator": o, "values": list(v)} for k, o, v in requirements]

        return {"matchExpressions": listed(self.match_expressions), "matchFields": listed(self.match_fields)}


@dataclass(frozen=True, slots=True)
class NodeSelector:
    """A ``v1.NodeSelector``; equal selectors are one shared object (every claim of a node
    carries the same one)."""

    terms: tuple[NodeSelectorTerm, ...]

    def matches(self, labels: Mapping[str, str], node_name: str) -> bool:
        """Whether a node is selected (``nodeaffinity.NodeSelector.Match``)."""
        return node_selector_terms_match([t.as_mapping() for t in self.terms], labels, node_name)


def node_selector(raw: object, field: str) -> NodeSelector | None:
    if raw is None:
        return None
    return _shared(_selectors, raw, lambda: _node_selector(raw, field))


def _node_selector(raw: object, field: str) -> NodeSelector:
    if not isinstance(raw, MAPPING):
        raise FieldError(field, "must be a mapping")
    terms = []
    for i, term in enumerate(_mappings(raw, "nodeSelectorTerms", f"{field}.nodeSelectorTerms")):
        where = f"{field}.nodeSelectorTerms[{i}]"
        terms.append(
            NodeSelectorTerm(
                _requirements(term, "matchExpressions", f"{where}.matchExpressions"),
                _requirements(term, "matchFields", f"{where}.matchFields"),
            )
        )
    return NodeSelector(tuple(terms))


def _requirements(term: Mapping[str, Any], key: str, field: str) -> tuple[Requirement, ...]:
    found = []
    for i, requirement in enumerate(_mappings(term, key, field)):
        values = requirement.get("values") or []
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise FieldError(f"{field}[{i}].values", "must be a list of strings")
        found.append(
            (
                _string(requirement, "key", f"{field}[{i}].key"),
                _string(requirement, "operator", f"{field}[{i}].operator"),
                tuple(_intern(v) for v in values),
            )
        )
    return tuple(found)


@dataclass(frozen=True, slots=True)
class NodeSelection:
    """Where devices are usable: exactly one of the three is set on a valid object."""

    node_name: str = ""
    all_nodes: bool = False
    node_selector: NodeSelector | None = None


def _node_selection(obj: Mapping[str, Any], field: str) -> NodeSelection | None:
    name = _string(obj, "nodeName", f"{field}.nodeName", required=False)
    all_nodes = _boolean(obj, "allNodes", f"{field}.allNodes")
    selector = node_selector(obj.get("nodeSelector"), f"{field}.nodeSelector")
    if not (name or all_nodes or selector):
        return None
    return NodeSelection(name, all_nodes, selector)
