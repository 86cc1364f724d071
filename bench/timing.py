"""Best-of-N CPU timing shared by all benchmarks."""

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


def report(
    name: str, ours: float, baseline: float, units: int, unit: str, target: float | None = None
) -> str:
    """One line: our rate, the baseline's rate, their ratio and whether the target holds."""
    ratio = baseline / ours if ours else float("inf")
    verdict = (
        "" if target is None else (f"  target >= {target:.2f}x: " + ("OK" if ratio >= target else "MISSED"))
    )
    return (
        f"{name:<56} {units / ours:>12,.0f} {unit}/s  baseline {units / baseline:>12,.0f} {unit}/s  "
        f"ratio {ratio:5.2f}x{verdict}"
    )
