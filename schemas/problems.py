"""One shape for every complaint about input, so CLI, logs and dead-letter records print it the same way.

A `Problem` names *where* (a file or NATS subject plus a line number), *what kind of thing* was being read
(`sonar sample`, `lp metric`, `sacct`, ...), *which part* of it (a field path such as
`data.attributes.jobs[3].processes[0].pid`, or a line-protocol column such as `tag hostname`) and *why*.
"""

from __future__ import annotations

import msgspec

FORBIDDEN = "forbidden"
"""`Problem.code` of a unit that is valid but names a cluster or host its sender may not publish for: a question
of permission (the gateway answers HTTP 403 when nothing else is wrong), not of validity."""


class Problem(msgspec.Struct, frozen=True, omit_defaults=True):
    """A single reason why one unit of input (a line, an envelope, a record) was rejected or doubted."""

    reason: str
    place: str = ""
    """File path, `-` for stdin, or a NATS subject."""
    line: int = 0
    """1-based line number within `place`; 0 when not line-oriented."""
    kind: str = ""
    """What was being read: `lp metric`, `lp event`, `sonar sample`, `sacct`, `ocs accounting`, ..."""
    path: str = ""
    """Field path or column inside the unit, e.g. `data.attributes.node` or `tag hostname`."""
    severity: str = "error"
    """`error` (the unit was rejected) or `warning` (accepted, but repaired or suspicious)."""
    code: str = ""
    """What sort of refusal, where an answer depends on it and the reason's words cannot decide it (they
    quote the input): `FORBIDDEN`, or "" (the input is invalid, or not said)."""

    def located(self, place: str, line_offset: int = 0) -> Problem:
        """The same problem, attributed to `place` with its line shifted by `line_offset`."""
        return msgspec.structs.replace(self, place=place, line=self.line + line_offset if self.line else 0)

    def __str__(self) -> str:
        where = f"{self.place}:{self.line}" if self.line else (self.place or "-")
        parts = [where]
        if self.kind:
            parts.append(self.kind)
        if self.path:
            parts.append(self.path)
        text = ": ".join(parts) + ": "
        if self.severity != "error":
            text += f"{self.severity}: "
        return text + self.reason


class InvalidInput(ValueError):
    """Raised by strict decoders; carries every problem found, not only the first."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems) or "invalid input")
