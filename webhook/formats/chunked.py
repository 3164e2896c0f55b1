"""HTTP/1.1 chunked transfer coding (RFC 9112 §7.1): one decoder, for what the guard reads both ways.

The server's event loop frames chunked requests with it (where a request ends, and whether it
is over the body limit, before a thread sees it: ``serve/framing.py``), and the informer
decodes the API server's watch streams with it (``state/apiserver.py``), where every event is
a chunk of its own. Both read bytes as they arrive, so the decoder is resumable: it is handed a
buffer and where the unread part starts, advances over every piece of framing that has arrived
whole, and answers where it stopped. Chunk data is handed out as slices of the buffer, or not
at all (the server's loop only needs the end: gunicorn reads the body from the same bytes).

One grammar, the server's strict one, holds for both directions. A chunk size is hex digits
and nothing else (``int(x, 16)`` also takes a sign, ``0x``, ``_`` and spaces: a negative size
would lower a body's count under its limit), at most 16 of them; extensions may follow after
``;``. Lines end with CRLF: a bare LF is refused at once, where waiting for a CRLF that never
comes would hold a connection to its deadline. Each piece has a cap that holds however its
bytes arrive (a chunk-size line ``MAX_CHUNK_LINE``, the trailer section ``MAX_TRAILERS``), and
the search for a piece's end resumes where the last one stopped, so a client that trickles
bytes makes the decoder look at each byte once.

Measured against the two decoders it replaced (one machine, min of 21): watch streams of
900-byte events cost the same in 16 and 64 KiB reads (0.72 µs an event, +1 to 3 %), and 0.3 µs
more per read in 1 KiB reads (the state lives on the decoder, not in a generator's locals);
the loop frames a 3 KB review in 64-byte chunks in 33 µs (was 62) and a trickled one in a
third of the time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_CHUNK_LINE = 1024  # a chunk-size line with its extensions
MAX_TRAILERS = 8 * 1024  # the trailer section after the last chunk: header lines, capped like them
CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,16})(?:[ \t]*;[^\r\n]*)?")
BARE_LF = re.compile(rb"(?<!\r)\n")
_CRLF = b"\r\n"
_HEX = b"0123456789abcdefABCDEF"


class MalformedChunks(ValueError):
    """Framing that does not follow the chunked coding (or passes one of its caps)."""


class ChunksTooLarge(ValueError):
    """The chunks declare more than the decoder's limit."""


@dataclass(slots=True)
class ChunkedDecoder:
    """The state of one chunked body, decoded as its bytes arrive.

    ``max_body`` caps the chunks' data, ``max_framed`` the whole coding (data, sizes,
    extensions: 1-byte chunks with 1 KiB of extensions each would make a reader that buffers
    them hold a thousand times the body limit); both are checked when a chunk's size is read,
    before its data arrives. None: no cap (a watch stream has no end to cap).
    """

    max_body: int | None = None
    max_framed: int | None = None
    body: int = 0  # bytes of chunk data declared so far
    framed: int = 0  # bytes of the coding consumed so far
    left: int = 0  # bytes of the current chunk still to come: its data, and 2 for its CRLF
    last_chunk: bool = False  # only the trailer section is left
    searched: int = 0  # how far the search for the end of the piece being read got
    done: bool = False

    def decode(self, buffer: bytes | bytearray, at: int = 0, out: list | None = None) -> int:
        """Advance over ``buffer[at:]``, appending each chunk's data that arrived to ``out``
        (unless None), and answer where the framing not yet read starts: the caller hands the
        bytes from there on, with what comes next, to the following call. Once ``done``, the
        answer is where the body ends (what follows is not the body's). Raises
        ``MalformedChunks`` and ``ChunksTooLarge``."""
        started, size_of, left = at, len(buffer), self.left
        if left:  # the rest of a chunk that did not arrive whole: its data, then its CRLF
            if left > 2:
                taken = min(left - 2, size_of - at)
                if out is not None and taken:
                    out.append(buffer[at : at + taken])  # a large chunk's data is never copied again
                at += taken
                left -= taken
            if left == 2 and size_of - at >= 2:
                if buffer[at : at + 2] != _CRLF:
                    raise MalformedChunks("a chunk's data does not end with CRLF")
                at, left = at + 2, 0
            self.left = left
        if not (left or self.done):
            at = self._trailers(buffer, at) if self.last_chunk else self._chunks(buffer, at, out, started)
        self.framed += at - started
        return at

    def _chunks(self, buffer: bytes | bytearray, at: int, out: list | None, started: int) -> int:
        """Chunk after chunk, as far as they have arrived: the path of every watch event."""
        max_body, max_framed, body = self.max_body, self.max_framed, self.body
        origin = self.framed - started  # where ``buffer[0]`` is in the coding, for ``max_framed``
        size_of, searched, self.searched = len(buffer), self.searched, 0
        while True:
            eol = buffer.find(_CRLF, at + searched - 1 if searched else at)
            if eol < 0:
                self.searched = _incomplete(buffer, at, searched, MAX_CHUNK_LINE, "chunk-size line")
                break
            searched = 0
            line = buffer[at:eol]
            # Plain hex digits (the usual line) are read at once; anything else by the grammar.
            size = int(line, 16) if 0 < len(line) <= 16 and not line.strip(_HEX) else _size(line)
            if size == 0:
                self.last_chunk = True
                at = self._trailers(buffer, eol)  # they end at the first CRLFCRLF from here
                break
            body += size
            start, end = eol + 2, eol + 2 + size
            if max_body is not None and body > max_body:
                raise ChunksTooLarge(f"chunks declare more than {max_body} bytes")
            if max_framed is not None and origin + end + 2 > max_framed:
                raise ChunksTooLarge(f"chunked framing longer than {max_framed} bytes")
            if end + 2 > size_of:  # the rest of it comes in the next reads
                at = min(end, size_of)
                if out is not None and at > start:
                    out.append(buffer[start:at])
                self.left = end + 2 - at
                break
            if buffer[end : end + 2] != _CRLF:
                raise MalformedChunks("a chunk's data does not end with CRLF")
            if out is not None:
                out.append(buffer[start:end])
            at = end + 2
        self.body = body
        return at

    def _trailers(self, buffer: bytes | bytearray, at: int) -> int:
        """The trailer section, from the last chunk's CRLF on: done at its first CRLFCRLF."""
        resume = at + max(self.searched - 3, 0)  # what came before was searched already
        end = buffer.find(b"\r\n\r\n", resume)
        if end < 0:
            self.searched = _incomplete(buffer, at, self.searched, MAX_TRAILERS, "trailer section")
            return at
        if BARE_LF.search(buffer, resume, end):
            raise MalformedChunks("a trailer line ends in a bare LF")
        if end - at > MAX_TRAILERS:
            raise MalformedChunks(f"trailer section longer than {MAX_TRAILERS} bytes")
        self.searched, self.done = 0, True
        return end + 4


def _incomplete(buffer: bytes | bytearray, at: int, searched: int, cap: int, piece: str) -> int:
    """The piece at ``at`` has not ended yet: refused now if it cannot end well, else how
    far its search got (the next one resumes there)."""
    if BARE_LF.search(buffer, at + max(searched - 3, 0)):
        raise MalformedChunks(f"a {piece} ends in a bare LF")
    if len(buffer) - at > cap:
        raise MalformedChunks(f"{piece} longer than {cap} bytes")
    return len(buffer) - at


def _size(line: bytes | bytearray) -> int:
    """A chunk-size line by the grammar: hex digits, then extensions; else ``MalformedChunks``."""
    if len(line) > MAX_CHUNK_LINE:
        raise MalformedChunks(f"chunk-size line longer than {MAX_CHUNK_LINE} bytes")
    size = CHUNK_SIZE.fullmatch(line)
    if size is None:
        raise MalformedChunks(f"invalid chunk-size line {bytes(line[:40])!r}")
    return int(size[1], 16)
