"""What job records say, into the running aggregates: cc-backend `start_job`/`stop_job`, Sonar jobs
envelopes, the node producer's `nodejob` start/end (`consumers/jobs/records.py` reads the lines), and the
small parsers of their values."""

from __future__ import annotations

from datetime import datetime
from typing import Final

from hpcbus.schemas.jobsummary.state import JobState, Limits, Node, State, job_of
from hpcbus.schemas.jobsummary.summary import Scheduler

__all__ = ["TERMINAL", "add_nodejob", "add_start", "add_stop", "sonar_time", "tres_count"]

TERMINAL: Final = frozenset(
    {
        "boot_fail",
        "cancelled",
        "completed",
        "deadline",
        "failed",
        "node_fail",
        "out_of_memory",
        "preempted",
        "revoked",
        "timeout",
    }
)
"""Slurm's end states (`schemas.slurm.values.TERMINAL_STATES`), lower case as cc-backend writes them."""


def add_start(
    state: State,
    cluster: str,
    job: str,
    now: float,
    *,
    user: str = "",
    account: str = "",
    partition: str = "",
    start: int = 0,
    hosts: list[str] | None = None,
    cores: int = 0,
    gpus: int = 0,
    mem_requested: int = 0,
    scheduler: Scheduler | None = None,
    job_state: str = "",
) -> JobState:
    """What a job record says (fields it does not carry are left as they are)."""
    j = job_of(state, cluster, job, now)
    j.record = True
    if scheduler is not None:
        j.scheduler = scheduler
    for attr, value in (
        ("user", user),
        ("account", account),
        ("partition", partition),
        ("start", start),
        ("cores", cores),
        ("gpus", gpus),
        ("mem_requested", mem_requested),
    ):
        if value:
            setattr(j, attr, value)
    if hosts:
        j.hosts = list(hosts)
    if job_state and not j.ended_at:
        j.state = job_state
    return j


def add_stop(
    state: State, cluster: str, job: str, now: float, *, end: int, job_state: str, start: int = 0
) -> JobState:
    """The job ended (stop_job, a terminal record, or its last node's `nodejob` end)."""
    j = job_of(state, cluster, job, now)
    if start and not j.start:
        j.start = start
    if end:
        j.end = end
    if job_state:
        j.state = job_state
    if not j.ended_at:
        j.ended_at = now
    return j


def add_nodejob(
    state: State,
    cluster: str,
    job: str,
    host: str,
    now: float,
    *,
    ended: bool,
    start: int,
    stop: int,
    user: str,
    hwthreads: int,
    accelerators: list[str],
    limits: Limits,
) -> JobState:
    """A node's view of the job; a job with no record ends when every node that saw it start saw it end."""
    j = job_of(state, cluster, job, now)
    if user and not j.user:
        j.user = user
    node = j.nodes.get(host)
    if node is None:
        if len(j.nodes) >= limits.max_nodes:
            return j
        node = j.nodes[host] = Node()
    if hwthreads:
        node.hwthreads = hwthreads
    if accelerators:
        node.accelerators = list(accelerators)
    if start:
        node.nodejob_start = start
    if ended and stop:
        node.nodejob_end = stop
    if not j.record and ended and not j.ended_at:
        started = [n for n in j.nodes.values() if n.nodejob_start]
        if started and all(n.nodejob_end for n in started):
            j.start = min(n.nodejob_start for n in started)
            j.end = max(n.nodejob_end for n in started)
            j.state = "ended"
            j.ended_at = now
    return j


def sonar_time(text: str) -> int:
    """Epoch seconds of a Sonar timestamp (`2026-03-03T15:36:57+02:00`), 0 when empty or unreadable."""
    if not text:
        return 0
    try:
        return int(datetime.fromisoformat(text).timestamp())
    except ValueError:
        return 0


def tres_count(tres: str, name: str) -> int:
    """`cpu=4,gres/gpu=2,...` -> the count of `name` (also `gres/gpu:a100=2` for `gres/gpu`), 0 if absent."""
    total = 0
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key == name or (name.startswith("gres/") and key.startswith(name + ":")):
            try:
                total += int(value)
            except ValueError:
                continue
    return total
