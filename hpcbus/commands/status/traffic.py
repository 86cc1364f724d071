"""What is flowing right now, counted from a plain core subscription to each cluster's tree (`<c>.>`): per
subject messages, lines and bytes in one-second buckets, lines per host (from the first line of each
`.metrics` message: a node's sample names one host), the sample skeletons that say which host sampled when,
and the error lines of `.log.>`. Pure counting, no I/O: the live view feeds it and reads rates from it."""

from __future__ import annotations

import collections
import re

from hpcbus.commands.status.nodes import Seen, skeleton_times

_HOST = re.compile(rb"[,]host(?:name)?=((?:[^,\s\\]|\\.)+)")
_ERROR = re.compile(rb"loglevel=(?:error|critical|fatal)\b")
_LOG_TEXT = re.compile(rb' log="((?:[^"\\]|\\.)*)"')
MAX_ERRORS = 20


class Bucket:
    __slots__ = ("bytes", "lines", "msgs")

    def __init__(self) -> None:
        self.msgs = 0
        self.lines = 0
        self.bytes = 0


def count_lines(data: bytes) -> int:
    if not data:
        return 0
    return data.count(b"\n") + (0 if data.endswith(b"\n") else 1)


class Traffic:
    """Counts of one live view; `now` is always passed in, so tests can drive it."""

    def __init__(self, started: float, seen: Seen | None = None) -> None:
        self.started = started
        self.buckets: dict[int, dict[str, Bucket]] = collections.defaultdict(dict)
        self.host_lines: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.seen = seen or Seen()
        self.errors: collections.deque[str] = collections.deque(maxlen=MAX_ERRORS)

    def add(self, subject: str, data: bytes, now: float) -> None:
        second = int(now)
        bucket = self.buckets[second].get(subject)
        if bucket is None:
            bucket = self.buckets[second][subject] = Bucket()
        lines = count_lines(data)
        bucket.msgs += 1
        bucket.lines += lines
        bucket.bytes += len(data)
        if subject.endswith(".metrics"):
            m = _HOST.search(data, 0, 400)
            if m is not None:
                self.host_lines[second][m.group(1).decode(errors="replace")] += lines
        elif subject.endswith(".events.sample"):
            for host, when in skeleton_times(data, now):
                self.seen.add(host, when)
        elif ".log." in subject and _ERROR.search(data):
            for line in data.split(b"\n"):
                if _ERROR.search(line):
                    who = _HOST.search(line, 0, 400)
                    text = _LOG_TEXT.search(line)
                    said = (
                        (text.group(1) if text else line[:200]).decode(errors="replace").replace('\\"', '"')
                    )
                    self.errors.append(f"{who.group(1).decode(errors='replace') if who else '?'}: {said}")

    def window(self, now: float, seconds: float) -> tuple[int, int]:
        """The whole seconds [first, last) the rates are over: up to `seconds` back, never before the start."""
        last = int(now)
        first = max(last - max(int(seconds), 1), int(self.started) + 1)
        return first, max(last, first)

    def rates(self, now: float, seconds: float) -> dict[str, tuple[float, float, float]]:
        """subject -> (messages/s, lines/s, bytes/s) over the window."""
        first, last = self.window(now, seconds)
        span = max(last - first, 1)
        totals: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0, 0])
        for second in range(first, last):
            for subject, b in self.buckets.get(second, {}).items():
                t = totals[subject]
                t[0] += b.msgs
                t[1] += b.lines
                t[2] += b.bytes
        return {s: (t[0] / span, t[1] / span, t[2] / span) for s, t in totals.items()}

    def busiest(self, now: float, seconds: float, n: int) -> list[tuple[str, float]]:
        first, last = self.window(now, seconds)
        span = max(last - first, 1)
        total: collections.Counter[str] = collections.Counter()
        for second in range(first, last):
            total.update(self.host_lines.get(second, {}))
        return [(host, lines / span) for host, lines in total.most_common(n)]

    def forget(self, now: float, keep: float) -> None:
        """Drop buckets older than `keep` seconds: memory stays bounded however long the view runs."""
        oldest = int(now - keep)
        for table in (self.buckets, self.host_lines):
            for second in [s for s in table if s < oldest]:
                del table[second]
