"""Repeated refusals as episodes in the log: failed logins, malformed requests, clients gone mid-body.

A hostile or broken client can cause one of these per request, thousands a minute; one log line each would
bury everything else (1,000 wrong passwords were 1,000 WARNINGs). `Tally` reports them the way
`hpcbus.retry.Trouble` reports failures: one line when the first comes (with what it was), then one summary
line per `summary_seconds` while more come (how many, and the latest), never one per repeat. A quiet
`summary_seconds` ends the episode; the next one starts a new one with its own first line.
"""

from __future__ import annotations

import logging
import time


class Tally:
    """`note(detail)` for every occurrence; `flush()` (the periodic report) writes what is still counted."""

    def __init__(
        self, log: logging.Logger, what: str, *, level: int = logging.WARNING, summary_seconds: float = 60.0
    ) -> None:
        self.log = log
        self.what = what
        self.level = level
        self.summary_seconds = summary_seconds
        self.total = 0
        """Occurrences since start (a counter for the summary line)."""
        self._pending = 0
        """Occurrences since the last line written."""
        self._latest = ""
        self._summarised = 0.0
        self._last: float | None = None

    def note(self, detail: str) -> None:
        now = time.monotonic()
        self.total += 1
        if self._last is None or now - self._last >= self.summary_seconds:
            self.flush()
            self._summarised = now
            self.log.log(
                self.level,
                "%s: %s (more like it are counted, one line every %.0f s)",
                self.what,
                detail,
                self.summary_seconds,
            )
        else:
            self._pending += 1
            self._latest = detail
            if now - self._summarised >= self.summary_seconds:
                self.flush()
        self._last = now

    def flush(self) -> None:
        """The summary line of what was counted since the last line, if anything was."""
        if not self._pending:
            return
        now = time.monotonic()
        self.log.log(
            self.level,
            "%s: %d more in the last %.0f s (latest: %s)",
            self.what,
            self._pending,
            now - self._summarised,
            self._latest,
        )
        self._pending = 0
        self._summarised = now
