"""Which parser each sacct column needs, and `Plan`: a field list turned into parsers once per parse.

Each known column names the SacctRow attribute(s) it fills and the kind of parser it needs. `Plan` turns a
field list into three lists (plain strings, one-attribute parsers, two-attribute parsers) once per parse, so
the per-line loop (`schemas.slurm.sacct.parse`) does no lookups by name. Kept apart from that loop because
this is the table of sacct's columns and their formats, which grows with every column supported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import tzinfo
from typing import Any, Final

from hpcbus.schemas.slurm.values import (
    parse_duration,
    parse_exit_code,
    parse_job_id,
    parse_job_id_raw,
    parse_reqmem,
    parse_size_kib,
    parse_state,
    parse_timelimit,
    parse_timelimit_raw,
    split_nodelist,
    timestamp_parser,
)

NONE_ASSIGNED: Final = "None assigned"
"""sacct's NodeList of a job that never got nodes (pending, or cancelled while pending)."""

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


class Plan:
    """What to do with each column of a field list in one zone, worked out once per parse, not per line."""

    __slots__ = (
        "extras",
        "fields",
        "header",
        "joinable",
        "kinds",
        "pairs",
        "singles",
        "strings",
        "tz",
        "width",
    )

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
        self.tz = tz
        self.kinds: list[tuple[str, str, str | None]] = []
        """Per column (parser kind, attribute, second attribute or None); `extra` columns give their name:
        what the compiled reader (`compiled.py`) is told."""
        for i, (name, key) in enumerate(zip(fields, lower, strict=True)):
            if key not in _COLUMNS:
                self.extras.append((i, name))
                self.kinds.append(("extra", name, None))
                continue
            attrs, kind = _COLUMNS[key]
            self.kinds.append((kind, attrs[0], attrs[1] if len(attrs) > 1 else None))
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
