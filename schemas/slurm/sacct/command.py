"""The `sacct` command line Sonar runs, kept beside the column order the parser relies on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

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
