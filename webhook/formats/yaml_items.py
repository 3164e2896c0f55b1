"""The items of a large YAML ``List`` a batch at a time, read by a compiled parser.

``kubectl get nodes,pods -A -o yaml`` of a big cluster is one document: a ``List`` whose
``items`` are written at column 0 (``- apiVersion: v1``), each item's lines indented under its
dash. PyYAML builds that document through a constructor written in Python: seconds per
10,000 pods, and the whole document's nodes at once. Here the text is cut at item boundaries
(a line starting ``- `` at the sequence's column cannot fall inside an item: an item's own
lines are indented deeper), and each batch of items goes through ``yaml_rs`` (Rust), so only a
batch is alive at a time.

``yaml_rs`` reads YAML 1.2; the guard reads YAML 1.1 everywhere else (``manifests``). The two
read a plain scalar differently only when it is a YAML 1.1 boolean (``yes``, ``off``, ``y``),
a base-2/8/16 or sexagesimal number, a number with ``_`` or an exponent, ``.inf``/``.nan``,
``=``, or starts with a tag, an anchor or an alias; keys likewise, and ``<<`` merges. kubectl
quotes every such string, so its snapshots hold none: a text where one appears unquoted, or
that is not one ``List`` in kubectl's layout, or that the parser refuses, raises
``NotStreamable`` and the caller reads it whole with the strict YAML 1.1 reader, so values and
error messages stay exactly those of ``manifests.documents_in``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from .json_items import NotStreamable

try:
    import yaml_rs
except ImportError:  # pragma: no cover - declared in pyproject; a broken install falls back
    yaml_rs = None

BATCH_CHARS = 64 * 1024  # about 50 pods a call: little alive at a time, few calls

# Where a plain scalar YAML 1.1 and YAML 1.2 may read differently can start: booleans
# (y, n, on, off), numbers, .inf, tags, anchors, aliases, complex keys, merges, flow
# collections, and characters YAML reserves.
_FIRST = r"[yYnNoO0-9+.!&*?<=\[{@`%_-]"
# The runs before each capture are possessive (``*+``, ``++``): what follows them cannot start
# with what they consume, so backtracking into them never finds a match, and re-trying each
# line's indentation was two thirds of these scans' time.
_VALUES = re.compile(rf": ++({_FIRST}[^\n]*)")  # block mapping values: the rest of their line
# Scalar entries of block sequences (nested ones too) and flow collections in them.
_ENTRIES = re.compile(r"- +(?:-(?: +|(?=\n)))*((?:[^:\n]|:(?=[^ \n]))*+(?=\n)|[\[{])")
# Block mapping keys: short ones that may be YAML 1.1 booleans, those starting like a
# number, a tag, an anchor or a flow collection (``1:30:`` is the key ``1:30``), empty ones.
_KEYS = re.compile(r"\n[ -]*+([yYnNoO][a-zA-Z]{0,2} *|[0-9+.!&*?<=\[{@`%_][^\n]*?|):(?=[ \n])")
# One candidate a line (a trailing comment allowed): the ones to refuse. A superset is fine:
# it only sends a text to the slower reader.
_AMBIGUOUS = re.compile(
    r"""^[ ]*(?:
    [yYnN]|[yY]es|YES|[nN]o|NO|[oO]n|ON|[oO]ff|OFF              # YAML 1.1 booleans
    |[-+]?0[0-9a-zA-Z_].*                                        # base 2, 8, 16; leading zeros
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?           # sexagesimal
    |[-+]?[0-9._]*_.*                                           # digits with underscores
    |[-+]?[0-9.]+[eE].*                                         # exponents
    |[-+]?\..*                                                  # .5, -.5, .inf, .nan
    |[!&*?@`%<=].*                                              # tags, anchors, merges, ...
    |(?![\[{][\]}][ ]*(?:\#.*)?$)[\[{].*                         # flow collections, not [] {}
    )[ ]*(?:[ ]\#.*)?$""",
    re.VERBOSE | re.MULTILINE,
)


def list_items(text: str) -> Iterator[Any]:
    """Yield each element of the ``items`` of a single-document YAML ``List`` (kubectl's
    layout), in order. Raises ``NotStreamable``, possibly after some items were yielded, for
    any other text: the caller discards what it built and reads the text whole."""
    if yaml_rs is None:
        raise NotStreamable("no compiled YAML parser")
    if text.startswith("---"):
        text = text.split("\n", 1)[1] if "\n" in text else ""
    if "\n---" in text or "\n..." in text or "\t" in text or "<<" in text:
        raise NotStreamable("several documents, tabs or merge keys")
    start, end, dash = _items_region(text)
    _check_list(text[:start] + " []\n" + text[end:])
    at = start
    while at < end:
        cut = text.find(dash, min(at + BATCH_CHARS, end), end)
        cut = end if cut < 0 else cut + 1
        yield from _batch(text[at - 1 : cut])  # from the newline before it: keys match after one
        at = cut


def _items_region(text: str) -> tuple[int, int, str]:
    """Where the items are: (just after ``items:``, the end of the last item, the needle
    ``\\n<indent>- `` that starts each item)."""
    key = text.find("\nitems:")
    key = 0 if text.startswith("items:") else key + 1 if key >= 0 else -1
    if key < 0:
        raise NotStreamable("no items")
    start = text.find("\n", key) + 1
    if start == 0 or text[key + len("items:") : start].strip():
        raise NotStreamable("items is not a block sequence")
    line_end = text.find("\n", start)
    first = text[start : line_end if line_end >= 0 else len(text)]
    indent = len(first) - len(first.lstrip(" "))
    if not first[indent:].startswith("- "):
        raise NotStreamable("items does not start with an entry")
    dash = "\n" + " " * indent + "- "
    last = text.rfind(dash, start - 1) + 1
    return start, _entry_end(text, max(last, start), indent), dash


def _entry_end(text: str, at: int, indent: int) -> int:
    """The end of the entry starting at ``at``: the first line after it indented no deeper
    than its dash (blank lines and comments aside)."""
    while True:
        newline = text.find("\n", at)
        if newline < 0:
            return len(text)
        at = newline + 1
        line = text[at : text.find("\n", at) if text.find("\n", at) >= 0 else len(text)]
        stripped = line.lstrip(" ")
        if stripped and not stripped.startswith("#") and len(line) - len(stripped) <= indent:
            return at


def _check_unambiguous(text: str) -> None:
    keys = set(_KEYS.findall(text))
    if any(key[:1] in ("", "[", "{") for key in keys):
        raise NotStreamable("an empty key, or a collection as a key")
    candidates = set(_VALUES.findall(text))
    candidates.update(_ENTRIES.findall(text), keys)
    found = _AMBIGUOUS.search("\n".join(candidates))
    if found:
        raise NotStreamable(f"plain scalar {found.group().strip()!r} reads differently in YAML 1.2")


def _check_list(skeleton: str) -> None:
    """The top level without its items: a ``List`` with an ``apiVersion``."""
    top = _load("\n" + skeleton)
    if not isinstance(top, dict) or top.get("items") != []:
        raise NotStreamable("not a mapping with items")
    kind, api_version = top.get("kind"), top.get("apiVersion")
    if not (isinstance(kind, str) and kind.endswith("List")):
        raise NotStreamable("not a List")
    if not (isinstance(api_version, str) and api_version):
        raise NotStreamable("apiVersion missing")


def _batch(text: str) -> list[Any]:
    items = _load(text)
    if not isinstance(items, list):
        raise NotStreamable("items batch is not a sequence")
    return items


def _load(text: str) -> Any:
    """``text`` read by yaml_rs, once no plain scalar in it could read differently."""
    _check_unambiguous(text)
    try:
        return yaml_rs.loads(text, parse_datetime=False)
    except Exception as err:  # the strict reader names the problem; here it only means "no"
        raise NotStreamable(str(err)) from None
