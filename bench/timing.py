"""Best-of-N CPU timing and the row format shared by all benchmarks."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_of(fn: Callable[[], object], repeats: int = 5) -> float:
    """Lowest process CPU time of `repeats` calls, in seconds (CPU time resists a noisy neighbour)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def interleaved(fns: list[Callable[[], object]], rounds: int = 7) -> list[float]:
    """`best_of` each function, taking turns round by round: on a shared machine the load changes within
    seconds, and a ratio is only meaningful when both sides saw the same load."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            best[i] = min(best[i], best_of(fn, 1))
    return best


def verdict(ok: bool) -> str:
    """How every row states its target: OK or MISS."""
    return "OK" if ok else "MISS"


def report(
    name: str, ours: float, baseline: float, units: int, unit: str, target: float | None = None
) -> str:
    """One line: our rate, the baseline's rate, their ratio and whether the target holds."""
    ratio = baseline / ours if ours else float("inf")
    met = "" if target is None else f"  target >= {target:.2f}x: {verdict(ratio >= target)}"
    return (
        f"{name:<56} {units / ours:>12,.0f} {unit}/s  baseline {units / baseline:>12,.0f} {unit}/s  "
        f"ratio {ratio:5.2f}x{met}"
    )
