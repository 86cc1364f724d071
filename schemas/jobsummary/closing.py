"""When jobs are closed, and closing one: fold its open samples, summarise it, move it to the outbox and
remember it (so that what comes for it late is dropped)."""

from __future__ import annotations

import itertools

import msgspec

from hpcbus.schemas.jobsummary.flags import Thresholds
from hpcbus.schemas.jobsummary.metrics import fold_all
from hpcbus.schemas.jobsummary.state import Limits, State
from hpcbus.schemas.jobsummary.summarize import summarize
from hpcbus.schemas.jobsummary.summary import Closed, Summary

__all__ = ["Timing", "close", "due"]


class Timing(msgspec.Struct, kw_only=True, frozen=True):
    """When jobs are closed (the worker's settings fill it; seconds of the worker's clock)."""

    grace: float = 60.0
    stop_timeout: float = 3 * 86400.0
    process_quiet: float = 300.0
    record_wait: float = 300.0
    """A Slurm-keyed job (epoch 0) whose nodes saw it end waits this long for the batch system's records
    (`produce slurm` polls every minute, slurmdbd lags) before it is summarised without them."""
    max_jobs: int = 20_000


def due(state: State, now: float, timing: Timing) -> list[tuple[str, Closed]]:
    """The jobs to summarise now, and why: ended `grace` ago (`record_wait` for a Slurm job known only from
    its nodes); silent for `stop_timeout` though the batch
    system (or a node) announced them; process groups silent for `process_quiet`; the least recently active
    beyond `max_jobs`."""
    out: list[tuple[str, Closed]] = []
    for key, j in state.jobs.items():
        if j.ended_at:
            wait = timing.grace
            if not j.record and j.scheduler != "process":
                wait = max(wait, timing.record_wait)  # a short Slurm job's records come after its end
            if now - j.ended_at >= wait:
                out.append((key, "end"))
            continue
        quiet = now - j.active_at
        announced = j.record or any(n.nodejob_start for n in j.nodes.values())
        if announced:
            if quiet >= timing.stop_timeout:
                out.append((key, "stop_missing"))
        elif quiet >= timing.process_quiet:
            out.append((key, "end"))
    excess = len(state.jobs) - len(out) - timing.max_jobs
    if excess > 0:
        chosen = {key for key, _ in out}
        rest = sorted((j.active_at, key) for key, j in state.jobs.items() if key not in chosen)
        out.extend((key, "evicted") for _, key in rest[:excess])
    return out


def close(state: State, key: str, why: Closed, now: float, thresholds: Thresholds, limits: Limits) -> Summary:
    """Fold, summarise and move one job from `jobs` to `outbox`, remembering it in `closed`."""
    job = state.jobs.pop(key)
    fold_all(state, job, limits)
    if why == "end" and not job.ended_at and not job.record:
        job.state = job.state or "ended"  # a process group whose samples stopped
    summary = summarize(job, thresholds, limits, why)
    state.outbox[key] = summary
    state.closed[key] = now
    if len(state.closed) % 1024 == 0:
        old = now - limits.remember
        for k in [k for k, t in state.closed.items() if t < old]:
            del state.closed[k]
    excess = len(state.closed) - limits.max_remembered
    if (
        excess > 0
    ):  # the oldest first: `closed` is in the order jobs were closed (a sort per job was quadratic)
        for k in list(itertools.islice(state.closed, excess)):
            del state.closed[k]
    return summary
