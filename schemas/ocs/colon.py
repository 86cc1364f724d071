"""Grid Engine's colon-separated accounting lines, read into `schemas.ocs.accounting.AccountingRecord`.

Colon format (`old_accounting=true`, SGE 5.3 .. Univa 8.x). Columns by position; the layout is chosen by
the column count, timestamps' unit by their magnitude (Univa 8.x writes milliseconds):

| columns | writer                     | layout                                                               |
|---------|----------------------------|----------------------------------------------------------------------|
| 43      | SGE 6.0/6.1                | columns 1-43 below (no `arid`, `ar_submission_time`)                  |
| 45      | SGE 6.2+, SoGE, OCS        | columns 1-45 below (the man page order)                              |
| 46      | OGS/SGE 2011.x             | 1-45, then one more field (`NONE` in the sample), kept as `column_46` |
| 52-55   | Univa/Altair GE 8.x        | 1-45, then 46 `job_class`, 47 `qdel_info` (-> `deleted_by`),        |
|         |                            | 48 `maxrss` (bytes), 49 `maxpss`, 50 `submit_host`, 51 `cwd`,        |
|         |                            | 52 `submit_cmd` (-> `submit_cmd_line`), [53 `wallclock`, 54 `ioops`, |
|         |                            | 55 `bound_cores`]                                                    |

Columns 1-45: 1 qname, 2 hostname, 3 group, 4 owner, 5 job_name, 6 job_number, 7 account, 8 priority,
9 submission_time, 10 start_time, 11 end_time, 12 failed, 13 exit_status, 14 ru_wallclock, 15 ru_utime,
16 ru_stime, 17 ru_maxrss, 18 ru_ixrss, 19 ru_ismrss, 20 ru_idrss, 21 ru_isrss, 22 ru_minflt, 23 ru_majflt,
24 ru_nswap, 25 ru_inblock, 26 ru_oublock, 27 ru_msgsnd, 28 ru_msgrcv, 29 ru_nsignals, 30 ru_nvcsw,
31 ru_nivcsw, 32 project, 33 department, 34 granted_pe, 35 slots, 36 task_number, 37 cpu, 38 mem, 39 io,
40 category, 41 iow, 42 pe_taskid, 43 maxvmem, 44 arid, 45 ar_submission_time.

`NONE`/`none`/empty in a string column means "not set" (`None`). A reporting-file line (`<time>:acct:...`)
loses its two leading columns (the time goes to `extra["time"]`). A `:` inside the category would shift
every later column; SGE's own reader guesses around it, this parser refuses the line with a reason instead
of guessing (a wrong guess would put the category's text into `iow`).
"""

from __future__ import annotations

import math
from typing import Any

from hpcbus.schemas.ocs.record import (
    EUSAGE_FLOAT,
    EUSAGE_INT,
    KIND,
    RUSAGE_FLOAT,
    RUSAGE_INT,
    TIMES,
    AccountingRecord,
    build,
    invalid,
    is_skippable,
)
from hpcbus.schemas.ocs.typed import optional_text
from hpcbus.schemas.problems import InvalidInput, Problem

__all__ = ["COLON_COLUMNS", "parse_colon_line"]

COLON_COLUMNS: tuple[str, ...] = (
    "qname",
    "hostname",
    "group",
    "owner",
    "job_name",
    "job_number",
    "account",
    "priority",
    "submission_time",
    "start_time",
    "end_time",
    "failed",
    "exit_status",
    *RUSAGE_FLOAT,
    *RUSAGE_INT,
    "project",
    "department",
    "granted_pe",
    "slots",
    "task_number",
    "cpu",
    "mem",
    "io",
    "category",
    "iow",
    "pe_taskid",
    "maxvmem",
    "arid",
    "ar_submission_time",
)
"""The 45 columns of the man page, in order."""

_UNIVA_COLUMNS = (
    "job_class",
    "qdel_info",
    "maxrss",
    "maxpss",
    "submit_host",
    "cwd",
    "submit_cmd",
    "wallclock",
    "ioops",
    "bound_cores",
)
_COLON_LAYOUTS: dict[int, tuple[str, ...]] = {
    43: COLON_COLUMNS[:43],
    45: COLON_COLUMNS,
    46: (*COLON_COLUMNS, "column_46"),
    **{n: COLON_COLUMNS + _UNIVA_COLUMNS[: n - 45] for n in range(52, 56)},
}
_COLON_INT = frozenset(("job_number", "task_number", "slots", "priority", "arid", "failed", "exit_status"))
_COLON_OPTIONAL_STR = frozenset(("project", "department", "granted_pe", "category", "pe_taskid"))
_COLON_EXTRA = frozenset(("job_class", "submit_host", "cwd", "bound_cores", "column_46"))


def parse_colon_line(line: str) -> AccountingRecord:
    """Parse one colon-separated accounting line (43/45/46/52-55 columns, see the module docstring)."""
    if is_skippable(line):
        raise invalid("line", "blank or comment line: skip it with is_skippable()")
    columns = line.rstrip("\r\n").split(":")
    extra: dict[str, Any] = {}
    if len(columns) > 2 and columns[1] == "acct" and columns[0].isdigit():
        extra["time"] = int(columns[0])  # a reporting-file `acct` line: <time>:acct:<accounting record>
        columns = columns[2:]
    layout = _COLON_LAYOUTS.get(len(columns))
    if layout is None:
        raise invalid(
            "columns",
            f"has {len(columns)} colon-separated columns; known layouts have 43, 45, 46 or 52-55 "
            "(a ':' inside the category also changes the count)",
        )

    problems: list[Problem] = []
    fields: dict[str, Any] = {}
    raw_times: dict[str, int] = {}
    for number, (name, text) in enumerate(zip(layout, columns, strict=True), start=1):
        where = f"column {number}"
        if name in _COLON_EXTRA:
            extra[name] = text
        elif name == "qdel_info":
            fields["deleted_by"] = optional_text(text)
        elif name == "submit_cmd":
            fields["submit_cmd_line"] = optional_text(text)
        elif name in _COLON_OPTIONAL_STR:
            fields[name] = optional_text(text)
        elif name in TIMES:
            value = _colon_int(text, name, where, problems)
            if value is not None:
                raw_times[name] = value
        elif name in _COLON_INT or name in RUSAGE_INT or name in EUSAGE_INT:
            value = _colon_int(text, name, where, problems)
            if value is not None:
                fields[name] = value
        elif name in RUSAGE_FLOAT or name in EUSAGE_FLOAT:
            parsed = _colon_float(text, name, where, problems)
            if parsed is not None:
                fields[name] = parsed
        else:
            fields[name] = text
    if problems:
        raise InvalidInput(problems)

    divisor = _time_divisor(raw_times.values())
    for name, value in raw_times.items():
        fields[name] = value // divisor
    return build(fields, {}, extra, f"colon{len(layout)}")


def _colon_float(text: str, name: str, where: str, problems: list[Problem]) -> float | None:
    try:
        value = float(text)
    except ValueError:
        problems.append(Problem(kind=KIND, path=name, reason=f"{where}: {text!r} is not a number"))
        return None
    if not math.isfinite(value):
        problems.append(Problem(kind=KIND, path=name, reason=f"{where}: {text!r} is not a finite number"))
        return None
    return value


def _colon_int(text: str, name: str, where: str, problems: list[Problem]) -> int | None:
    """Integers; the `%f` columns of older writers (`1448.000000`) are rounded."""
    try:
        return int(text)
    except ValueError:
        value = _colon_float(text, name, where, problems)
        return None if value is None else round(value)


def _time_divisor(values: Any) -> int:
    """Seconds, milliseconds (Univa 8.x) or microseconds, judged by the largest timestamp of the record.

    10**11 s is the year 5138 and 10**11 ms is March 1973, so the bands cannot be confused for any real job.
    """
    largest = max(values, default=0)
    if largest >= 10**14:
        return 1_000_000
    if largest >= 10**11:
        return 1_000
    return 1
