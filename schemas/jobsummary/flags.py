"""The flag rules, written once: `summarize` applies them to a finished job's aggregates, `hpcbus report` to
the numbers it worked out from InfluxDB for a job that has no `job_summary` point. Also the thresholds'
one definition (defaults and bounds), which the settings of both commands (`[jobs]`, `[report]`) use."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Final, Protocol

import msgspec

__all__ = ["DEFAULT_THRESHOLDS", "FLAGS", "Percent", "Thresholds", "flags", "thresholds_of"]

FLAGS: Final = ("idle_gpu", "mem_overrequested", "cpu_underused", "no_samples", "stop_missing")
"""Flag names, in the order they are listed; InfluxDB has a bool field `flag_<name>` for each."""


class Thresholds(msgspec.Struct, kw_only=True, frozen=True):
    """Flag thresholds, percent (the worker's settings fill them)."""

    idle_gpu: float = 5.0
    mem_overrequested: float = 25.0
    cpu_underused: float = 25.0


DEFAULT_THRESHOLDS: Final = Thresholds()
"""The defaults of the settings' threshold keys (`idle_gpu`, `mem_overrequested`, `cpu_underused`)."""

Percent = Annotated[float, msgspec.Meta(ge=0.0, le=100.0)]
"""The type of a threshold key in the settings."""


class _HasThresholds(Protocol):
    @property
    def idle_gpu(self) -> float: ...
    @property
    def mem_overrequested(self) -> float: ...
    @property
    def cpu_underused(self) -> float: ...


def thresholds_of(settings: _HasThresholds) -> Thresholds:
    """The thresholds a command's settings name (their keys are `Thresholds`' fields)."""
    return Thresholds(
        idle_gpu=settings.idle_gpu,
        mem_overrequested=settings.mem_overrequested,
        cpu_underused=settings.cpu_underused,
    )


def flags(
    thresholds: Thresholds,
    *,
    samples: int,
    gpus: int | None,
    gpu_utils: Sequence[float | None],
    mem_peak: float | None,
    mem_requested: float | None,
    cpu_eff: float | None,
    stop_missing: bool = False,
) -> list[str]:
    """The flags of a job, names from `FLAGS` in that order.

    `samples`: the job's samples (0: none came); `gpus`: the cards it was allocated; `gpu_utils`: the mean
    utilisation (%) of each card seen, None for one never measured (a card allocated but not in `gpu_utils`
    counts as unused too); `mem_peak` / `mem_requested`: bytes; `cpu_eff`: %. Unknown (None) values raise
    no flag."""
    out: list[str] = []
    measured = sum(1 for util in gpu_utils if util is not None)
    if (
        gpus
        and samples
        and (any((util or 0.0) < thresholds.idle_gpu for util in gpu_utils) or measured < gpus)
    ):
        out.append("idle_gpu")
    if (
        mem_requested
        and mem_peak is not None
        and mem_peak < thresholds.mem_overrequested / 100 * mem_requested
    ):
        out.append("mem_overrequested")
    if cpu_eff is not None and cpu_eff < thresholds.cpu_underused:
        out.append("cpu_underused")
    if not samples:
        out.append("no_samples")
    if stop_missing:
        out.append("stop_missing")
    return out
