"""The Slurm/Sonar job state of a finished Grid Engine job, from its accounting record.

Sonar job records and cc-backend's stop_job carry Slurm's state words; Grid Engine has no such word, only
`failed` (why the execution daemon gave up, codes in `FAILED_CODES`, from `execution_states.h` and OCS's
sge_diagnostics(1)), `exit_status` (128 + n for signal n) and, from OCS 9.1.2 or Univa's `qdel_info`,
`deleted_by`. The first matching row decides:

| # | condition                                                                | state      |
|---|--------------------------------------------------------------------------|------------|
| 1 | failed 24 (migrating) or 25 (rescheduling): the job will run again       | REQUEUED   |
| 2 | failed 37: qmaster enforced a limit (h_rt)                               | TIMEOUT    |
| 3 | deleted_by is set (qdel)                                                 | CANCELLED  |
| 4 | failed 22: execd lost the running job, removed by force                  | NODE_FAIL  |
| 5 | killed by a signal (exit_status > 128 or failed 17) and ru_wallclock     | TIMEOUT    |
|   | reached the `h_rt`/`s_rt` the job requested (read from `category`)       |            |
| 6 | any other failed != 0 (setup steps, prolog/epilog, shepherd, 100 ...)    | FAILED     |
| 7 | exit_status != 0                                                         | FAILED     |
| 8 | otherwise                                                                | COMPLETED  |

Limits: before 9.1.2 there is no `deleted_by`, so a `qdel`ed job (typically failed 100, exit 137) looks like
any job killed by SIGKILL and maps to FAILED; an `h_vmem` kill cannot be told apart from other kills, so
OUT_OF_MEMORY is never produced. Row 5 only fires when the category shows the limit that was reached.
"""

from __future__ import annotations

import re

from hpcbus.schemas.ocs.record import AccountingRecord

__all__ = ["FAILED_CODES", "STATES", "job_state", "requested_runtime"]

STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "REQUEUED")
"""Every value `job_state` returns (a subset of Slurm's job states)."""

FAILED_CODES: dict[int, str] = {
    0: "no failure",
    1: "assumedly before job",
    2: "on executing shepherd",
    3: "before writing config",
    4: "before writing pid",
    5: "on reading config file",
    6: "setting processor set",
    7: "before prolog",
    8: "in prolog",
    9: "before pestart",
    10: "in pestart",
    11: "before job",
    12: "before pestop",
    13: "in pestop",
    14: "before epilog",
    15: "in epilog",
    16: "releasing processor set",
    17: "through signal",
    18: "shepherd returned error",
    19: "before writing exit_status",
    20: "found unexpected error file",
    21: "in recognizing job",
    22: "removed manually (execd lost the running job)",
    23: "PTF could not read the job's process ids",
    24: "migrating",
    25: "rescheduling",
    26: "opening input/output file",
    27: "searching requested shell",
    28: "changing into working directory",
    29: "setting up AFS credentials",
    30: "application error (exit status 100)",
    31: "accessing sgepasswd file",
    32: "entry is missing in password file",
    33: "wrong password",
    34: "communicating with the helper service",
    35: "before job in the helper service",
    36: "checking configured daemons",
    37: "qmaster enforced h_rt limit",
    38: "setting the additional group id",
    100: "assumedly after job",
}
"""Grid Engine's `failed` codes and what they mean (`qacct -j` prints the same words)."""

_REQUEUED = frozenset((24, 25))
_SIGNAL_FAILURE = 17
_LIMIT_ENFORCED = 37
_EXECD_LOST = 22
_RUNTIME_LIMIT = re.compile(r"(?:^|[\s,])[hs]_rt=([0-9]+(?::[0-9]+){0,2})(?=$|[\s,])")


def job_state(record: AccountingRecord) -> str:
    """The Slurm job state word for `record` (one of `STATES`), by the table in the module docstring."""
    failed = record.failed
    if failed in _REQUEUED:
        return "REQUEUED"
    if failed == _LIMIT_ENFORCED:
        return "TIMEOUT"
    if record.deleted_by:
        return "CANCELLED"
    if failed == _EXECD_LOST:
        return "NODE_FAIL"
    if record.exit_status > 128 or failed == _SIGNAL_FAILURE:
        limit = requested_runtime(record.category)
        if limit is not None and record.ru_wallclock >= limit:
            return "TIMEOUT"
    if failed != 0 or record.exit_status != 0:
        return "FAILED"
    return "COMPLETED"


def requested_runtime(category: str | None) -> int | None:
    """The smallest `h_rt`/`s_rt` (seconds) in a job category such as `-l h_rt=3600,s_rt=1:00:00`.

    Grid Engine accepts seconds or `[[h:]m:]s`. `None` when the job requested no runtime limit.
    """
    if not category:
        return None
    limits = []
    for match in _RUNTIME_LIMIT.finditer(category):
        seconds = 0
        for part in match.group(1).split(":"):
            seconds = seconds * 60 + int(part)
        limits.append(seconds)
    return min(limits) if limits else None
