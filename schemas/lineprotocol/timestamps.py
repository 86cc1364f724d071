"""Timestamp precision guessed by magnitude, and the window a timestamp must land in.

Senders disagree on precision (CC sinks: s; cc-lib, `nats pub`: ns), so the unit is read from the magnitude:
below 5e9 seconds (until 2128), below 5e12 ms, below 5e15 us, else ns. For times from 2000 to 2128 the four
bands do not overlap, so a live timestamp is always read right. A value outside every band is *not* silently
read in the next unit: `7258118400` (2200-01-01 in seconds) would be 1970-03-26 read as ms, and `0` is
1970-01-01. Hence the rule readers apply (`parse_payload(..., max_future=...)`): interpret by magnitude,
then require `EARLIEST <= t <= now + max_future`; anything else is a Problem with its line number, never a
point in 1970 or in the far future.
"""

from __future__ import annotations

from datetime import UTC, datetime

# Below 5e9 is seconds (until year 2128), below 5e12 ms, below 5e15 us, else ns.
_S, _MS, _US = 5_000_000_000, 5_000_000_000_000, 5_000_000_000_000_000

EARLIEST = 946_684_800
"""2000-01-01T00:00:00Z: no telemetry is older; anything before it is a misread unit or a placeholder 0."""

DEFAULT_MAX_FUTURE = 86_400
"""Seconds a timestamp may be ahead of the reader's clock by default (clock skew, time zones done wrong)."""


def to_seconds(ts: int) -> int:
    """Whole epoch seconds from a timestamp in s, ms, us or ns (truncating)."""
    if ts < _S:
        return ts
    if ts < _MS:
        return ts // 1_000
    if ts < _US:
        return ts // 1_000_000
    return ts // 1_000_000_000


def unit_of(ts: int) -> str:
    """The unit `to_seconds` reads `ts` in."""
    return "s" if ts < _S else "ms" if ts < _MS else "us" if ts < _US else "ns"


def utc_text(seconds: float) -> str:
    """Epoch seconds as a person reads them in a message: `2026-11-25T19:40:00Z`."""
    try:
        return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return "beyond the calendar"


def out_of_window(ts: int, seconds: int, latest: int, precision: str = "") -> str:
    """Why timestamp `ts` (read as `seconds`) is refused: before EARLIEST or after `latest`. `precision`:
    the unit the sender declared (InfluxDB's `precision=`), which is then what the reason names; without it
    the unit was read by magnitude."""
    unit = unit_of(ts)
    if precision:
        read = f"timestamp {ts} read as {precision} (precision={precision}) is {utc_text(seconds)}"
    else:
        read = f"timestamp {ts} read as {unit} (by magnitude) is {utc_text(seconds)}"
    why = (
        ""
        if seconds >= EARLIEST or unit == "s" or precision
        else f" (numbers from {_S} on, year 2128 in seconds, are not read as seconds)"
    )
    return f"{read}, {window_problem(seconds, latest)}{why}"


def window_problem(seconds: int, latest: int) -> str | None:
    """How a time of `seconds` (epoch) misses the window [EARLIEST, `latest`] (`latest`: the reader's now +
    max_future), None inside it. The one wording of the window for line protocol and Sonar envelope times."""
    if seconds < EARLIEST:
        return "before 2000-01-01"
    if seconds > latest:
        return f"{seconds - latest} s later than now + max_future ({utc_text(latest)})"
    return None
