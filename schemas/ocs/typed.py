"""A typed decode of the usual OCS JSONL accounting record: msgspec checks every type while it reads.

Why: reading a record into dicts and checking each of its ~50 values in Python cost more than five times a
bare `json.loads`. Here msgspec decodes straight into structs that say what each key must be; a record
that does not fit them exactly (an unknown key, a custom usage container, the flat 9.0 development layout,
a float where an identifier must be whole, a null, any wrong type) makes `decode_usual` answer None, and
`parse_jsonl_line` reads it the general way, which names every bad key. When this decode succeeds, its
record is the one the general way builds (a test holds the two equal on the corpus and on odd records).
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

__all__ = ["UsualRecord", "decode_usual", "optional_text", "usual_fields"]

_NOT_SET = frozenset(("", "NONE", "none"))

_Number = int | float


class _Rusage(msgspec.Struct, forbid_unknown_fields=True):
    ru_wallclock: float = 0.0
    ru_utime: float = 0.0
    ru_stime: float = 0.0
    ru_maxrss: _Number = 0
    ru_ixrss: _Number = 0
    ru_ismrss: _Number = 0
    ru_idrss: _Number = 0
    ru_isrss: _Number = 0
    ru_minflt: _Number = 0
    ru_majflt: _Number = 0
    ru_nswap: _Number = 0
    ru_inblock: _Number = 0
    ru_oublock: _Number = 0
    ru_msgsnd: _Number = 0
    ru_msgrcv: _Number = 0
    ru_nsignals: _Number = 0
    ru_nvcsw: _Number = 0
    ru_nivcsw: _Number = 0


class _Eusage(msgspec.Struct, forbid_unknown_fields=True):
    wallclock: float | UnsetType = UNSET
    cpu: float = 0.0
    mem: float = 0.0
    io: float = 0.0
    ioops: _Number | UnsetType = UNSET
    iow: float = 0.0
    maxvmem: _Number = 0
    maxrss: _Number | UnsetType = UNSET
    maxpss: _Number | UnsetType = UNSET


class _Usage(msgspec.Struct, forbid_unknown_fields=True):
    rusage: _Rusage = msgspec.field(default_factory=_Rusage)
    eusage: _Eusage | UnsetType = UNSET
    usage: _Eusage | UnsetType = UNSET
    """OCS 9.0.0-9.0.5 name the eusage container `usage`."""


class UsualRecord(msgspec.Struct, forbid_unknown_fields=True):
    """The keys OCS 9.x writes, typed; optional strings default to "" (read as "not set", like `NONE`)."""

    job_number: int
    task_number: int = 0
    slots: int = 0
    priority: int = 0
    arid: int = 0
    failed: int = 0
    exit_status: int = 0
    submission_time: int = 0
    start_time: int = 0
    end_time: int = 0
    ar_submission_time: int = 0
    owner: str = ""
    group: str = ""
    account: str = ""
    qname: str = ""
    hostname: str = ""
    job_name: str = ""
    project: str = ""
    department: str = ""
    granted_pe: str = ""
    category: str = ""
    submit_cmd_line: str = ""
    deleted_by: str = ""
    pe_taskid: str = ""
    pe_task_id: str | UnsetType = UNSET
    usage: _Usage | UnsetType = UNSET
    time: Any = UNSET
    type: str = "acct"


_DECODER = msgspec.json.Decoder(UsualRecord)
_NO_EUSAGE = _Eusage()


def decode_usual(line: str | bytes) -> UsualRecord | None:
    """The record when it has the usual shape with every value of the right type, else None. Every number
    is finite: JSON has no NaN or infinity, and msgspec refuses numbers out of a double's range."""
    try:
        record = _DECODER.decode(line)
    except msgspec.DecodeError:  # ValidationError included: the general reader says what is wrong
        return None
    if record.type != "acct":
        return None
    usage = record.usage
    if usage is not UNSET and usage.usage is not UNSET:
        if usage.eusage is not UNSET:  # then `usage` is a custom container
            return None
        usage.eusage, usage.usage = usage.usage, UNSET
    return record


def optional_text(text: str) -> str | None:
    """Grid Engine writes `NONE` (older: `none`) or nothing for an unset string."""
    return None if text in _NOT_SET else text


def usual_fields(record: UsualRecord) -> tuple[dict[str, Any], dict[str, Any]]:
    """(fields, extra) of `schemas.ocs.accounting.AccountingRecord` for a record `decode_usual` read: what
    the general reader makes of the same keys (absent keys give the record's defaults)."""
    us = 1_000_000
    fields: dict[str, Any] = {
        "job_number": record.job_number,
        "task_number": record.task_number,
        "slots": record.slots,
        "priority": record.priority,
        "arid": record.arid,
        "failed": record.failed,
        "exit_status": record.exit_status,
        "submission_time": record.submission_time // us,
        "start_time": record.start_time // us,
        "end_time": record.end_time // us,
        "ar_submission_time": record.ar_submission_time // us,
        "owner": record.owner,
        "group": record.group,
        "account": record.account,
        "qname": record.qname,
        "hostname": record.hostname,
        "job_name": record.job_name,
        "project": optional_text(record.project),
        "department": optional_text(record.department),
        "granted_pe": optional_text(record.granted_pe),
        "category": optional_text(record.category),
        "submit_cmd_line": optional_text(record.submit_cmd_line),
        "deleted_by": optional_text(record.deleted_by),
        "pe_taskid": optional_text(record.pe_taskid if record.pe_task_id is UNSET else record.pe_task_id),
    }
    usage = record.usage
    if usage is not UNSET:
        r, e = usage.rusage, usage.eusage if usage.eusage is not UNSET else _NO_EUSAGE
        fields.update(
            ru_wallclock=r.ru_wallclock,
            ru_utime=r.ru_utime,
            ru_stime=r.ru_stime,
            ru_maxrss=whole(r.ru_maxrss),
            ru_ixrss=whole(r.ru_ixrss),
            ru_ismrss=whole(r.ru_ismrss),
            ru_idrss=whole(r.ru_idrss),
            ru_isrss=whole(r.ru_isrss),
            ru_minflt=whole(r.ru_minflt),
            ru_majflt=whole(r.ru_majflt),
            ru_nswap=whole(r.ru_nswap),
            ru_inblock=whole(r.ru_inblock),
            ru_oublock=whole(r.ru_oublock),
            ru_msgsnd=whole(r.ru_msgsnd),
            ru_msgrcv=whole(r.ru_msgrcv),
            ru_nsignals=whole(r.ru_nsignals),
            ru_nvcsw=whole(r.ru_nvcsw),
            ru_nivcsw=whole(r.ru_nivcsw),
            wallclock=None if e.wallclock is UNSET else e.wallclock,
            cpu=e.cpu,
            mem=e.mem,
            io=e.io,
            ioops=optional(e.ioops),
            iow=e.iow,
            maxvmem=whole(e.maxvmem),
            maxrss=optional(e.maxrss),
            maxpss=optional(e.maxpss),
        )
    extra = {} if record.time is UNSET else {"time": record.time}
    return fields, extra


def whole(value: int | float) -> int:
    """A usage count some versions write as a double, rounded (as the general reader does)."""
    return value if type(value) is int else round(value)


def optional(value: int | float | UnsetType) -> int | None:
    """`whole` of an eusage value only some versions write; None when absent."""
    return None if isinstance(value, UnsetType) else whole(value)
