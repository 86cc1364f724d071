"""Open Cluster Scheduler / Grid Engine accounting records (one line each), read into one normalised struct.

The accounting file is the only place a Grid Engine cluster tells what a finished job used, and sites run
every generation of it: OCS 9.x writes JSONL, older SGE/OGS/SoGE/Univa write colon-separated lines in
several widths, and the reporting file wraps either in `time`/`type` keys. `AccountingRecord` is the same
shape for all of them, in one set of units, so nothing downstream needs to know which one a line came from.

Units after parsing (whatever the source wrote): timestamps are **int epoch seconds** (0 = not set);
`ru_wallclock`, `ru_utime`, `ru_stime`, `wallclock`, `cpu`, `iow` seconds; `ru_maxrss` KiB (getrusage);
`mem` GiB*s; `io` GiB; `maxvmem`, `maxrss`, `maxpss` bytes. Values the source leaves out stay at their
defaults (`None` for strings and for the eusage values only some versions write).

JSONL (OCS >= 9.0, `sge_rusage.cc`): one object; job keys at the top level, usage nested as
`usage: {rusage: {ru_*}, eusage: {wallclock, cpu, mem, io, [ioops], iow, maxvmem, maxrss, [maxpss]},
<custom container>: {...}}`. Versions 9.0.0-9.0.5 name the inner container `usage` instead of `eusage`; both
are read. Keys whose string value is null are omitted by the writer. `pe_taskid` is `"NONE"` from 9.1.2 when
the record is not a PE task (the man page spells it `pe_task_id`; both are read). `deleted_by` exists from
9.1.2. The reporting file adds `time` (µs) and `type` (`"acct"`) first; other `type`s are rejected. An early
9.0 development layout with the usage keys flat at the top level is read too. Top-level keys not listed
here go to `extra`, unknown usage keys and custom usage containers to `custom_usage`: nothing is dropped.

The colon format (`old_accounting=true`, SGE 5.3 .. Univa 8.x) is read by `schemas.ocs.colon`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import msgspec
from msgspec import UNSET

from hpcbus.schemas.native import extension
from hpcbus.schemas.ocs.colon import parse_colon_line
from hpcbus.schemas.ocs.record import (
    EUSAGE_FLOAT,
    EUSAGE_INT,
    JOB_INT,
    JOB_OPTIONAL_STR,
    JOB_STR,
    KIND,
    RUSAGE_FLOAT,
    RUSAGE_INT,
    TIMES,
    AccountingRecord,
    build,
    check_values,
    invalid,
    is_skippable,
)
from hpcbus.schemas.ocs.typed import (
    NO_EUSAGE,
    NO_RUSAGE,
    UsualRecord,
    decode_usual,
    optional,
    optional_text,
    whole,
)
from hpcbus.schemas.problems import InvalidInput, Problem

__all__ = [
    "NumberedLine",
    "parse_jsonl_line",
    "parse_line",
    "parse_usual",
    "parse_usual_lines",
    "parse_usual_lines_pure",
    "parse_usual_pure",
]

_JSON_KNOWN = frozenset(
    (*TIMES, *JOB_INT, *JOB_STR, *JOB_OPTIONAL_STR, "pe_taskid", "pe_task_id", "usage", "time", "type")
)


def parse_line(line: str) -> AccountingRecord:
    """Parse one line of either format: a line starting with `{` is JSONL, anything else colon format."""
    if line[:1] == "{" or line.lstrip().startswith("{"):
        return parse_jsonl_line(line)
    return parse_colon_line(line)


# --- JSONL ----------------------------------------------------------------------------------------------------


def parse_jsonl_line(line: str, *, typed: bool = True) -> AccountingRecord:
    """Parse one `accounting.jsonl` (or `reporting.jsonl` `acct`) line; raise `InvalidInput` naming each bad key.

    `typed=False` reads it key by key straight away, for a caller whose `parse_usual` of the same line
    already answered None (the typed decode would only fail again); the record is the same either way."""
    if is_skippable(line):
        raise invalid("line", "blank or comment line: skip it with is_skippable()")
    usual = decode_usual(line) if typed else None  # the usual record, typed by msgspec; else key by key
    if usual is not None:
        return _from_usual(usual)
    return _parse_jsonl_keys(line)


def parse_usual_pure(line: bytes) -> AccountingRecord | None:
    """The record of a JSONL line of the usual shape (`decode_usual`), read straight from its bytes; None when
    the line needs `parse_line` (another shape, another format, not UTF-8, blank). What `parse_line` gives
    for the line decoded, without decoding it to text first: a follower's hot path. The reference of the
    compiled `parse_usual`."""
    usual = decode_usual(line) if line[:1] == b"{" else None
    return None if usual is None else _from_usual(usual)


_read = extension("hpcbus.schemas.ocs._read")
"""The compiled reader (`_read.c`), None on the pure path (no compiler at install, or `HPCBUS_PURE=1`)."""

parse_usual: Callable[[bytes], AccountingRecord | None] = (
    parse_usual_pure
    if _read is None
    # C reads the usual line straight into the record, and hands every other line to the pure path
    else functools.partial(_read.read_usual, AccountingRecord, parse_usual_pure)
)
"""`parse_usual_pure`, compiled where the extension is built: the same record, None or exception for every
line (tests/test_compiled_ocs.py)."""


class NumberedLine(Protocol):
    """A line of a file without its newline, and its number (the follower's `RawLine`)."""

    @property
    def number(self) -> int: ...

    @property
    def text(self) -> bytes: ...


def parse_usual_lines_pure(lines: list[NumberedLine]) -> tuple[list[AccountingRecord], list[int]] | None:
    """The records of `lines` and their line numbers when `parse_usual_pure` reads every one of them, else
    None (the caller reads them one by one, to name the problems); the reference of the compiled
    `parse_usual_lines`."""
    records = []
    for line in lines:
        record = parse_usual_pure(line.text)
        if record is None:
            return None
        records.append(record)
    return records, [line.number for line in lines]


parse_usual_lines: Callable[[list[NumberedLine]], tuple[list[AccountingRecord], list[int]] | None] | None = (
    None if _read is None else functools.partial(_read.read_records, AccountingRecord)
)
"""`parse_usual_lines_pure` compiled (a whole chunk in one call), None on the pure path: there a chunk is read
line by line straight away. It gives what the pure twin gives, or None where a line is not of the shape the C
reader takes itself (`_read.c`): then the caller reads the lines one by one, with the same result."""


def _from_usual(u: UsualRecord[int]) -> AccountingRecord:
    """The record of a line `decode_usual` read, built straight from its typed values: what `_parse_jsonl_keys`
    makes of the same keys (absent keys give the record's defaults), without a dict of fields in between.
    A value the types allow but the record does not (a job number below 1, a negative time) raises what
    `_parse_jsonl_keys` raises for it (`check_values`: every type being right, nothing else is wrong)."""
    us = 1_000_000
    submit, start, end, ar_submit = (
        u.submission_time // us,
        u.start_time // us,
        u.end_time // us,
        u.ar_submission_time // us,
    )
    check_values(u.job_number, (submit, start, end, ar_submit))
    usage = u.usage
    if usage is UNSET:
        r, e = NO_RUSAGE, NO_EUSAGE
    else:
        r, e = usage.rusage, NO_EUSAGE if usage.eusage is UNSET else usage.eusage
    # Positionally, in the order of the record's fields (`_FIELD_ORDER`, held equal to it by a test): ten
    # times cheaper than keywords for ~60 fields, which was a third of reading a record.
    return AccountingRecord(
        u.job_number,
        u.task_number,
        optional_text(u.pe_taskid if u.pe_task_id is UNSET else u.pe_task_id),
        u.owner,
        u.group,
        u.account,
        optional_text(u.project),
        optional_text(u.department),
        u.qname,
        u.hostname,
        (u.hostname,) if u.hostname else (),  # hosts
        u.job_name,
        optional_text(u.granted_pe),
        u.slots,
        u.priority,
        optional_text(u.category),
        optional_text(u.submit_cmd_line),
        u.arid,
        submit,
        start,
        end,
        ar_submit,
        u.failed,
        u.exit_status,
        optional_text(u.deleted_by),
        r.ru_wallclock,
        r.ru_utime,
        r.ru_stime,
        r.ru_maxrss,
        r.ru_ixrss,
        r.ru_ismrss,
        r.ru_idrss,
        r.ru_isrss,
        r.ru_minflt,
        r.ru_majflt,
        r.ru_nswap,
        r.ru_inblock,
        r.ru_oublock,
        r.ru_msgsnd,
        r.ru_msgrcv,
        r.ru_nsignals,
        r.ru_nvcsw,
        r.ru_nivcsw,
        None if e.wallclock is UNSET else e.wallclock,
        e.cpu,
        e.mem,
        e.io,
        optional(e.ioops),
        e.iow,
        whole(e.maxvmem),
        optional(e.maxrss),
        optional(e.maxpss),
        {},  # custom_usage
        {} if u.time is UNSET else {"time": u.time},  # extra
    )


_FIELD_ORDER = (
    *("job_number", "task_number", "pe_taskid", "owner", "group", "account", "project", "department"),
    *("qname", "hostname", "hosts", "job_name", "granted_pe", "slots", "priority", "category"),
    *("submit_cmd_line", "arid", *TIMES, "failed", "exit_status", "deleted_by", *RUSAGE_FLOAT, *RUSAGE_INT),
    *(
        "wallclock",
        "cpu",
        "mem",
        "io",
        "ioops",
        "iow",
        "maxvmem",
        "maxrss",
        "maxpss",
        "custom_usage",
        "extra",
    ),
)
"""The leading fields of `AccountingRecord` as `_from_usual` gives them (the rest keep their defaults)."""


def _parse_jsonl_keys(line: str | bytes) -> AccountingRecord:
    """`parse_jsonl_line` key by key: any shape, every problem named."""
    try:
        obj = msgspec.json.decode(line)
    except msgspec.DecodeError as err:
        raise invalid("line", f"not valid JSON: {err}") from None
    if not isinstance(obj, dict):
        raise invalid("line", f"a record is a JSON object, not {_json_type(obj)}")
    if "type" in obj and obj["type"] != "acct":
        raise invalid("type", f"reporting record of type {obj['type']!r} is not an accounting record")

    reader = _JsonReader()
    fields: dict[str, Any] = {}
    if "job_number" not in obj:
        reader.problem("job_number", "missing")
    for key in JOB_INT:
        if key in obj:
            fields[key] = reader.integer(obj[key], key)
    for key in TIMES:
        if key in obj:
            fields[key] = reader.integer(obj[key], key) // 1_000_000
    for key in JOB_STR:
        if key in obj:
            fields[key] = reader.string(obj[key], key)
    for key in JOB_OPTIONAL_STR:
        if key in obj:
            fields[key] = optional_text(reader.string(obj[key], key))
    for key in ("pe_taskid", "pe_task_id"):
        if key in obj:
            fields["pe_taskid"] = optional_text(reader.string(obj[key], key))

    custom: dict[str, dict[str, float]] = {}
    extra: dict[str, Any] = {}
    usage = obj.get("usage")
    if usage is None:
        # Early 9.0 development builds wrote every usage value flat at the top level.
        flat = {k: v for k, v in obj.items() if k in RUSAGE_FLOAT or k in RUSAGE_INT}
        flat_e = {k: v for k, v in obj.items() if k in EUSAGE_FLOAT or k in EUSAGE_INT}
        reader.usage(flat, "", "rusage", fields, custom, extra)
        reader.usage(flat_e, "", "eusage", fields, custom, extra)
        consumed = set(flat) | set(flat_e)
    elif not isinstance(usage, dict):
        reader.problem("usage", f"must be an object, not {_json_type(usage)}")
        consumed = set()
    else:
        consumed = set()
        eusage_key = "eusage" if "eusage" in usage else "usage"
        for container, values in usage.items():
            path = f"usage.{container}"
            if not isinstance(values, dict):
                reader.problem(path, f"must be an object, not {_json_type(values)}")
            elif container == "rusage":
                reader.usage(values, path + ".", "rusage", fields, custom, extra)
            elif container == eusage_key:
                reader.usage(values, path + ".", "eusage", fields, custom, extra)
            else:
                reader.usage(values, path + ".", container, fields, custom, extra)

    for key, value in obj.items():
        if key not in _JSON_KNOWN and key not in consumed:
            extra[key] = value
    if "time" in obj:
        extra["time"] = obj["time"]
    if reader.problems:
        raise InvalidInput(reader.problems)
    return build(fields, custom, extra, "jsonl")


class _JsonReader:
    """Type checks that collect every problem of a record instead of stopping at the first."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def problem(self, path: str, reason: str) -> None:
        self.problems.append(Problem(kind=KIND, path=path, reason=reason))

    def integer(self, value: object, path: str, *, whole: bool = True) -> int:
        """An integer; `whole=False` also rounds a fractional float (usage values some versions write as
        doubles), while identifiers and codes must be whole numbers."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.problem(path, f"must be a number, not {_json_type(value)}")
            return 0
        if isinstance(value, float):
            if not math.isfinite(value):
                self.problem(path, f"must be finite, not {value}")
                return 0
            if whole and not value.is_integer():
                self.problem(path, f"must be a whole number, not {value}")
                return 0
            return round(value)
        return value

    def number(self, value: object, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.problem(path, f"must be a number, not {_json_type(value)}")
            return 0.0
        if not math.isfinite(value):
            self.problem(path, f"must be finite, not {value}")
            return 0.0
        return float(value)

    def string(self, value: object, path: str) -> str:
        if not isinstance(value, str):
            self.problem(path, f"must be a string, not {_json_type(value)}")
            return ""
        return value

    def usage(
        self,
        values: Mapping[str, object],
        prefix: str,
        container: str,
        fields: dict[str, Any],
        custom: dict[str, dict[str, float]],
        extra: dict[str, Any],
    ) -> None:
        """Known keys of `rusage`/`eusage` into `fields`; anything else numeric into `custom[container]`."""
        floats = RUSAGE_FLOAT if container == "rusage" else EUSAGE_FLOAT if container == "eusage" else ()
        ints = RUSAGE_INT if container == "rusage" else EUSAGE_INT if container == "eusage" else ()
        for key, value in values.items():
            if key in floats:
                fields[key] = self.number(value, prefix + key)
            elif key in ints:
                fields[key] = self.integer(value, prefix + key, whole=False)
            elif isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                custom.setdefault(container, {})[key] = float(value)
            else:
                extra[f"usage.{container}.{key}"] = value


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
