"""JSON nested past the parser's depth limit, made readable by cutting what is too deep.

orjson refuses a document nested more than 1024 levels deep. An AdmissionReview that does so
is still answerable: its uid and the fields the policies read sit a few levels down. So the
values nested past ``DEPTH_LIMIT`` are replaced by ``null`` and the first place cut is
reported; the review is then answered for that field per ``failOpen``, like any other field the
guard cannot read (``admission.review``), while the policies that need no pod field (a pinned
template) still judge the object.

The cut is one linear pass over the body: a regular expression finds strings (skipped whole)
and runs of brackets (counted at once), so three million nested brackets cost a few steps,
not a recursion. Each step is Python code, though, so a pass gives up after ``MAX_TOKENS``
strings and bracket runs (``TooComplex``): real objects hold far fewer, and a body built to
have millions must not hold a thread for seconds.
"""

from __future__ import annotations

import re

import orjson

DEPTH_LIMIT = 1000  # below orjson's 1024, which counts the review's own levels too
PATH_LEVELS = 12  # levels of the first cut's path that are named; deeper ones read "…"
MAX_TOKENS = 100_000  # about 0.1 s of scanning
# A string, with the colon that makes it a key; a run of openers; a run of closers.
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"(\s*:)?|([\[{]+)|[\]}]+', re.DOTALL)


class TooComplex(ValueError):
    """The body holds more strings and brackets than a cut may scan."""


def too_deep(err: orjson.JSONDecodeError) -> bool:
    """Whether orjson refused a document only for its depth (the message differs by version)."""
    message = str(err).lower()
    return "depth" in message or "recursion" in message


def cut_too_deep(body: bytes, limit: int = DEPTH_LIMIT) -> tuple[bytes, str]:
    """``body`` with every value that opens deeper than ``limit`` replaced by ``null``, and the
    dotted path (``[]`` for an array level) of the first value cut. Raises ``TooComplex``."""
    out = bytearray()
    copied = depth = 0
    cutting = 0  # levels open inside the value being cut (0: not cutting)
    levels: list[list] = []  # the named levels: [is an object, the key being read]
    first_cut = ""
    for count, token in enumerate(_TOKEN.finditer(body)):
        if count == MAX_TOKENS:
            raise TooComplex(f"more than {MAX_TOKENS} strings and bracket runs to scan")
        text, openers = token[0], token[2]
        if openers is not None and cutting:
            cutting += len(openers)
        elif openers is not None:
            opened = min(len(openers), limit - depth)
            for bracket in openers[: max(0, min(opened, PATH_LEVELS - depth))]:
                levels.append([bracket == ord("{"), None])
            depth += opened
            if opened < len(openers):  # the rest of the run opens past the limit: cut from there
                first_cut = first_cut or _path(levels, depth)
                out += body[copied : token.start() + opened] + b"null"
                cutting, copied = len(openers) - opened, len(body)
        elif text[:1] == b'"':
            if token[1] is not None and not cutting and 0 < depth <= PATH_LEVELS and levels[depth - 1][0]:
                levels[depth - 1][1] = text[: -len(token[1])]
        else:
            closed = len(text)
            if cutting:
                if closed < cutting:
                    cutting -= closed
                    continue
                copied = token.start() + cutting  # right after the cut value's closing bracket
                closed, cutting = closed - cutting, 0
            depth -= closed
            del levels[max(0, min(depth, PATH_LEVELS)) :]
    out += body[copied:]
    return bytes(out), first_cut


def _path(levels: list[list], depth: int) -> str:
    parts = []
    for is_object, key in levels:
        if not is_object:
            parts.append("[]")
        else:
            name = _key(key)
            parts.append(f".{name}" if parts else name)
    path = "".join(parts)
    return f"{path}…" if depth > len(levels) else path


def _key(raw: bytes | None) -> str:
    if raw is None:
        return "?"
    try:
        return str(orjson.loads(raw))
    except orjson.JSONDecodeError:
        return "?"
