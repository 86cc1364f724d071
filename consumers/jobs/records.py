"""Job records off the bus into the running aggregates: cc-backend `start_job`/`stop_job`, Sonar jobs
envelopes (`slurm` events from `produce slurm`, `produce ocs` or a translated Sonar), `nodejob` events.

Each reader takes one event line and says what was wrong with it as a `Problem` (the caller reports it);
the aggregates only change for what a record really carries.
"""

from __future__ import annotations

import msgspec

from hpcbus.schemas import noderange
from hpcbus.schemas.ccbackend import read_start_job, read_stop_job
from hpcbus.schemas.jobsummary import (
    MEASUREMENT,
    TERMINAL,
    Limits,
    Scheduler,
    State,
    add_nodejob,
    add_start,
    add_stop,
    is_closed,
    job_key,
    sonar_time,
    tres_count,
)
from hpcbus.schemas.lineprotocol import Line
from hpcbus.schemas.nodejob import MEASUREMENT as NODEJOB
from hpcbus.schemas.nodejob import NodeJob
from hpcbus.schemas.problems import InvalidInput, Problem
from hpcbus.schemas.slurm.values import parse_state
from hpcbus.schemas.sonar import PartlyInvalid, decode_envelope
from hpcbus.schemas.sonar.types import JobsEnvelope, SlurmJob
from hpcbus.schemas.trust import nodejob_host_problem

OCS_ATTR = ("translated-from", "ocs-accounting")
"""The `meta.attrs` entry of jobs envelopes built from Grid Engine accounting (`produce ocs`)."""

READ = frozenset({"job", "slurm", NODEJOB})
"""Event measurements read here; every other event (and hpcbus' own `jobsummary`) is passed over."""
assert MEASUREMENT not in READ


def add_event(
    state: State, cluster: str, line: Line, now: float, limits: Limits, place: str
) -> list[Problem]:
    """Apply one event line; problems name `place` (the subject). Jobs already summarised (`closed`) are
    left alone: a redelivered or late record must not open them again."""
    payload = line.fields.get("event")
    if not isinstance(payload, str):
        return []
    function = line.tags.get("function", "")
    try:
        if line.measurement == "job" and function in ("start_job", "stop_job"):
            _cc_event(state, cluster, payload, function, now)
        elif line.measurement == "slurm" and function in ("sonar", "record"):
            refused = _slurm(state, cluster, payload, function, now)
            return [p.located(place, 0) for p in refused]
        elif line.measurement == NODEJOB and function in ("start", "end"):
            forged = nodejob_host_problem(line, cluster)
            if forged is not None:
                return [Problem(f"nodejob {function}: {forged}", place, kind="event", path="event")]
            _nodejob(state, cluster, payload, function == "end", now, limits)
    # RecursionError: msgspec's answer to JSON nested too deeply (a hostile event must not stop the worker)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, RecursionError) as exc:
        return [Problem(f"{line.measurement} {function}: {exc}", place, kind="event", path="event")]
    except InvalidInput as exc:
        return [p.located(place, 0) for p in exc.problems]
    return []


def _cc_event(state: State, cluster: str, payload: str, function: str, now: float) -> None:
    if function == "start_job":
        start = read_start_job(payload)
        key = str(start.job_id)
        if is_closed(state, cluster, key):
            return
        add_start(
            state,
            cluster,
            key,
            now,
            user=start.user,
            account=start.project,
            partition=start.partition,
            start=start.start_time,
            hosts=[r.hostname for r in start.resources],
            cores=start.num_hwthreads,
            gpus=start.num_acc,
            mem_requested=start.requested_memory * 1024 * 1024,
            job_state="running",
        )
        return
    stop = read_stop_job(payload)
    key = str(stop.job_id)
    if is_closed(state, cluster, key):
        return
    job = add_stop(
        state,
        cluster,
        key,
        now,
        end=stop.stop_time,
        job_state=stop.job_state or "completed",  # cc-backend's meaning of an empty state
        start=stop.start_time,
    )
    job.record = True


def _slurm(state: State, cluster: str, payload: str, function: str, now: float) -> list[Problem]:
    """Open the jobs of a Slurm record or jobs envelope; the problems of records refused alone (a bad host
    list, `PartlyInvalid`): the other records are still read."""
    refused: list[Problem] = []
    if function == "record":
        records = [msgspec.json.decode(payload, type=SlurmJob)]
        scheduler: Scheduler = "slurm"
    else:
        try:
            env = decode_envelope(payload, expect="job")
        except PartlyInvalid as exc:
            env, refused = exc.envelope, exc.problems
        if not isinstance(env, JobsEnvelope) or env.data is None:
            return refused
        ocs = any((a.key, a.value) == OCS_ATTR for a in env.meta.attrs)
        scheduler = "ocs" if ocs else "slurm"
        records = list(env.data.attributes.slurm_jobs)
    for record in records:
        if record.job_step:
            continue  # steps: the job's own record carries what a summary needs
        key = job_key(record.job_id)
        if is_closed(state, cluster, key):
            continue
        word = parse_state(record.job_state.split(" by ")[0])[0].lower() if record.job_state else ""
        tres = record.allocated_resources
        hosts = noderange.expand_all(n for n in record.nodes if noderange.is_valid(n))
        add_start(
            state,
            cluster,
            key,
            now,
            user=record.user_name,
            account=record.account,
            partition=record.partition,
            start=sonar_time(record.start_time),
            hosts=hosts,
            cores=tres_count(tres, "cpu") or record.requested_cpus,
            gpus=tres_count(tres, "gres/gpu"),
            mem_requested=record.requested_memory_per_node * 1024,
            scheduler=scheduler,
            job_state=word,
        )
        if word in TERMINAL:
            add_stop(state, cluster, key, now, end=sonar_time(record.end_time), job_state=word)
    return refused


def _nodejob(state: State, cluster: str, payload: str, ended: bool, now: float, limits: Limits) -> None:
    seen = msgspec.json.decode(payload, type=NodeJob)
    key = job_key(seen.job_id, seen.epoch)
    if is_closed(state, cluster, key):
        return
    add_nodejob(
        state,
        cluster,
        key,
        seen.hostname,
        now,
        ended=ended,
        start=seen.start_time,
        stop=seen.stop_time,
        user=seen.user,
        hwthreads=len(seen.hwthreads),
        accelerators=seen.accelerators,
        limits=limits,
    )
