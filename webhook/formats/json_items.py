"""The items of a large JSON ``List`` one at a time, without building the whole list.

``kubectl get nodes,pods -A -o json`` of a big cluster is a single 100 MB+ document. Parsing it
whole holds every pod as a Python dict at once (≈ 9 bytes of heap per byte of JSON); the state
needs only a compact record per pod. The standard library's C scanner (``raw_decode``) parses
one value at a given offset, so walking the top-level object key by key and the ``items``
array element by element keeps one item alive at a time, at the scanner's full speed.

Anything unusual (not an object at the top, invalid JSON, ``NaN``, a duplicate key, trailing
text, a top-level object that turns out not to be a ``List``) raises ``NotStreamable``: the caller
then reads the file the ordinary way, so errors and results stay exactly those of
``manifests.documents_in``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

_SPACE = re.compile(r"[ \t\n\r]*")


class NotStreamable(ValueError):
    """The text is not a JSON object this reader can stream; read it whole instead."""


def _no_constants(name: str) -> Any:
    raise NotStreamable(f"JSON does not allow {name}")  # orjson, and so the whole-file path, refuse it


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise NotStreamable("duplicate key")  # strict decoding: the whole-file read names it
    return obj


# The whole-file read (``manifests.documents_in``) is the standard library's decoder too:
# integers of any size stay integers, as they do there.
_DECODER = json.JSONDecoder(parse_constant=_no_constants, object_pairs_hook=_object)


def list_items(text: str) -> Iterator[Any]:
    """Yield each element of the top-level object's ``items`` array, in order.

    Raises ``NotStreamable`` — possibly after some items were yielded — when the text is not
    one JSON object whose ``kind`` ends in ``List``, with a non-empty string ``apiVersion``
    and an ``items`` array: the caller must discard what it built and read the text whole.
    """
    top: dict[str, Any] = {}
    saw_items = False
    at = _after(text, _skip(text, 0), "{")
    if text[at : at + 1] == "}":
        raise NotStreamable("empty object")
    while True:
        key, at = _value(text, at)
        if not isinstance(key, str) or key in top or (key == "items" and saw_items):
            raise NotStreamable("object key is not a string, or repeated")
        at = _after(text, at, ":")
        if key == "items" and text[at : at + 1] == "[":
            saw_items = True
            at = yield from _array(text, _skip(text, at + 1))
        else:
            top[key], at = _value(text, at)
        token, at = _token(text, at)
        if token == "}":
            break
        if token != ",":
            raise NotStreamable(f"unexpected {token!r} in the top-level object")
    if at != len(text):
        raise NotStreamable("text after the top-level object")
    kind, api_version = top.get("kind"), top.get("apiVersion")
    if not (saw_items and isinstance(kind, str) and kind.endswith("List")):
        raise NotStreamable("not a List with items")
    if not (isinstance(api_version, str) and api_version):
        raise NotStreamable("apiVersion missing")


def _array(text: str, at: int) -> Iterator[Any]:
    """Yield the elements of an array whose ``[`` is just before ``at``; return the end."""
    if text[at : at + 1] == "]":
        return _skip(text, at + 1)
    while True:
        item, at = _value(text, at)
        yield item
        token, at = _token(text, at)
        if token == "]":
            return at
        if token != ",":
            raise NotStreamable(f"unexpected {token!r} in items")


def _value(text: str, at: int) -> tuple[Any, int]:
    """One JSON value at ``at``; returns it and the offset after it and any white space."""
    try:
        value, end = _DECODER.raw_decode(text, at)
    except json.JSONDecodeError as err:
        raise NotStreamable(str(err)) from None
    return value, _skip(text, end)


def _token(text: str, at: int) -> tuple[str, int]:
    return text[at : at + 1], _skip(text, at + 1)


def _after(text: str, at: int, wanted: str) -> int:
    token, at = _token(text, at)
    if token != wanted:
        raise NotStreamable(f"expected {wanted!r}")
    return at


def _skip(text: str, at: int) -> int:
    return _SPACE.match(text, at).end()
