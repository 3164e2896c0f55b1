"""The items of a large API server list response one at a time, read from its byte stream.

The API server honours ``limit``, so a page is normally small and parsed whole. A server (or a
proxy) that ignores it sends every object in one response: 150 MiB of JSON parsed whole holds
about nine bytes of heap per byte of text on top of the state the list replaces (870 MiB
measured). Past a bound, the informer reads the body through ``list_items`` instead: the
standard library's C scanner (``raw_decode``, as fast as orjson on Kubernetes objects) parses
one value at an offset of a window of text refilled from the stream, so the peak is one
window and the caller's batch of items, whatever the response's size.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any

_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()
_REFILL = 1 << 16  # characters read ahead at a time


class UnreadableList(ValueError):
    """The response is not a JSON object with an ``items`` array, or one value is too large."""


class _Window:
    """The decoded text of a byte stream, a window at a time: ``text[at:]`` is unread."""

    def __init__(self, blocks: Iterable[bytes], max_value: int) -> None:
        self._blocks = iter(blocks)
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._max_value = max_value
        self.text, self.at, self.ended = "", 0, False

    def peek(self) -> str:
        """The next character that is not white space ("" at the end of the stream)."""
        while True:
            self.at = _SPACE.match(self.text, self.at).end()
            if self.at < len(self.text) or self.ended:
                return self.text[self.at : self.at + 1]
            self._refill(_REFILL)

    def token(self) -> str:
        token = self.peek()
        self.at += len(token)
        return token

    def value(self) -> Any:
        """The JSON value that starts at the next character, read ahead as far as it needs.

        The read-ahead doubles on each incomplete attempt, so a value costs a small multiple
        of its length to parse however the stream was cut.
        """
        self.peek()
        wanted = _REFILL
        while True:
            try:
                value, end = _DECODER.raw_decode(self.text, self.at)
                if end < len(self.text) or self.ended:  # else a number may go on in the next block
                    if end - self.at > self._max_value:
                        break
                    self.at = end
                    return value
            except json.JSONDecodeError as err:
                if self.ended:
                    raise UnreadableList(str(err)) from None
            ahead = len(self.text) - self.at
            if ahead > self._max_value:
                break
            wanted = max(wanted, 2 * ahead)
            self._refill(wanted)
        raise UnreadableList(f"one value is longer than {self._max_value} characters")

    def _refill(self, wanted: int) -> None:
        """Drop the text already read; read until ``wanted`` characters are ahead or the stream ends."""
        pieces = [self.text[self.at :]]
        ahead = len(pieces[0])
        while ahead < wanted and not self.ended:
            block = next(self._blocks, None)
            self.ended = block is None
            try:
                piece = self._utf8.decode(block or b"", final=self.ended)
            except UnicodeDecodeError as err:
                raise UnreadableList(f"not UTF-8: {err}") from None
            pieces.append(piece)
            ahead += len(piece)
        self.text, self.at = "".join(pieces), 0


def list_items(blocks: Iterable[bytes], metadata: dict[str, Any], max_item: int) -> Iterator[Any]:
    """Yield each element of the response's ``items`` array, in order, as it is read.

    The top-level ``metadata`` object is merged into ``metadata`` when it is read (the API
    server sends it before the items; complete in any case once the items are). Raises
    ``UnreadableList`` for anything but one JSON object with an ``items`` array (or ``null``),
    and for an item longer than ``max_item`` characters.
    """
    text = _Window(blocks, max_item)
    if text.token() != "{":
        raise UnreadableList("the response is not a JSON object")
    if text.peek() == "}":
        raise UnreadableList("the response has no items")
    saw_items = False
    while True:
        key = text.value()
        if not isinstance(key, str) or text.token() != ":":
            raise UnreadableList("malformed top-level object")
        if key == "items" and text.peek() == "[":
            saw_items = True
            yield from _array(text)
        else:
            value = text.value()
            if key == "metadata" and isinstance(value, dict):
                metadata.update(value)
            saw_items = saw_items or (key == "items" and value is None)
        token = text.token()
        if token == "}":
            break
        if token != ",":
            raise UnreadableList(f"unexpected {token!r} in the top-level object")
    if text.peek():
        raise UnreadableList("text after the top-level object")
    if not saw_items:
        raise UnreadableList("the response has no items")


def _array(text: _Window) -> Iterator[Any]:
    text.token()  # the "["
    if text.peek() == "]":
        text.token()
        return
    while True:
        yield text.value()
        token = text.token()
        if token == "]":
            return
        if token != ",":
            raise UnreadableList(f"unexpected {token!r} in items")
