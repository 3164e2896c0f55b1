"""Required node affinity and nodeSelector (``component-helpers/.../nodeaffinity.go``).
kubelet-admission-spec §5."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import MAPPING

_INT64 = re.compile(r"[+-]?[0-9]+")
_INT64_MAX = 2**63 - 1


def _int64(value: object) -> int | None:
    """Parse like Go's ``strconv.ParseInt(s, 10, 64)``: leading zeros fine, no spaces."""
    if not isinstance(value, str) or not _INT64.fullmatch(value):
        return None
    number = int(value)
    return number if -_INT64_MAX - 1 <= number <= _INT64_MAX else None


def _expression_matches(expr: Any, labels: Mapping[str, str]) -> bool | None:
    """True/False for a usable requirement, None when the requirement is malformed."""
    if not isinstance(expr, MAPPING) or not isinstance(expr.get("key"), str) or not expr["key"]:
        return None
    key, operator = expr["key"], expr.get("operator")
    values = expr.get("values") or []
    if not isinstance(values, list):
        return None
    present = key in labels
    if operator == "In":
        return present and labels[key] in values if values else None
    if operator == "NotIn":
        return (not present or labels[key] not in values) if values else None
    if operator in ("Exists", "DoesNotExist"):
        if values:
            return None
        return present if operator == "Exists" else not present
    if operator in ("Gt", "Lt"):
        if len(values) != 1 or (bound := _int64(values[0])) is None:
            return None
        actual = _int64(labels.get(key)) if present else None
        if actual is None:
            return False
        return actual > bound if operator == "Gt" else actual < bound
    return None


def _field_matches(field: Any, node_name: str) -> bool | None:
    """``matchFields`` allows only ``metadata.name`` with In/NotIn and exactly one value."""
    if not isinstance(field, MAPPING) or field.get("key") != "metadata.name":
        return None
    values = field.get("values")
    if not isinstance(values, list) or len(values) != 1:
        return None
    if field.get("operator") == "In":
        return node_name == values[0]
    if field.get("operator") == "NotIn":
        return node_name != values[0]
    return None


def _term_matches(term: Any, labels: Mapping[str, str], node_name: str) -> bool:
    if not isinstance(term, MAPPING):
        return False
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not isinstance(expressions, list) or not isinstance(fields, list):
        return False
    results = [_expression_matches(e, labels) for e in expressions]
    results += [_field_matches(f, node_name) for f in fields]
    # A malformed requirement (None) makes the whole term unusable.
    return all(r is True for r in results)


def is_empty_term(term: Any) -> bool:
    """Terms with neither matchExpressions nor matchFields are dropped by the matcher."""
    return not (isinstance(term, MAPPING) and (term.get("matchExpressions") or term.get("matchFields")))


def node_selector_terms_match(terms: Any, labels: Mapping[str, str], node_name: str) -> bool:
    """OR over the non-empty terms; no usable term means no match."""
    if not isinstance(terms, list):
        return False
    return any(_term_matches(t, labels, node_name) for t in terms if not is_empty_term(t))


def required_node_affinity(spec: Mapping[str, Any]) -> Mapping[str, Any] | None:
    affinity = spec.get("affinity")
    node_affinity = affinity.get("nodeAffinity") if isinstance(affinity, MAPPING) else None
    if not isinstance(node_affinity, MAPPING):
        return None
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    return required if isinstance(required, MAPPING) else None


def matches_node_selector_and_affinity(
    spec: Mapping[str, Any], labels: Mapping[str, str], node_name: str
) -> bool:
    """``spec.nodeSelector`` AND required node affinity, as the kubelet's filter checks them."""
    selector = spec.get("nodeSelector") or {}
    if isinstance(selector, MAPPING) and any(k not in labels or labels[k] != v for k, v in selector.items()):
        return False
    required = required_node_affinity(spec)
    if required is None:
        return True
    return node_selector_terms_match(required.get("nodeSelectorTerms"), labels, node_name)


# -- label selectors (``metav1.LabelSelector``): the node pools of device owners ----------------

LABEL_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """``matchLabels`` AND every ``matchExpressions`` requirement (In, NotIn, Exists,
    DoesNotExist), as ``metav1.LabelSelectorAsSelector`` reads them; already validated."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()  # (key, operator, values)

    def matches(self, labels: Mapping[str, str]) -> bool:
        if any(labels.get(key) != value for key, value in self.match_labels):
            return False
        return all(_requirement(key, op, values, labels) for key, op, values in self.match_expressions)

    def excludes(self, wanted: Mapping[str, str]) -> bool:
        """Whether no node with the labels ``wanted`` (a pod's nodeSelector) can match: the pool
        is out of the pod's reach, whatever else its nodes carry."""
        for key, value in self.match_labels:
            if key in wanted and wanted[key] != value:
                return True
        return any(
            key in wanted and not _requirement(key, op, values, wanted)
            for key, op, values in self.match_expressions
        )

    def implied_by(self, wanted: Mapping[str, str]) -> bool:
        """Whether every node with the labels ``wanted`` matches: all the pod's nodes are in the pool."""
        if any(wanted.get(key) != value for key, value in self.match_labels):
            return False
        return all(
            op != "DoesNotExist" and key in wanted and _requirement(key, op, values, wanted)
            for key, op, values in self.match_expressions
        )

    def __str__(self) -> str:
        parts = [f"{key}={value}" for key, value in self.match_labels]
        for key, op, values in self.match_expressions:
            if op in ("In", "NotIn"):
                parts.append(f"{key} {op.lower()} ({', '.join(values)})")
            else:
                parts.append(key if op == "Exists" else f"!{key}")
        return ",".join(parts) or "every node"


def _requirement(key: str, operator: str, values: tuple[str, ...], labels: Mapping[str, str]) -> bool:
    if operator == "In":
        return labels.get(key) in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    return key not in labels
