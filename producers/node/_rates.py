"""Turning two readings of a monotonically increasing kernel counter into a per-second rate.

Kept in one place so that every family treats the awkward cases alike: no previous reading (first
sample, device appeared), a zero or negative interval (clock stepped back), and a counter that went
down (wrap at a known maximum, a driver reload, a reboot).
"""

from __future__ import annotations


def counter_delta(prev: int, cur: int, wrap: int = 0) -> int | None:
    """`cur - prev`, adding `wrap` once when the counter wrapped; None when it went down without a
    known wrap range (reset: better to report nothing than a huge or negative spike)."""
    if cur >= prev:
        return cur - prev
    if wrap > 0 and prev <= wrap:
        return wrap - prev + cur
    return None


def rate(prev: int | None, cur: int, dt: float, wrap: int = 0, scale: float = 1.0) -> float | None:
    """Per-second rate of a counter between two readings `dt` seconds apart, times `scale`."""
    if prev is None or dt <= 0:
        return None
    delta = counter_delta(prev, cur, wrap)
    if delta is None:
        return None
    return delta * scale / dt
