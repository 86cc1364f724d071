"""A typed decode of the usual OCS JSONL accounting record: msgspec checks every type while it reads.

Why: reading a record into dicts and checking each of its ~50 values in Python cost more than five times a
bare `json.loads`. Here msgspec decodes straight into structs that say what each key must be; a record
that does not fit them exactly (an unknown key, a custom usage container, the flat 9.0 development layout,
a float where an identifier must be whole, a null, any wrong type) makes `decode_usual` answer None, and
`parse_jsonl_line` reads it the general way, which names every bad key. When this decode succeeds,
`schemas.ocs.accounting` builds its record straight from these values: the record the general way builds
(a test holds the two equal on the corpus and on odd records).
"""

from __future__ import annotations

from typing import Any, Final, Generic, TypeVar, cast

import msgspec
from msgspec import UNSET, UnsetType

__all__ = ["NO_EUSAGE", "NO_RUSAGE", "UsualRecord", "decode_usual", "optional", "optional_text", "whole"]

_NOT_SET = frozenset(("", "NONE", "none"))

_N = TypeVar("_N", int, float)
"""An rusage count: `int` in the strict decode (OCS writes them as integers), `int | float` in the lenient
one that reads the doubles other versions write (rounded by `_whole_counts`, as the general reader does)."""


class _Rusage(msgspec.Struct, Generic[_N], frozen=True, forbid_unknown_fields=True, gc=False):
    ru_wallclock: float = 0.0
    ru_utime: float = 0.0
    ru_stime: float = 0.0
    ru_maxrss: _N = 0
    ru_ixrss: _N = 0
    ru_ismrss: _N = 0
    ru_idrss: _N = 0
    ru_isrss: _N = 0
    ru_minflt: _N = 0
    ru_majflt: _N = 0
    ru_nswap: _N = 0
    ru_inblock: _N = 0
    ru_oublock: _N = 0
    ru_msgsnd: _N = 0
    ru_msgrcv: _N = 0
    ru_nsignals: _N = 0
    ru_nvcsw: _N = 0
    ru_nivcsw: _N = 0


class _Eusage(msgspec.Struct, frozen=True, forbid_unknown_fields=True, gc=False):
    """OCS writes `maxvmem` and `maxrss` as doubles (`21049344.0`): these counts are read as either."""

    wallclock: float | UnsetType = UNSET
    cpu: float = 0.0
    mem: float = 0.0
    io: float = 0.0
    ioops: int | float | UnsetType = UNSET
    iow: float = 0.0
    maxvmem: int | float = 0
    maxrss: int | float | UnsetType = UNSET
    maxpss: int | float | UnsetType = UNSET


class _Usage(msgspec.Struct, Generic[_N], forbid_unknown_fields=True, gc=False):
    rusage: _Rusage[_N] = msgspec.field(default_factory=_Rusage)
    eusage: _Eusage | UnsetType = UNSET
    usage: _Eusage | UnsetType = UNSET
    """OCS 9.0.0-9.0.5 name the eusage container `usage`."""


class UsualRecord(msgspec.Struct, Generic[_N], forbid_unknown_fields=True, gc=False):
    """The keys OCS 9.x writes, typed; optional strings default to "" (read as "not set", like `NONE`).
    `UsualRecord[int]` is what `decode_usual` returns: every usage count a whole number."""

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
    usage: _Usage[_N] | UnsetType = UNSET
    time: Any = UNSET
    type: str = "acct"


_STRICT = msgspec.json.Decoder(UsualRecord[int])
_LENIENT = msgspec.json.Decoder(UsualRecord[int | float])
NO_RUSAGE: Final[_Rusage[int]] = _Rusage()
NO_EUSAGE: Final = _Eusage()
"""The usage of a record without one (or without eusage): every value gives the record's default."""


def decode_usual(line: str | bytes) -> UsualRecord[int] | None:
    """The record when it has the usual shape with every value of the right type, else None. Every number
    is finite: JSON has no NaN or infinity, and msgspec refuses numbers out of a double's range. Bytes that
    are not UTF-8 give None too (msgspec raises UnicodeDecodeError for them, in either decode): the caller
    decodes those.
    rusage counts written as doubles are read by a second, lenient decode and rounded (`_whole_counts`), so
    the usual record pays for no check of its fifteen counts."""
    try:
        record = _STRICT.decode(line)
    except msgspec.ValidationError:  # a double among the counts, or a value the general reader names
        try:
            record = _whole_counts(_LENIENT.decode(line))
        # ValidationError included (the general reader says why); bad bytes too: the lenient decode reads
        # on past where the strict one stopped, and may meet some there.
        except (msgspec.DecodeError, UnicodeDecodeError):
            return None
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    if record.type != "acct":
        return None
    usage = record.usage
    if usage is not UNSET and usage.usage is not UNSET:
        if usage.eusage is not UNSET:  # then `usage` is a custom container
            return None
        usage.eusage, usage.usage = usage.usage, UNSET
    return record


def _whole_counts(record: UsualRecord[float]) -> UsualRecord[int]:
    """`record` with its rusage counts rounded to whole numbers (`whole`)."""
    usage = record.usage
    if usage is UNSET:
        return cast(UsualRecord[int], record)
    r = usage.rusage
    rusage = _Rusage[int](r.ru_wallclock, r.ru_utime, r.ru_stime, *map(whole, msgspec.structs.astuple(r)[3:]))
    return cast(
        UsualRecord[int], msgspec.structs.replace(record, usage=msgspec.structs.replace(usage, rusage=rusage))
    )


def optional_text(text: str) -> str | None:
    """Grid Engine writes `NONE` (older: `none`) or nothing for an unset string."""
    return None if text in _NOT_SET else text


def whole(value: int | float) -> int:
    """A usage count some versions write as a double, rounded (as the general reader does)."""
    return value if type(value) is int else round(value)


def optional(value: int | float | UnsetType) -> int | None:
    """`whole` of an eusage value only some versions write; None when absent."""
    return None if isinstance(value, UnsetType) else whole(value)
