"""Fold the accounting records of one job (array task) into one record.

Grid Engine writes several accounting lines for one job when it is a tightly integrated parallel job without
`accounting_summary` (one line for the master task, one per `qrsh -inherit` PE task, each with its own host
and usage) and when intermediate accounting splits a long job at midnight (several lines for the same task,
each holding only the usage since the previous one). A job view needs one record with the job's total use.

The rule (records are grouped by `(job_number, task_number)`; exact duplicates, e.g. a line read twice, are
counted once):

| fields                                                        | merged value                                 |
|---------------------------------------------------------------|----------------------------------------------|
| cpu, mem, io, iow, ioops, ru_utime, ru_stime, ru_ixrss,       | sum (amounts used; the parts are disjoint    |
| ru_ismrss, ru_idrss, ru_isrss, ru_minflt ... ru_nivcsw        | processes or disjoint intervals)             |
| maxvmem, maxrss, maxpss, ru_maxrss                            | max (peaks do not add up across records)     |
| submission_time, start_time                                   | min of those that are set (non-zero)         |
| end_time                                                      | max                                          |
| ru_wallclock, wallclock                                       | max(end) - min(start) when both are known,   |
|                                                               | else the largest part (elapsed, not summed)  |
| slots                                                         | max                                          |
| hosts                                                         | sorted union                                 |
| custom_usage                                                  | per key: max for keys named `max*`, else sum |
| every other field (owner, hostname, failed, exit_status, ...) | from the master record                       |
| deleted_by                                                    | master's, else the first one set             |
| extra                                                         | union, the master's values winning           |
| pe_taskid                                                     | None (the result is the job)                 |
| merged_records                                                | sum                                          |

The master record is the one without `pe_taskid` (the job script's own); with several (intermediate records,
or restarts after a failed start), the one that ended last; without any (only PE tasks seen so far), the
record that ended last.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Iterable

import msgspec

from hpcbus.schemas.ocs.record import RUSAGE_INT, AccountingRecord

__all__ = ["merge_job", "merge_jobs"]

_SUMMED_FLOAT = ("cpu", "mem", "io", "iow", "ru_utime", "ru_stime")
_SUMMED_INT = tuple(name for name in RUSAGE_INT if name != "ru_maxrss")  # a peak, not an amount
_COLUMNS = (
    *("start_time", "submission_time", "end_time", "slots", "hosts", "deleted_by", "merged_records"),
    *("ru_maxrss", "maxvmem", "maxrss", "maxpss", "ioops", "ru_wallclock", *_SUMMED_FLOAT, *_SUMMED_INT),
)
_VALUES = operator.attrgetter(*_COLUMNS)
"""A record's values of `_COLUMNS`, in one call (in C)."""


def merge_jobs(records: Iterable[AccountingRecord]) -> list[AccountingRecord]:
    """Group records by `(job_number, task_number)` and merge each group; sorted by that key."""
    groups: dict[tuple[int, int], list[AccountingRecord]] = defaultdict(list)
    for record in records:
        groups[(record.job_number, record.task_number)].append(record)
    return [merge_job(groups[key]) for key in sorted(groups)]


def merge_job(records: Iterable[AccountingRecord]) -> AccountingRecord:
    """One record for the records of one job (array task), by the rule in the module docstring.

    Raises `ValueError` when `records` is empty or mixes jobs.
    """
    parts: list[AccountingRecord] = []
    for record in records:
        if record not in parts:
            parts.append(record)
    if not parts:
        raise ValueError("merge_job needs at least one accounting record")
    keys = {(r.job_number, r.task_number) for r in parts}
    if len(keys) > 1:
        raise ValueError(f"merge_job got records of several jobs (job_number, task_number): {sorted(keys)}")
    if len(parts) == 1:
        return parts[0]

    masters = [r for r in parts if r.pe_taskid is None] or parts
    master = max(masters, key=lambda r: r.end_time)  # ties: the first given

    # the parts' values field by field (one transposition, in C), in the order of `parts`
    column = dict(zip(_COLUMNS, zip(*map(_VALUES, parts), strict=True), strict=True))
    started = [t for t in column["start_time"] if t > 0]
    submitted = [t for t in column["submission_time"] if t > 0]
    start = min(started, default=0)
    end = max(column["end_time"])
    span = end - start if start > 0 and end >= start else None

    changes: dict[str, object] = {
        "pe_taskid": None,
        "start_time": start,
        "end_time": end,
        "submission_time": min(submitted, default=0),
        "slots": max(column["slots"]),
        "hosts": tuple(sorted({h for hosts in column["hosts"] for h in hosts})),
        "deleted_by": master.deleted_by or next((d for d in column["deleted_by"] if d), None),
        "merged_records": sum(column["merged_records"]),
        "ru_maxrss": max(column["ru_maxrss"]),
        "maxvmem": max(column["maxvmem"]),
        "maxrss": _max_optional(column["maxrss"]),
        "maxpss": _max_optional(column["maxpss"]),
        "ioops": _sum_optional(column["ioops"]),
        "ru_wallclock": float(span) if span is not None else max(column["ru_wallclock"]),
        "wallclock": _wallclock(parts, span),
        "custom_usage": _merge_custom(parts),
        "extra": _merge_extra(parts, master),
    }
    for name in (*_SUMMED_FLOAT, *_SUMMED_INT):
        changes[name] = sum(column[name])
    return msgspec.structs.replace(master, **changes)


def _max_optional(values: Iterable[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return max(present) if present else None


def _sum_optional(values: Iterable[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _wallclock(parts: list[AccountingRecord], span: int | None) -> float | None:
    present = [r.wallclock for r in parts if r.wallclock is not None]
    if not present:
        return None
    return float(span) if span is not None else max(present)


def _merge_custom(parts: list[AccountingRecord]) -> dict[str, dict[str, float]]:
    merged: dict[str, dict[str, float]] = {}
    for record in parts:
        for container, values in record.custom_usage.items():
            target = merged.setdefault(container, {})
            for key, value in values.items():
                if key not in target:
                    target[key] = value
                elif key.startswith("max"):
                    target[key] = max(target[key], value)
                else:
                    target[key] += value
    return merged


def _merge_extra(parts: list[AccountingRecord], master: AccountingRecord) -> dict[str, object]:
    merged: dict[str, object] = {}
    for record in parts:
        for key, value in record.extra.items():
            merged.setdefault(key, value)
    merged.update(master.extra)
    return merged
