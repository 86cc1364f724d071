"""Finding where each envelope starts and ends in a stream of lines, without holding the stream in memory.

Sonar data arrive framed three ways: one envelope per message or file, one compact envelope per line (JSONL:
Kafka dumps, the jobanalyzer test data), or several *pretty-printed* envelopes back to back with no enclosing
array (Go's `json.Encoder` stream style: Sonar's own fixtures and slurm-monitor's). The splitter here tracks
`{`/`}` depth outside JSON strings, line by line, so that only the current envelope is ever buffered.

It relies on two properties of JSON and of every pretty-printer in use:

* A JSON string cannot contain a raw newline, so string state never carries from one line to the next.
* Only a top-level value starts at column 0; nested objects are indented. So a line that starts with `{`
  while an envelope is still open means the open one was broken (a truncated JSONL line, say): it is
  reported and reading *resynchronises* at the new line instead of swallowing every envelope after it.

The JSONL fast path (a whole line that is a whole envelope, decoded without scanning) lives in
`schemas.sonar.validate`; the splitter handles everything else.
"""

from __future__ import annotations

import re
from typing import NamedTuple

# A complete JSON string (the unrolled-loop form, fast in `re`), an unterminated one, or a brace.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|"|[{}]')


class Piece(NamedTuple):
    """A stretch of the input: an envelope's text to decode, or a stretch that cannot be one."""

    line: int
    """1-based line where the stretch starts."""
    text: str
    """The envelope text (lines joined by newline); empty when `problem` is set."""
    problem: str = ""
    """Why this stretch is not an envelope; empty for an envelope candidate."""


def scan(line: str, start: int, depth: int) -> tuple[int, int]:
    """Scan `line[start:]` from brace `depth`: `(depth, end)`, `end` just past the `}` that closed the
    top-level object, or -1 if it is still open at the end of the line (depth -1: an unterminated string,
    which no later line can repair)."""
    for match in _TOKEN.finditer(line, start):
        first = line[match.start()]
        if first == "{":
            depth += 1
        elif first == "}":
            depth -= 1
            if depth == 0:
                return 0, match.end()
        elif match.end() - match.start() == 1:
            return -1, -1
    return depth, -1


class Splitter:
    """Feed it lines in order; it returns the pieces each line completes. Memory: one open envelope."""

    def __init__(self) -> None:
        self._buf: list[str] | None = None
        self._depth = 0
        self._start = 0
        self._junk_first = 0
        self._junk_last = 0

    @property
    def idle(self) -> bool:
        """No envelope is open (the next line may be taken whole by the JSONL fast path)."""
        return self._buf is None

    def flush_junk(self) -> list[Piece]:
        """The pending run of non-envelope lines as one problem piece, if any."""
        if not self._junk_first:
            return []
        first, last = self._junk_first, self._junk_last
        self._junk_first = self._junk_last = 0
        where = f"line {first} does" if first == last else f"lines {first}-{last} do"
        return [Piece(first, "", f"not a Sonar JSON envelope: {where} not start with `{{`")]

    def feed(self, lineno: int, line: str) -> list[Piece]:
        """The pieces that end on this line (`line` without its newline)."""
        out: list[Piece] = []
        pos = 0
        if self._buf is not None and line.startswith("{"):
            out.append(self._broken(f"unterminated JSON object: a new envelope starts at line {lineno}"))
        while True:
            if self._buf is None:
                rest = line[pos:]
                stripped = rest.lstrip()
                if not stripped:
                    return out
                if not stripped.startswith("{"):
                    if not self._junk_first:
                        self._junk_first = lineno
                    self._junk_last = lineno
                    return out
                out.extend(self.flush_junk())
                pos += len(rest) - len(stripped)
                depth, end = scan(line, pos, 0)
                if end >= 0:
                    out.append(Piece(lineno, line[pos:end]))
                    pos = end
                    continue
                self._buf, self._depth, self._start = [line[pos:]], depth, lineno
                return out
            if self._depth < 0:  # an unterminated string: wait for the next envelope start
                self._buf.append(line)
                return out
            depth, end = scan(line, 0, self._depth)
            if end >= 0:
                self._buf.append(line[:end])
                out.append(Piece(self._start, "\n".join(self._buf)))
                self._buf = None
                pos = end
                continue
            self._buf.append(line)
            self._depth = depth
            return out

    def finish(self) -> list[Piece]:
        """Pieces left at the end of input: an envelope still open, a trailing run of non-envelope lines."""
        out = self.flush_junk()
        if self._buf is not None:
            out.append(self._broken("unterminated JSON object: the input ends inside it"))
        return out

    def _broken(self, reason: str) -> Piece:
        piece = Piece(self._start, "", reason)
        self._buf = None
        self._depth = 0
        return piece
