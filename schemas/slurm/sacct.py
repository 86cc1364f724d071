"""`sacct` output -> typed rows -> Sonar `SlurmJob` records.

Two text forms are read (normally run with `--noheader`; a header line is skipped anyway):
- `sacct -aP --noheader -o <fields>` (what Sonar runs): `|` between fields, nothing after the last one.
- `sacct --parsable --noheader --delimiter=X -o <fields>` (`-p`, e.g. hb-jobinfo's `☃` files): a delimiter
  after *every* field, so each line ends with one; pass `trailing_delimiter=True`.
A free-text column (JobName, Comment, ...) may itself contain the delimiter; when it is the last column the
excess parts are joined back into it (Sonar puts JobName last for exactly this reason).

Parsing and conversion are split: `parse_sacct` validates every column once and yields a `SacctRow` (or a
`Problem` naming the line and column, and goes on with the next line); `to_slurm_job` renders a row exactly
as Sonar 0.18.1 does (`sonar_compat=True`), or by default with Sonar's two data-losing bugs fixed while its
wire conventions (seconds in `time_limit`, omitted zeros, ...) are kept, since consumers of Sonar data
expect them. The differences are listed in `to_slurm_job`'s docstring and asserted by
tests/test_slurm_sacct.py.

Speed: the field list is turned into per-column parser lists once per call (`_Plan`), and the parsers of
columns whose values repeat (zeros, a job's times and nodes on each of its steps) are memoized for the
duration of one `parse_sacct` call.
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
    format_timestamp,
    parse_duration,
    parse_exit_code,
    parse_job_id,
    parse_job_id_raw,
    parse_reqmem,
    parse_size_kib,
    parse_state,
    parse_timelimit,
    parse_timelimit_raw,
    sonar_seconds,
    split_nodelist,
    timestamp_parser,
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
    return [
        "sacct",
        "-aP",
        "-s",
        ",".join(states),
        "--noheader",
        "-o",
        ",".join(fields),
        "-S",
        start,
        "-E",
        end,
    ]


class SacctRow(msgspec.Struct, kw_only=True, gc=False):
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
    """ReqMem in KiB: the job's total request since Slurm 21.08, per node (`Mn`) or per CPU (`Mc`) before."""
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


# --- columns ----------------------------------------------------------------------------------------------
# Each known column names the SacctRow attribute(s) it fills and the kind of parser it needs. `_Plan` turns
# a field list into three lists (plain strings, one-attribute parsers, two-attribute parsers) once per
# parse, so the per-line loop does no lookups by name.

_Parse = Callable[[str], Any]


def _uint(text: str) -> int:
    if text.isascii() and text.isdigit():
        return int(text)
    if text == "Unknown":
        return 0
    raise ValueError(f"{text!r} is not an unsigned integer")


def _unknown_is_zero(parse: _Parse) -> _Parse:
    def parse_or_zero(text: str) -> Any:
        return 0 if text == "Unknown" else parse(text)

    return parse_or_zero


def _node_list(text: str) -> str:
    if text == NONE_ASSIGNED:
        return ""
    split_nodelist(text)  # validated once here, so renderers can trust the text
    return text


_PARSERS: Final[dict[str, Callable[[tzinfo], _Parse]]] = {
    "uint": lambda tz: _uint,
    "duration": lambda tz: _unknown_is_zero(parse_duration),
    "size": lambda tz: _unknown_is_zero(parse_size_kib),
    "time": timestamp_parser,
    "jobid": lambda tz: parse_job_id,
    "jobidraw": lambda tz: parse_job_id_raw,
    "state": lambda tz: parse_state,
    "exitcode": lambda tz: parse_exit_code,
    "reqmem": lambda tz: parse_reqmem,
    "timelimitraw": lambda tz: parse_timelimit_raw,
    "timelimit": lambda tz: parse_timelimit,
    "nodelist": lambda tz: _node_list,
}

_MEMOIZED: Final = frozenset(
    {"duration", "size", "time", "state", "exitcode", "reqmem", "timelimitraw", "nodelist"}
)
"""Kinds whose values repeat across rows (zeros, a job's times and nodes on each of its steps): parsed once
per distinct text per parse. Job ids and plain integers are unique or cheap, so they are not cached."""

_MEMO_LIMIT: Final = 1 << 16
"""Distinct values remembered per column before the cache starts over (bounds memory on huge outputs)."""


def _memo(parse: _Parse) -> _Parse:
    cache: dict[str, Any] = {}
    miss = object()

    def lookup(text: str) -> Any:
        value = cache.get(text, miss)
        if value is miss:
            value = parse(text)  # raises before anything is cached
            if len(cache) >= _MEMO_LIMIT:
                cache.clear()
            cache[text] = value
        return value

    return lookup


_COLUMNS: Final[dict[str, tuple[tuple[str, ...], str]]] = {
    "jobid": (("job",), "jobid"),
    "jobidraw": (("job_id_raw", "step_raw"), "jobidraw"),
    "jobname": (("job_name",), "str"),
    "user": (("user",), "str"),
    "account": (("account",), "str"),
    "partition": (("partition",), "str"),
    "reservation": (("reservation",), "str"),
    "layout": (("layout",), "str"),
    "alloctres": (("alloc_tres",), "str"),
    "reqtres": (("req_tres",), "str"),
    "state": (("state", "cancelled_by"), "state"),
    "submit": (("submit",), "time"),
    "eligible": (("eligible",), "time"),
    "start": (("start",), "time"),
    "end": (("end",), "time"),
    "elapsedraw": (("elapsed_raw",), "uint"),
    "elapsed": (("elapsed",), "duration"),
    "suspended": (("suspended",), "duration"),
    "usercpu": (("user_cpu",), "duration"),
    "systemcpu": (("system_cpu",), "duration"),
    "totalcpu": (("total_cpu",), "duration"),
    "cputime": (("cpu_time",), "duration"),
    "avecpu": (("ave_cpu",), "duration"),
    "mincpu": (("min_cpu",), "duration"),
    "avediskread": (("ave_disk_read",), "size"),
    "avediskwrite": (("ave_disk_write",), "size"),
    "averss": (("ave_rss",), "size"),
    "avevmsize": (("ave_vmsize",), "size"),
    "maxrss": (("max_rss",), "size"),
    "maxvmsize": (("max_vmsize",), "size"),
    "maxdiskread": (("max_disk_read",), "size"),
    "maxdiskwrite": (("max_disk_write",), "size"),
    "exitcode": (("exit_status", "exit_signal"), "exitcode"),
    "reqcpus": (("req_cpus",), "uint"),
    "reqnodes": (("req_nodes",), "uint"),
    "ncpus": (("alloc_cpus",), "uint"),
    "alloccpus": (("alloc_cpus",), "uint"),
    "nnodes": (("nnodes",), "uint"),
    "ntasks": (("ntasks",), "uint"),
    "priority": (("priority",), "uint"),
    "reqmem": (("req_mem_kib", "req_mem_per_cpu"), "reqmem"),
    "timelimitraw": (("time_limit",), "timelimitraw"),
    "timelimit": (("time_limit",), "timelimit"),
    "nodelist": (("node_list",), "nodelist"),
}
"""sacct column (lower case) -> (SacctRow attributes it fills, parser kind; `str` = taken verbatim).
Timelimit/TimelimitRaw and NCPUS/AllocCPUS are aliases filling one attribute: list only one of a pair."""

_FREE_TEXT: Final = frozenset(
    {"jobname", "comment", "admincomment", "systemcomment", "submitline", "workdir"}
)
"""Columns whose value is arbitrary user text and may contain the delimiter (only repairable when last)."""


class _Plan:
    """What to do with each column of a field list in one zone, worked out once per parse, not per line."""

    __slots__ = ("extras", "fields", "header", "joinable", "pairs", "singles", "strings", "width")

    def __init__(self, fields: Sequence[str], tz: tzinfo):
        if not fields:
            raise ValueError("sacct field list is empty")
        self.fields = tuple(fields)
        self.width = len(fields)
        lower = [f.lower() for f in fields]
        if len(set(lower)) != len(lower):
            raise ValueError(f"sacct field list repeats a field: {','.join(fields)}")
        self.strings: list[tuple[int, str]] = []
        self.singles: list[tuple[int, str, _Parse]] = []
        self.pairs: list[tuple[int, str, str, _Parse]] = []
        self.extras: list[tuple[int, str]] = []
        for i, (name, key) in enumerate(zip(fields, lower, strict=True)):
            if key not in _COLUMNS:
                self.extras.append((i, name))
                continue
            attrs, kind = _COLUMNS[key]
            if kind == "str":
                self.strings.append((i, attrs[0]))
                continue
            parse = _PARSERS[kind](tz)
            if kind in _MEMOIZED:
                parse = _memo(parse)
            if len(attrs) == 1:
                self.singles.append((i, attrs[0], parse))
            else:
                self.pairs.append((i, attrs[0], attrs[1], parse))
        self.joinable = lower[-1] in _FREE_TEXT
        self.header = lower


def parse_sacct_line(
    line: str,
    fields: Sequence[str],
    tz: tzinfo,
    *,
    delimiter: str = "|",
    trailing_delimiter: bool = False,
    lineno: int = 0,
    place: str = "",
) -> SacctRow | Problem:
    """One line -> `SacctRow`, or a `Problem` naming the column and why. See `parse_sacct` (use that for
    many lines: it prepares the field list once)."""
    return _parse_line(line, _Plan(fields, tz), delimiter, trailing_delimiter, lineno, place)


def _parse_line(
    line: str, plan: _Plan, delimiter: str, trailing_delimiter: bool, lineno: int, place: str
) -> SacctRow | Problem:
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
    for i, attr in plan.strings:
        value = parts[i]
        if value:
            kw[attr] = value
    i = 0
    try:
        for i, attr, parse in plan.singles:
            value = parts[i]
            if value:
                kw[attr] = parse(value)
        for i, attr, attr2, parse in plan.pairs:
            value = parts[i]
            if value:
                kw[attr], kw[attr2] = parse(value)
    except ValueError as error:
        return Problem(str(error), place=place, line=lineno, kind=KIND, path=plan.fields[i])
    if plan.extras:
        extra = {name: parts[i] for i, name in plan.extras if parts[i]}
        if extra:
            kw["extra"] = extra
    if "job" not in kw and "job_id_raw" not in kw:
        return Problem(
            "no JobID or JobIDRaw: cannot tell which job this line is about",
            place=place,
            line=lineno,
            kind=KIND,
        )
    return SacctRow(**kw)


def parse_sacct(
    text_or_lines: str | Iterable[str],
    fields: Sequence[str],
    tz: tzinfo,
    *,
    delimiter: str = "|",
    trailing_delimiter: bool = False,
    place: str = "",
) -> Iterator[SacctRow | Problem]:
    """Parse sacct output line by line; a bad line yields a `Problem` (with its line number) and parsing
    goes on, so one odd job never hides the others.

    `fields` is the `-o` list the command was run with, in order (`SACCT_FIELDS` for Sonar's command; names
    match case-insensitively, as sacct's do; unknown names land in `SacctRow.extra`). `tz` is the zone of
    sacct's local times: required, because sacct prints no offset and guessing the host's zone is how
    timestamps end up an hour off. Blank lines are skipped, and so is a header line repeating the fields.
    """
    if not delimiter:
        raise ValueError("the sacct delimiter must not be empty")
    plan = _Plan(fields, tz)
    lines = text_or_lines.splitlines() if isinstance(text_or_lines, str) else text_or_lines
    for lineno, line in enumerate(lines, 1):
        line = line.rstrip("\r\n")
        if not line:
            continue
        if line[0].isalpha():
            body = line[: -len(delimiter)] if trailing_delimiter and line.endswith(delimiter) else line
            if [p.lower() for p in body.split(delimiter)] == plan.header:
                continue
        yield _parse_line(line, plan, delimiter, trailing_delimiter, lineno, place)


# --- rendering as Sonar SlurmJob --------------------------------------------------------------------------


def _name(value: str) -> str:
    """Sonar drops `Unknown` (and empty) for job_name, user_name, account and reservation."""
    return "" if value == "Unknown" else value


def _exact(value: int | float | None) -> int:
    return 0 if value is None else whole_seconds(value)


def _sonar(value: int | float | None) -> int:
    return 0 if value is None else sonar_seconds(value)


def _time_limit(limit: Limit) -> int:
    """TimelimitRaw as Sonar emits it: minutes * 60 + 2 (seconds, ExtendedUint), UNLIMITED -> 1, none -> 0."""
    return to_extended_uint(limit * 60 if isinstance(limit, int) else limit)


_EMPTY_SACCT: Final = SacctData()


def to_slurm_job(
    row: SacctRow,
    tz: tzinfo | None = None,
    *,
    sonar_compat: bool = False,
    requested_resources: Mapping[str, str] | None = None,
) -> SlurmJob:
    """Render a row as a Sonar `SlurmJob`, field for field as Sonar 0.18.1's `src/slurmjobs.rs` does.

    Both modes (real Sonar behaviour, kept because consumers of Sonar data rely on it):
    - `time_limit` = TimelimitRaw minutes * 60 + 2: Sonar emits *seconds* as an ExtendedUint although the
      spec says minutes; `UNLIMITED` -> 1. `priority` = Priority + 2.
    - `exit_code` is the status half of ExitCode, omitted when 0 (the signal half is dropped).
    - `nodes` is NodeList split at top-level commas, not expanded (each element a NodeRange).
    - `requested_memory_per_node` is ReqMem in KiB, which since Slurm 21.08 is the job's *total* request
      (the name is Sonar's); an old per-CPU value (`4000Mc`) is left out, as Sonar does (it cannot parse
      it), because it is no per-node amount.
    - Zero and empty values are omitted; `Unknown` is omitted for job_name, user_name, account, reservation.
    - `allocated_resources` and `sacct.AllocTRES` are both AllocTRES; `requested_resources` comes from
      `requested_resources[str(job id)]` (Sonar reads it from `scontrol show job`), if given.
    - `array_task_id` 0 and `het_job_offset` 0 are omitted like every zero (the first element of an array
      or het job is recognisable only by `array_job_id`/`het_job_id` being set).

    Only with `sonar_compat=True` (used by the golden test; deliberately wrong otherwise):
    - durations printed with a fraction (`14:50.006`) lose their whole seconds (-> 840); the default mode
      rounds to the nearest second (-> 890).
    - `job_state` is State verbatim (`CANCELLED by 2101037`); the default mode gives the bare word, as the
      spec asks.

    `tz`, when given, re-expresses the timestamps in that zone; by default they keep the zone `parse_sacct`
    was given (Sonar uses its own local offset, which is the same thing when both run on one host).
    Raises `ValueError` for a row Sonar's schema cannot carry (no Submit time, no State, job id 0).
    """
    job_id = row.job_id
    if job_id <= 0:
        raise ValueError(f"line {row.line}: job id must be positive, got {job_id}")
    if not row.state:
        raise ValueError(f"line {row.line}: job {job_id} has no State")
    if row.submit is None:
        raise ValueError(f"line {row.line}: job {job_id} has no Submit time")
    seconds = _sonar if sonar_compat else _exact
    job = row.job

    def stamp(when: datetime | None) -> str:
        if when is None:
            return ""
        return format_timestamp(when.astimezone(tz) if tz is not None else when)

    state = row.state
    if sonar_compat and row.cancelled_by is not None:
        state = f"{state} by {row.cancelled_by}"

    sacct = SacctData(
        min_cpu=seconds(row.min_cpu),
        alloc_tres=row.alloc_tres,
        ave_cpu=seconds(row.ave_cpu),
        ave_disk_read=row.ave_disk_read or 0,
        ave_disk_write=row.ave_disk_write or 0,
        ave_rss=row.ave_rss or 0,
        ave_vm_size=row.ave_vmsize or 0,
        elapsed_raw=row.elapsed_raw or 0,
        system_cpu=seconds(row.system_cpu),
        user_cpu=seconds(row.user_cpu),
        max_rss=row.max_rss or 0,
        max_vm_size=row.max_vmsize or 0,
    )
    return SlurmJob(
        job_id=job_id,
        job_step=row.step,
        job_name=_name(row.job_name),
        job_state=state,
        array_job_id=job.base if job is not None and job.is_array else 0,
        array_task_id=(job.array_task_id or 0) if job is not None else 0,
        het_job_id=job.base if job is not None and job.is_het else 0,
        het_job_offset=(job.het_offset or 0) if job is not None else 0,
        user_name=_name(row.user),
        account=_name(row.account),
        submit_time=stamp(row.submit),
        time_limit=_time_limit(row.time_limit),
        partition=row.partition,
        reservation=_name(row.reservation),
        nodes=split_nodelist(row.node_list) if row.node_list else [],
        priority=to_extended_uint(row.priority) if row.priority is not None else 0,
        distribution=row.layout,
        requested_resources=requested_resources.get(str(job_id), "") if requested_resources else "",
        allocated_resources=row.alloc_tres,
        requested_cpus=row.req_cpus or 0,
        requested_memory_per_node=0 if row.req_mem_per_cpu else row.req_mem_kib or 0,
        requested_node_count=row.req_nodes or 0,
        start_time=stamp(row.start),
        suspend_time=seconds(row.suspended),
        end_time=stamp(row.end),
        exit_code=row.exit_status or 0,
        sacct=None if sacct == _EMPTY_SACCT else sacct,
    )
