"""Where a buffered HTTP/1.1 request ends, read in the event loop before a thread sees it.

The framing is read (where the head ends, Content-Length or the chunks), and a head that is
plain (``Head``: an origin-form target, fields that are tokens and visible values, a
Content-Length body) is kept parsed: the thread builds the WSGI environ from it
(``direct.py``) instead of parsing the request again. Any other head goes to gunicorn's parser,
which reads it from the same bytes and refuses what it must (400), as before. A chunked body is
framed by the decoder the informer's watch streams share (``webhook/formats/chunked.py``),
with the server's limits on top: the body limit, and twice it for the whole coding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..formats.chunked import BARE_LF, ChunkedDecoder, ChunksTooLarge, MalformedChunks
from .limits import MAX_HEAD

INCOMPLETE, COMPLETE, TOO_LARGE, MALFORMED = "incomplete", "complete", "too large", "malformed"
_BARE_LF_FOUND = -2  # what ``RequestFraming._find_head`` answers for a line ending in a bare LF

# RFC 9112 section 3 (request-line, origin-form) and section 5 (field-line): a token name, and
# a value of visible characters, spaces and tabs (obs-text too), trimmed. Anything else is
# gunicorn's to judge. Its limits (``limit_request_line``, ``_fields``, ``_field_size``)
# bound what is plain here too.
_REQUEST_LINE = re.compile(rb"([A-Z]{1,20}) (/[!-~]{0,4000}) HTTP/1\.([01])")
_FIELD = re.compile(rb"([!#$%&'*+\-.^`|~0-9A-Za-z]{1,256}):[ \t]*((?:[^\x00-\x1f\x7f]|\t)*?)[ \t]*")
_MAX_FIELDS = 100
_MAX_FIELD = 8190
# Fields whose handling is gunicorn's: a chunked body, a protocol upgrade (h2c).
_NOT_PLAIN = frozenset((b"transfer-encoding", b"upgrade", b"http2-settings"))


@dataclass(slots=True)
class Head:
    """A plain request head, parsed in the loop: what the WSGI environ is built from."""

    method: str
    target: str  # origin-form: path and query
    minor: int  # HTTP/1.minor
    fields: list[tuple[str, str]]  # as sent: names in their case, repeated names repeated


@dataclass(slots=True)
class RequestFraming:
    """How far a buffered HTTP/1.1 request has arrived; resumable as more bytes come in.

    Each piece (the head, a chunk-size line, the trailer section) has a cap that holds however
    its bytes arrive, and the search for its end resumes where the last one stopped: a client
    that trickles bytes makes the loop look at each byte once, not rescan everything it has sent
    on every read.
    """

    max_body: int
    head_end: int = -1
    length: int | None = None  # Content-Length
    chunks: ChunkedDecoder | None = None  # Transfer-Encoding: chunked
    scan: int = 0  # where the framing not yet read starts
    searched: int = 0  # how far the search for the head's end got
    end: int = -1  # where the request ends, once known
    expects_continue: bool = False  # HTTP/1.1 with ``Expect: 100-continue``
    head: Head | None = None  # the head, when plain (module doc)

    @property
    def chunked(self) -> bool:
        return self.chunks is not None

    def progress(self, data: bytearray) -> str:
        if self.head_end < 0:
            at = self._find_head(data)
            if at == _BARE_LF_FOUND or (at if at >= 0 else len(data)) > MAX_HEAD:
                return MALFORMED
            if at < 0:
                return INCOMPLETE
            verdict = self._read_head(bytes(data[:at]))
            self.head_end = self.scan = at + 4
            if verdict is not None:
                return verdict
        if self.chunks is not None:
            return self._chunks(data)
        self.end = self.head_end + (self.length or 0)
        return COMPLETE if len(data) >= self.end else INCOMPLETE

    def _find_head(self, data: bytearray) -> int:
        """Where the head ends, searching only bytes not searched yet; ``_BARE_LF_FOUND`` when a
        line of it ends in a bare LF."""
        start = max(0, self.searched - 3)
        at = data.find(b"\r\n\r\n", start)
        if BARE_LF.search(data, start, len(data) if at < 0 else at):
            return _BARE_LF_FOUND
        self.searched = len(data) if at < 0 else at
        return at

    def _read_head(self, head: bytes) -> str | None:
        lines = head.split(b"\r\n")
        http11 = lines[0].endswith(b" HTTP/1.1")  # HTTP/1.0 ignores the expectation (RFC 9110)
        request = _REQUEST_LINE.fullmatch(lines[0]) if len(lines) <= _MAX_FIELDS + 1 else None
        fields: list[tuple[str, str]] | None = [] if request is not None else None
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if fields is not None:
                fields = _plain_field(line, name, fields, self.length is not None)
            if name == b"expect" and http11:
                self.expects_continue = value.strip().lower() == b"100-continue"
                if not self.expects_continue:
                    fields = None  # an expectation not met is gunicorn's to refuse
            if name == b"content-length":
                try:
                    self.length = int(value.strip())
                except ValueError:
                    return MALFORMED
                if self.length < 0:
                    return MALFORMED
            elif name == b"transfer-encoding" and b"chunked" in value.lower() and self.chunks is None:
                self.chunks = ChunkedDecoder(max_body=self.max_body, max_framed=2 * self.max_body)
        if self.length is not None and self.length > self.max_body:
            return TOO_LARGE
        if fields is not None:
            method, target, minor = request.groups()
            self.head = Head(method.decode(), target.decode(), int(minor), fields)
        return None

    def _chunks(self, data: bytearray) -> str:
        try:
            self.scan = self.chunks.decode(data, self.scan)
        except ChunksTooLarge:
            return TOO_LARGE
        except MalformedChunks:
            return MALFORMED
        if not self.chunks.done:
            return INCOMPLETE
        self.end = self.scan
        return COMPLETE


def _plain_field(
    line: bytes, name: bytes, fields: list[tuple[str, str]], length_seen: bool
) -> list[tuple[str, str]] | None:
    """``fields`` with ``line`` added, or None when it makes the head not plain: not a field
    line of the grammar, a name gunicorn drops (``_``: ``header_map``), a field of
    ``_NOT_PLAIN``, or a second Content-Length."""
    match = _FIELD.fullmatch(line) if len(line) <= _MAX_FIELD else None
    if match is None or b"_" in name or name in _NOT_PLAIN or (name == b"content-length" and length_seen):
        return None
    fields.append((match[1].decode("latin-1"), match[2].decode("latin-1")))
    return fields
