"""The one shape of an OCS / Grid Engine accounting record (`AccountingRecord`), its field tables and the
checks every reader applies: what the JSONL reader (`schemas.ocs.accounting`) and the colon reader
(`schemas.ocs.colon`) share, so that neither reads the other's private names.

Units: see `schemas.ocs.accounting`.
"""

from __future__ import annotations

from typing import Any

import msgspec

from hpcbus.schemas.problems import InvalidInput, Problem

__all__ = [
    "EUSAGE_FLOAT",
    "EUSAGE_INT",
    "JOB_INT",
    "JOB_OPTIONAL_STR",
    "JOB_STR",
    "KIND",
    "RUSAGE_FLOAT",
    "RUSAGE_INT",
    "TIMES",
    "AccountingRecord",
    "build",
    "check_values",
    "invalid",
    "is_skippable",
]

KIND = "ocs accounting"
"""`Problem.kind` of every complaint from this module."""


class AccountingRecord(msgspec.Struct, frozen=True, gc=False):
    """One accounting record: one job, array task, PE task (or several merged by `schemas.ocs.merge`).

    Built by keyword everywhere but in `schemas.ocs.accounting._from_usual` (the hot path), which passes the
    fields by position in its `_FIELD_ORDER`. Not tracked by the garbage collector: its values (JSON values, numbers, strings) cannot
    refer back to it, and a chunk holds thousands of them.
    """

    job_number: int
    task_number: int = 0
    """Array task index; 0 for a job that is not an array."""
    pe_taskid: str | None = None
    """Set when the record is one task of a tightly integrated parallel job (`qrsh -inherit`)."""

    owner: str = ""
    group: str = ""
    account: str = ""
    project: str | None = None
    department: str | None = None
    qname: str = ""
    """Cluster queue (without `@host`)."""
    hostname: str = ""
    """Execution host of this record; for a merged job, the host of the master task."""
    hosts: tuple[str, ...] = ()
    """Every execution host the record covers: `(hostname,)` for a parsed line, the union after a merge."""

    job_name: str = ""
    granted_pe: str | None = None
    slots: int = 0
    priority: int = 0
    category: str | None = None
    """The job's resource request as Grid Engine summarises it, e.g. `-q all.q -l h_rt=3600`."""
    submit_cmd_line: str | None = None
    arid: int = 0
    """Advance reservation id, 0 when none."""

    submission_time: int = 0
    start_time: int = 0
    end_time: int = 0
    ar_submission_time: int = 0

    failed: int = 0
    """Grid Engine's failure code (0 = none); `schemas.ocs.state` explains the values."""
    exit_status: int = 0
    """Exit status of the job script; 128 + n when it died of signal n."""
    deleted_by: str | None = None
    """`user@host` (or `qmaster@...`, `execd@...`) that deleted the job: OCS >= 9.1.2, Univa `qdel_info`."""

    ru_wallclock: float = 0.0
    ru_utime: float = 0.0
    ru_stime: float = 0.0
    ru_maxrss: int = 0
    ru_ixrss: int = 0
    ru_ismrss: int = 0
    ru_idrss: int = 0
    ru_isrss: int = 0
    ru_minflt: int = 0
    ru_majflt: int = 0
    ru_nswap: int = 0
    ru_inblock: int = 0
    ru_oublock: int = 0
    ru_msgsnd: int = 0
    ru_msgrcv: int = 0
    ru_nsignals: int = 0
    ru_nvcsw: int = 0
    ru_nivcsw: int = 0

    wallclock: float | None = None
    """execd's wall clock (JSONL, Univa 8.2+); `None` where the format has no such value."""
    cpu: float = 0.0
    mem: float = 0.0
    io: float = 0.0
    ioops: int | None = None
    iow: float = 0.0
    maxvmem: int = 0
    maxrss: int | None = None
    maxpss: int | None = None

    custom_usage: dict[str, dict[str, float]] = msgspec.field(default_factory=dict)
    """Usage not modelled above, by container: site `usage_patterns`, or unknown keys of `rusage`/`eusage`."""
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    """Everything else the line carried (unknown JSON keys, vendor colon columns), verbatim."""
    source_format: str = "jsonl"
    """`jsonl` or `colon43`, `colon45`, `colon46`, `colon52` .. `colon55`: which layout was read."""
    merged_records: int = 1
    """How many accounting lines this record stands for (more than 1 after `schemas.ocs.merge`)."""


# --- field tables ---------------------------------------------------------------------------------------------

RUSAGE_FLOAT = ("ru_wallclock", "ru_utime", "ru_stime")
RUSAGE_INT = (
    "ru_maxrss",
    "ru_ixrss",
    "ru_ismrss",
    "ru_idrss",
    "ru_isrss",
    "ru_minflt",
    "ru_majflt",
    "ru_nswap",
    "ru_inblock",
    "ru_oublock",
    "ru_msgsnd",
    "ru_msgrcv",
    "ru_nsignals",
    "ru_nvcsw",
    "ru_nivcsw",
)
EUSAGE_FLOAT = ("wallclock", "cpu", "mem", "io", "iow")
EUSAGE_INT = ("ioops", "maxvmem", "maxrss", "maxpss")
TIMES = ("submission_time", "start_time", "end_time", "ar_submission_time")
JOB_INT = ("job_number", "task_number", "slots", "priority", "arid", "failed", "exit_status")
JOB_STR = ("owner", "group", "account", "qname", "hostname", "job_name")
JOB_OPTIONAL_STR = ("project", "department", "granted_pe", "category", "submit_cmd_line", "deleted_by")


def is_skippable(line: str) -> bool:
    """True for lines that carry no record: blank, one character or less (as the man page says), `#...`."""
    if len(line) > 1 and not line[0].isspace() and not line[-1].isspace():  # nothing to strip: no copy
        return line[0] == "#"
    stripped = line.strip()
    return len(stripped) <= 1 or stripped.startswith("#")


def build(
    fields: dict[str, Any], custom: dict[str, dict[str, float]], extra: dict[str, Any], source: str
) -> AccountingRecord:
    check_values(fields.get("job_number", 1), tuple(fields.get(name, 0) for name in TIMES))
    hostname = fields.get("hostname", "")
    return AccountingRecord(
        **fields,
        hosts=(hostname,) if hostname else (),
        custom_usage=custom,
        extra=extra,
        source_format=source,
    )


def check_values(job_number: int, times: tuple[int, ...]) -> None:
    """Raise `InvalidInput` naming a job number below 1 and each negative time (`times`: seconds, in the
    order of `TIMES`): values of the right type that no record has. The one rule of both JSONL readers
    and the colon reader."""
    if job_number > 0 and min(times) >= 0:
        return
    problems: list[Problem] = []
    if job_number <= 0:
        problems.append(Problem(kind=KIND, path="job_number", reason=f"must be positive, not {job_number}"))
    for name, value in zip(TIMES, times, strict=True):
        if value < 0:
            problems.append(Problem(kind=KIND, path=name, reason=f"must not be negative, not {value}"))
    raise InvalidInput(problems)


def invalid(path: str, reason: str) -> InvalidInput:
    return InvalidInput([Problem(kind=KIND, path=path, reason=reason)])
