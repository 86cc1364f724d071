"""Timestamp precision guessed by magnitude: senders disagree (CC sinks: s; cc-lib, `nats pub`: ns)."""

from __future__ import annotations

# Below 5e9 is seconds (until year 2128), below 5e12 ms, below 5e15 us, else ns. Dates before ~1970-03
# in ms/us/ns would be misread as seconds, which no live telemetry sends.
_S, _MS, _US = 5_000_000_000, 5_000_000_000_000, 5_000_000_000_000_000


def to_seconds(ts: int) -> int:
    """Whole epoch seconds from a timestamp in s, ms, us or ns (truncating)."""
    if ts < _S:
        return ts
    if ts < _MS:
        return ts // 1_000
    if ts < _US:
        return ts // 1_000_000
    return ts // 1_000_000_000
