"""`sacct` output -> typed rows -> Sonar `SlurmJob` records.

Two text forms are read, both without a header line:
- `sacct -aP --noheader -o <fields>` (what Sonar runs): `|` between fields, nothing after the last one.
- `sacct --parsable --noheader --delimiter=X -o <fields>` (`-p`, e.g. hb-jobinfo's `☃` files): a delimiter
  after *every* field, so each line ends with one; pass `trailing_delimiter=True`.
A free-text column (JobName, Comment, ...) may itself contain the delimiter; when it is the last column the
excess parts are joined back into it (Sonar puts JobName last for exactly this reason).

Parsing and conversion are split: `parse_sacct` validates every column once and yields a `SacctRow` (or a
`Problem` naming the line and column, and goes on with the next line); `to_slurm_job` renders a row the way
Sonar 0.18.1 does (`sonar_compat=True`) or the way the spec means it (the default). The differences are
listed in `to_slurm_job`'s docstring and asserted by tests/test_slurm_sacct.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime, tzinfo
from typing import Any, Final

import msgspec

from schemas.problems import Problem
from schemas.slurm.values import (
    JobId,
    Limit,
    epoch_seconds,
    format_timestamp,
    parse_duration,
    parse_duration_sonar,
    parse_exit_code,
    parse_job_id,
    parse_job_id_raw,
    parse_reqmem,
    parse_size_kib,
    parse_state,
    parse_timelimit,
    parse_timelimit_raw,
    parse_timestamp,
    split_nodelist,
    to_extended_uint,
    whole_seconds,
)
from schemas.sonar.types import SacctData, SlurmJob

__all__ = [
    "SACCT_FIELDS",
    "SACCT_STATES",
    "SacctRow",
    "parse_sacct",
    "parse_sacct_line",
    "sacct_argv",
    "to_slurm_job",
]

SACCT_FIELDS: Final = (
    "JobID",
    "JobIDRaw",
    "User",
    "Account",
    "State",
    "Start",
    "End",
    "AveCPU",
    "AveDiskRead",
    "AveDiskWrite",
    "AveRSS",
    "AveVMSize",
    "ElapsedRaw",
    "ExitCode",
    "Layout",
    "MaxRSS",
    "MaxVMSize",
    "MinCPU",
    "ReqCPUS",
    "ReqMem",
    "ReqNodes",
    "Reservation",
    "Submit",
    "Suspended",
    "SystemCPU",
    "TimelimitRaw",
    "UserCPU",
    "NodeList",
    "Partition",
    "AllocTRES",
    "Priority",
    "JobName",
)
"""Sonar's `SACCT_FIELDS` (src/slurmjobs.rs), in its order; JobName last because it may contain `|`."""

SACCT_STATES: Final = ("CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "OUT_OF_MEMORY", "TIMEOUT")
"""The states Sonar asks sacct for (`-s`); it adds PENDING and RUNNING when asked for uncompleted jobs."""

KIND: Final = "sacct"

NONE_ASSIGNED: Final = "None assigned"
"""sacct's NodeList of a job that never got nodes (pending, or cancelled while pending)."""


def sacct_argv(
    start: str,
    end: str,
    *,
    fields: Sequence[str] = SACCT_FIELDS,
    states: Sequence[str] = (*SACCT_STATES, "PENDING", "RUNNING"),
) -> list[str]:
    """The argument vector Sonar uses (`sacct -aP -s STATES --noheader -o FIELDS -S start -E end`).

    Kept beside the parser so the command and the column order it relies on cannot drift apart; the
    producer runs it. `start`/`end` are anything sacct accepts (`now-90minutes`, `2025-09-01`).
    """
    return ["sacct", "-aP", "-s", ",".join(states), "--noheader", "-o", ",".join(fields), "-S", start, "-E", end]


class SacctRow(msgspec.Struct, kw_only=True):
    """One sacct line, every known column parsed; a column that was empty keeps its default.

    Times are aware datetimes (sacct prints local time; `parse_sacct` attaches the caller's zone).
    Durations are seconds, an `int` when sacct printed whole seconds and a `float` when it printed a
    fraction (see `values.parse_duration` for why the type matters). Sizes are KiB.
    """

    line: int = 0
    """1-based line number in the parsed text, for messages."""
    job: JobId | None = None
    """JobID: the displayed id, with array/het/step structure."""
    job_id_raw: int | None = None
    """The job's own id from JobIDRaw (differs from `job.base` for array tasks and later het components)."""
    step_raw: str = ""
    """The step from JobIDRaw (same as `job.step`)."""
    job_name: str = ""
    user: str = ""
    """Empty on step rows: sacct reports the user on the job row only."""
    account: str = ""
    partition: str = ""
    reservation: str = ""
    layout: str = ""
    """Layout (`Cyclic`, `Block`, `Unknown`), Sonar's `distribution`."""
    state: str = ""
    """The state word, without `by <uid>`."""
    cancelled_by: int | None = None
    """The uid of `CANCELLED by <uid>`."""
    submit: datetime | None = None
    eligible: datetime | None = None
    start: datetime | None = None
    end: datetime | None = None
    elapsed_raw: int | None = None
    elapsed: int | float | None = None
    suspended: int | float | None = None
    user_cpu: int | float | None = None
    system_cpu: int | float | None = None
    total_cpu: int | float | None = None
    cpu_time: int | float | None = None
    ave_cpu: int | float | None = None
    min_cpu: int | float | None = None
    ave_disk_read: int | None = None
    ave_disk_write: int | None = None
    ave_rss: int | None = None
    ave_vmsize: int | None = None
    max_rss: int | None = None
    max_vmsize: int | None = None
    max_disk_read: int | None = None
    max_disk_write: int | None = None
    exit_status: int | None = None
    exit_signal: int | None = None
    req_cpus: int | None = None
    req_nodes: int | None = None
    alloc_cpus: int | None = None
    """NCPUS / AllocCPUS."""
    nnodes: int | None = None
    ntasks: int | None = None
    priority: int | None = None
    req_mem_kib: int | None = None
    req_mem_per_cpu: bool = False
    """True for an old-style `4000Mc` ReqMem: `req_mem_kib` is then per CPU, not per node."""
    time_limit: Limit = None
    """Minutes, `UNLIMITED`, or None (empty column or `Partition_Limit`)."""
    node_list: str = ""
    """NodeList as printed (a hostlist); empty for `None assigned`."""
    alloc_tres: str = ""
    req_tres: str = ""
    extra: dict[str, str] = {}
    """Columns this parser has no field for, verbatim, by their name as given in `fields`."""

    @property
    def job_id(self) -> int:
        """The job's own id: JobIDRaw's when present, else JobID's leading number (right unless array/het)."""
        if self.job_id_raw is not None:
            return self.job_id_raw
        if self.job is None:
            raise ValueError(f"line {self.line}: neither JobIDRaw nor JobID was parsed")
        return self.job.base

    @property
    def step(self) -> str:
        """The step name (`batch`, `extern`, `0`, ...); empty for the job row."""
        if self.job_id_raw is not None:
            return self.step_raw
        return self.job.step if self.job is not None else ""


# --- column handlers: each parses one non-empty column value into the row's keyword arguments ------------

_Handler = Callable[[str, dict[str, Any], tzinfo], None]


def _str(attr: str) -> _Handler:
    def handle(value: str, kw: dict[str, Any], tz: tzinfo) -> None:
        kw[attr] = value

    return handle


def _int(attr: str) -> _Handler:
    def handle(value: str, kw: dict[str, Any], tz: tzinfo) -> None:
        if value.isdigit():
            kw[attr] = int(value)
        elif value == "Unknown":
            kw[attr] = 0
        else:
            raise ValueError(f"{value!r} is not an unsigned integer")

    return handle


def _duration(attr: str) -> _Handler:
    def handle(value: str, kw: dict[str, Any], tz: tzinfo) -> None:
        kw[attr] = 0 if value == "Unknown" else parse_duration(value)

    return handle


def _size(attr: str) -> _Handler:
    def handle(value: str, kw: dict[str, Any], tz: tzinfo) -> None:
        kw[attr] = 0 if value == "Unknown" else parse_size_kib(value)

    return handle


def _time(attr: str) -> _Handler:
    def handle(value: str, kw: dict[str, Any], tz: tzinfo) -> None:
        kw[attr] = parse_timestamp(value, tz)

    return handle


def _job_id(value: str, kw: dict[str, Any], tz: tzinfo) -> None:
    kw["job"] = parse_job_id(value)


def _job_id_raw(value: str, kw: dict[str, Any], tz: tzinfo) -> None:
    kw["job_id_raw"], kw["step_raw"] = parse_job_id_raw(value)


def _state(value: str, kw: dict[str, Any], tz: tzinfo) -> None:
    kw["state"], kw["cancelled_by"] = parse_state(value)


def _exit_code(value: str, kw: dict[str, Any], tz: tzinfo) -> None:
    kw["exit_status"], kw["exit_signal"] = parse_exit_code(value)


def _req_mem(value: str, kw: dict[str, Any], tz: tzinfo) -> None:
    kw["req_mem_kib"], kw["req_mem_per_cpu"] = parse_reqmem(value)


def _timelimit_raw(value: str, kw: dict[str, Any], tz: tzinfo) -> None:
    kw["time_limit"] = parse_timelimit_raw(value)


def _timelimit(value: str, kw: dict[str, Any], tz: tzinfo) -> None:
    kw["time_limit"] = parse_timelimit(value)


def _node_list(value: str, kw: dict[str, Any], tz: tzinfo) -> None:
    if value != NONE_ASSIGNED:
        split_nodelist(value)  # validate once here, so renderers can trust the text
        kw["node_list"] = value


_HANDLERS: Final[dict[str, _Handler]] = {
    "jobid": _job_id,
    "jobidraw": _job_id_raw,
    "jobname": _str("job_name"),
    "user": _str("user"),
    "account": _str("account"),
    "partition": _str("partition"),
    "reservation": _str("reservation"),
    "layout": _str("layout"),
    "state": _state,
    "submit": _time("submit"),
    "eligible": _time("eligible"),
    "start": _time("start"),
    "end": _time("end"),
    "elapsedraw": _int("elapsed_raw"),
    "elapsed": _duration("elapsed"),
    "suspended": _duration("suspended"),
    "usercpu": _duration("user_cpu"),
    "systemcpu": _duration("system_cpu"),
    "totalcpu": _duration("total_cpu"),
    "cputime": _duration("cpu_time"),
    "avecpu": _duration("ave_cpu"),
    "mincpu": _duration("min_cpu"),
    "avediskread": _size("ave_disk_read"),
    "avediskwrite": _size("ave_disk_write"),
    "averss": _size("ave_rss"),
    "avevmsize": _size("ave_vmsize"),
    "maxrss": _size("max_rss"),
    "maxvmsize": _size("max_vmsize"),
    "maxdiskread": _size("max_disk_read"),
    "maxdiskwrite": _size("max_disk_write"),
    "exitcode": _exit_code,
    "reqcpus": _int("req_cpus"),
    "reqnodes": _int("req_nodes"),
    "ncpus": _int("alloc_cpus"),
    "alloccpus": _int("alloc_cpus"),
    "nnodes": _int("nnodes"),
    "ntasks": _int("ntasks"),
    "priority": _int("priority"),
    "reqmem": _req_mem,
    "timelimitraw": _timelimit_raw,
    "timelimit": _timelimit,
    "nodelist": _node_list,
    "alloctres": _str("alloc_tres"),
    "reqtres": _str("req_tres"),
}

_FREE_TEXT: Final = frozenset({"jobname", "comment", "admincomment", "systemcomment", "submitline", "workdir"})
"""Columns whose value is arbitrary user text and may contain the delimiter (only repairable when last)."""


class _Plan:
    """What to do with each column of a field list, worked out once per parse, not per line."""

    __slots__ = ("extras", "fields", "handlers", "header", "joinable", "width")

    def __init__(self, fields: Sequence[str]):
        if not fields:
            raise ValueError("sacct field list is empty")
        self.fields = tuple(fields)
        self.width = len(fields)
        lower = [f.lower() for f in fields]
        if len(set(lower)) != len(lower):
            raise ValueError(f"sacct field list repeats a field: {','.join(fields)}")
        self.handlers = [(i, name, _HANDLERS[key]) for i, (name, key) in enumerate(zip(fields, lower)) if key in _HANDLERS]
        self.extras = [(i, name) for i, (name, key) in enumerate(zip(fields, lower)) if key not in _HANDLERS]
        self.joinable = lower[-1] in _FREE_TEXT
        self.header = lower


def parse_sacct_line(
    line: str,
    fields: Sequence[str] | _Plan,
    tz: tzinfo,
    *,
    delimiter: str = "|",
    trailing_delimiter: bool = False,
    lineno: int = 0,
    place: str = "",
) -> SacctRow | Problem:
    """One line -> `SacctRow`, or a `Problem` naming the column and why. See `parse_sacct`."""
    plan = fields if isinstance(fields, _Plan) else _Plan(fields)
    if trailing_delimiter:
        if not line.endswith(delimiter):
            return Problem(
                f"line does not end with the delimiter {delimiter!r} (expected sacct --parsable output)",
                place=place,
                line=lineno,
                kind=KIND,
            )
        line = line[: -len(delimiter)]
    parts = line.split(delimiter)
    width = plan.width
    if len(parts) != width:
        if len(parts) < width or not plan.joinable:
            return Problem(
                f"{len(parts)} fields, expected {width} ({delimiter.join(plan.fields)})",
                place=place,
                line=lineno,
                kind=KIND,
            )
        parts[width - 1 :] = [delimiter.join(parts[width - 1 :])]
    kw: dict[str, Any] = {"line": lineno}
    for i, name, handle in plan.handlers:
        value = parts[i]
        if value:
            try:
                handle(value, kw, tz)
            except ValueError as error:
                return Problem(str(error), place=place, line=lineno, kind=KIND, path=name)
    if plan.extras:
        kw["extra"] = {name: parts[i] for i, name in plan.extras}
    if "job" not in kw and "job_id_raw" not in kw:
        return Problem("no JobID or JobIDRaw: cannot tell which job this line is about", place=place, line=lineno, kind=KIND)
    return SacctRow(**kw)


def parse_sacct(
    text_or_lines: str | Iterable[str],
    fields: Sequence[str] = SACCT_FIELDS,
    tz: tzinfo | None = None,
    *,
    delimiter: str = "|",
    trailing_delimiter: bool = False,
    place: str = "",
) -> Iterator[SacctRow | Problem]:
    """Parse sacct output line by line; a bad line yields a `Problem` (with its line number) and parsing
    goes on, so one odd job never hides the others.

    `fields` is the `-o` list the command was run with, in order (names are matched case-insensitively,
    as sacct does; unknown names land in `SacctRow.extra`). `tz` is the zone sacct's local times are in;
    it is required because sacct prints no offset and guessing the host's zone is how timestamps end up
    an hour off. Blank lines are skipped, and so is a header line that repeats the field names.
    """
    if tz is None:
        raise ValueError("parse_sacct needs tz: sacct prints local times without an offset")
    plan = _Plan(fields)
    lines = text_or_lines.splitlines() if isinstance(text_or_lines, str) else text_or_lines
    for lineno, line in enumerate(lines, 1):
        line = line.rstrip("\r\n")
        if not line:
            continue
        if lineno == 1 or line[0].isalpha():
            body = line[: -len(delimiter)] if trailing_delimiter and line.endswith(delimiter) else line
            if [p.lower() for p in body.split(delimiter)] == plan.header:
                continue
        yield parse_sacct_line(
            line, plan, tz, delimiter=delimiter, trailing_delimiter=trailing_delimiter, lineno=lineno, place=place
        )


# --- rendering as Sonar SlurmJob --------------------------------------------------------------------------


def _name(value: str) -> str | None:
    """Sonar drops `Unknown` (and empty) for job_name, user_name, account and reservation."""
    return value if value and value != "Unknown" else None


def to_slurm_job(
    row: SacctRow,
    tz: tzinfo | None = None,
    *,
    sonar_compat: bool = False,
    requested_resources: Mapping[str, str] | None = None,
) -> SlurmJob:
    """Render a row as a Sonar `SlurmJob`, field for field as Sonar 0.18.1's `src/slurmjobs.rs` does.

    Both modes (these are real Sonar behaviour, kept because consumers rely on them):
    - `time_limit` = TimelimitRaw minutes * 60 + 2: Sonar emits *seconds* as an ExtendedUint although the
      spec says minutes; `UNLIMITED` -> 1. `priority` = Priority + 2.
    - `exit_code` is the status half of ExitCode, omitted when 0 (the signal half is dropped).
    - `nodes` is NodeList split at top-level commas, not expanded (each element a NodeRange).
    - `requested_memory_per_node` is ReqMem in KiB; an old per-CPU value (`4000Mc`) is left out, as Sonar
      does (it cannot parse it) - it is not a per-node amount.
    - Zero and empty values are omitted; `Unknown` is omitted for job_name, user_name, account, reservation.
    - `allocated_resources` and `sacct.AllocTRES` are both AllocTRES; `requested_resources` comes from
      `requested_resources[str(job id)]` (Sonar reads it from `scontrol show job`), if given.

    Only with `sonar_compat=True` (used by the golden test, deliberately wrong otherwise):
    - durations printed with a fraction (`14:50.006`) lose their whole seconds (-> 840); the default mode
      rounds to the nearest second (-> 890).
    - `job_state` is State verbatim (`CANCELLED by 2101037`); the default mode gives the bare word, as the
      spec asks.

    `tz`, when given, re-expresses the timestamps in that zone; by default they keep the zone `parse_sacct`
    was given (Sonar uses its own local offset, which is the same thing when both run on one host).
    """
    job_id = row.job_id
    if job_id <= 0:
        raise ValueError(f"line {row.line}: job id must be positive, got {job_id}")
    duration = parse_duration_sonar_value if sonar_compat else whole_seconds
    job = row.job

    def stamp(when: datetime | None) -> str:
        if when is None:
            return ""
        return format_timestamp(when.astimezone(tz) if tz is not None else when)

    state = row.state
    if sonar_compat and row.cancelled_by is not None:
        state = f"{state} by {row.cancelled_by}"

    sacct = SacctData(
        MinCPU=duration(row.min_cpu),
        AllocTRES=row.alloc_tres,
        AveCPU=duration(row.ave_cpu),
        AveDiskRead=row.ave_disk_read or 0,
        AveDiskWrite=row.ave_disk_write or 0,
        AveRSS=row.ave_rss or 0,
        AveVMSize=row.ave_vmsize or 0,
        ElapsedRaw=row.elapsed_raw or 0,
        SystemCPU=duration(row.system_cpu),
        UserCPU=duration(row.user_cpu),
        MaxRSS=row.max_rss or 0,
        MaxVMSize=row.max_vmsize or 0,
    )
    return SlurmJob(
        job_id=job_id,
        job_step=row.step,
        job_name=_name(row.job_name) or "",
        job_state=state,
        array_job_id=job.base if job is not None and job.is_array else 0,
        array_task_id=(job.array_task_id or 0) if job is not None else 0,
        het_job_id=job.base if job is not None and job.is_het else 0,
        het_job_offset=(job.het_offset or 0) if job is not None else 0,
        user_name=_name(row.user) or "",
        account=_name(row.account) or "",
        submit_time=stamp(row.submit),
        time_limit=_time_limit_sonar(row.time_limit),
        partition=row.partition,
        reservation=_name(row.reservation) or "",
        nodes=split_nodelist(row.node_list) if row.node_list else [],
        priority=to_extended_uint(row.priority) if row.priority is not None else 0,
        distribution=row.layout,
        requested_resources=(requested_resources or {}).get(str(job_id), ""),
        allocated_resources=row.alloc_tres,
        requested_cpus=row.req_cpus or 0,
        requested_memory_per_node=(row.req_mem_kib or 0) if not row.req_mem_per_cpu else 0,
        requested_node_count=row.req_nodes or 0,
        start_time=stamp(row.start),
        suspend_time=duration(row.suspended),
        end_time=stamp(row.end),
        exit_code=row.exit_status or 0,
        sacct=sacct if sacct != _EMPTY_SACCT else None,
    )


def parse_duration_sonar_value(value: int | float | None) -> int:
    """`values.parse_duration_sonar` applied to an already parsed duration (None -> 0)."""
    if value is None:
        return 0
    if isinstance(value, float):
        return int(value) // 60 * 60
    return value


def _time_limit_sonar(limit: Limit) -> int:
    """TimelimitRaw as Sonar emits it: minutes * 60 + 2 (seconds, ExtendedUint), UNLIMITED -> 1, none -> 0."""
    if isinstance(limit, int):
        return to_extended_uint(limit * 60)
    return to_extended_uint(limit)


_EMPTY_SACCT: Final = SacctData()


def epoch(when: datetime | None) -> int:
    """Unix seconds of a row time, 0 when unset (re-exported for producers that need both forms)."""
    return epoch_seconds(when)


_ = parse_duration_sonar  # the text-level twin of parse_duration_sonar_value, documented in values.py
