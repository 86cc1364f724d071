"""The last sample per host, from the bus alone.

Every sample of `hpcbus produce node` (and `hpcbus simulate`) travels with one small skeleton event on
`<cluster>.events.sample` (`sample,...,hostname=<host>,... event="..." <time>`, about 3 kB, against 130 kB of
metric lines on `<cluster>.metrics`), so reading the skeletons of the last `node_window` seconds gives every
reporting host, its last sample time and its interval (the gap between its last two samples) at a cost of a
few kB per host and sample; the window is stretched to hold `silent_intervals + 1` of those intervals. A host
silent for longer than that window is found by probes further back (read at once): a stretch of 1.2
intervals at 4, 16, 64 and 256 windows ago and at the stream's oldest message. A host seen there
but not since is silent; its last sample is then known to be at least as recent as the probe (`exact=False`).
Beyond what the stream keeps, only InfluxDB remembers (docs/status.md)."""

from __future__ import annotations

import asyncio
import re
import statistics
from collections.abc import Iterable

from nats.js import JetStreamContext

from hpcbus.commands.status.facts import Node, Nodes
from hpcbus.commands.status.scan import read_since

_HOST = re.compile(rb"[,]hostname=((?:[^,\s\\]|\\.)+)")
PROBES = (4, 16, 64, 256)
"""Probe distances in windows back from now."""


def skeleton_times(payload: bytes, fallback: float) -> Iterable[tuple[str, float]]:
    """(host, sample time) of each skeleton line of a message; the stored time when a line has none."""
    for line in payload.split(b"\n"):
        if not line.startswith(b"sample,"):
            continue
        m = _HOST.search(line, 0, 400)
        if m is None:
            continue
        host = m.group(1).replace(b"\\", b"").decode(errors="replace")
        when = fallback
        tail = line.rsplit(b" ", 1)[-1]
        if tail.isdigit():
            t = int(tail)
            while t > 100_000_000_000:  # ms, us, ns -> s
                t //= 1000
            when = float(t)
        yield host, when


class Seen:
    """Per host, its two latest distinct sample times."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}
        self.before: dict[str, float] = {}
        self.exact: dict[str, bool] = {}
        self.outside: set[str] = set()
        """Hosts known only from outside the window read (a probe further back, InfluxDB): silent."""
        self.window = 0.0
        """Seconds back from now that were read in full (0: not known)."""

    def add(self, host: str, when: float, *, exact: bool = True) -> None:
        if exact:
            self.outside.discard(host)
        elif host not in self.last:
            self.outside.add(host)
        last = self.last.get(host)
        if last is None:
            self.last[host] = when
            self.exact[host] = exact
        elif when > last:
            self.before[host], self.last[host] = last, when
        elif when < last and when > self.before.get(host, 0.0):
            self.before[host] = when

    def interval(self, host: str) -> float | None:
        before = self.before.get(host)
        return self.last[host] - before if before else None


def judge(seen: Seen, now: float, silent_intervals: float, source: str) -> Nodes:
    """Nodes with each host's interval (its own, else the cluster's median) and the silent ones."""
    own = {h: i for h in seen.last if (i := seen.interval(h))}
    common = statistics.median(own.values()) if own else None
    hosts = []
    for host, last in sorted(seen.last.items()):
        interval = own.get(host) or common
        exact = seen.exact[host]
        silent = host in seen.outside or (interval is not None and now - last > silent_intervals * interval)
        hosts.append(
            Node(host=host, last_sample=last, interval_s=interval or 0.0, silent=silent, exact=exact)
        )
    return Nodes(
        source=source if hosts else "none",
        seen=len(hosts),
        interval_s=common,
        silent=[n for n in hosts if n.silent],
        newest=max(seen.last.values()) if seen.last else None,
        window_s=seen.window,
        hosts=hosts,
    )


async def last_samples(
    js: JetStreamContext,
    stream: str,
    subject: str,
    *,
    now: float,
    window: float,
    first_time: float,
    timeout: float,
    silent_intervals: float = 3.0,
    limit: int = 2_000_000,
) -> Seen:
    """Read the skeletons of the last `window` seconds (further back when the hosts' interval says that
    `silent_intervals + 1` intervals do not fit in it), then probe further back (see the module text)."""
    seen = Seen()

    async def read(start: float, span: float = 0.0, *, exact: bool = True, only_new: bool = False) -> None:
        async for msg in read_since(js, stream, subject, start, limit=limit, timeout=timeout, span=span):
            for host, when in skeleton_times(msg.data or b"", msg.metadata.timestamp.timestamp()):
                if not only_new or host not in recent:
                    seen.add(host, when, exact=exact)

    recent: set[str] = set()
    await read(now - window)
    interval = median_interval(seen)
    needed = (silent_intervals + 1) * interval if interval else window
    if needed > window:  # slow samplers: the window must hold a few of their intervals
        await read(now - needed, needed - window)
        window = needed
    recent = set(seen.last)
    seen.window = window
    span = 1.2 * (median_interval(seen) or window)
    starts = [now - k * window for k in PROBES if now - k * window > first_time]
    if first_time and first_time < now - window:
        starts.append(first_time)
    await asyncio.gather(*(read(start, span, exact=False, only_new=True) for start in starts))
    return seen


def median_interval(seen: Seen) -> float | None:
    intervals = [i for h in seen.last if (i := seen.interval(h))]
    return statistics.median(intervals) if intervals else None


def merge_known(seen: Seen, last: dict[str, float]) -> None:
    """Last samples InfluxDB knows (host -> time): a host the bus did not see at all, or saw only in a
    probe (an earlier time), takes InfluxDB's time as exact."""
    for host, when in last.items():
        if host not in seen.last:
            seen.outside.add(host)
        if host not in seen.last or (not seen.exact[host] and when >= seen.last[host]):
            seen.last[host] = when
            seen.exact[host] = True
