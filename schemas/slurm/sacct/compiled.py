"""The compiled twin of the sacct reader (`_sacct.c`, a C extension on the stable ABI): what it is told.

Why: reading sacct output is per-field interpreter work (a regex and an `int()` per column, a dict of
keyword arguments per row, the same again per record when rendering); in C one call parses a whole line and
one call renders a row (issue 24). The pure functions stay the reference: the C code answers None for any
line or row it is not sure of, and the pure path then decides it alone, so records and problems are the
same on both paths (tests/test_compiled_sacct.py). `HPCBUS_PURE=1` switches it off (`schemas.native`).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone, tzinfo
from typing import Any, Final

import msgspec

from hpcbus.schemas.native import extension
from hpcbus.schemas.slurm.sacct.columns import Plan
from hpcbus.schemas.slurm.sacct.row import SacctRow
from hpcbus.schemas.slurm.values import JobId, timestamp_parser
from hpcbus.schemas.sonar.types import SacctData, SlurmJob

native = extension("hpcbus.schemas.slurm.sacct._sacct")
"""The extension, or None (not built, or `HPCBUS_PURE=1`)."""

ROW_FIELDS: Final = (
    "job",
    "job_id_raw",
    "step_raw",
    "job_name",
    "user",
    "account",
    "partition",
    "reservation",
    "layout",
    "state",
    "submit",
    "start",
    "end",
    "elapsed_raw",
    "suspended",
    "user_cpu",
    "system_cpu",
    "ave_cpu",
    "min_cpu",
    "ave_disk_read",
    "ave_disk_write",
    "ave_rss",
    "ave_vmsize",
    "max_rss",
    "max_vmsize",
    "exit_status",
    "req_cpus",
    "req_nodes",
    "priority",
    "req_mem_kib",
    "req_mem_per_cpu",
    "time_limit",
    "node_list",
    "alloc_tres",
)
"""The `SacctRow` fields `render` reads, in the order of `_sacct.c`'s `enum row_field`."""

JOB_ID_FIELDS: Final = ("base", "step", "array_task_id", "array_tasks", "het_offset")
"""`JobId`'s fields in the order `_sacct.c` reads them."""


def row_plan(plan: Plan, delimiter: str, trailing_delimiter: bool) -> Any:
    """What `native.row` needs for one parse (a capsule), or None without the extension or for a field list
    wider than it takes (the pure path reads those). The timestamps and strings it meets are remembered for
    this parse only (in the capsule), as the pure path memoizes."""
    if native is None or plan.width > native.MAX_COLUMNS:
        return None
    columns = tuple(
        (kind, _AT.get(attr, -1), _AT[attr2] if attr2 is not None else -1, attr)
        for kind, attr, attr2 in plan.kinds
    )
    parse = timestamp_parser(plan.tz)
    return native.plan(
        columns,
        delimiter,
        trailing_delimiter,
        plan.joinable,
        SacctRow,
        JobId,
        parse,
        _DEFAULTS,
        datetime,
        _zone_of(parse),
    )


def _zone_of(parse: Callable[[str], datetime | None]) -> tzinfo | None:
    """The tzinfo the pure timestamp parser attaches (for a fixed offset, the `timezone` `fromisoformat`
    makes of it, which may differ from the caller's in its name): the compiled reader attaches the same."""
    when = parse("2000-01-01T00:00:00")
    assert when is not None
    return when.tzinfo


def _defaults() -> tuple[Any, ...]:
    fields, defaults = SacctRow.__struct_fields__, SacctRow.__struct_defaults__
    if fields[0] != "line" or fields[-1] != "extra" or len(defaults) != len(fields):
        raise RuntimeError(
            "SacctRow must start with `line`, end with `extra`, and give every field a default"
        )
    return defaults[:-1]


_DEFAULTS: Final = _defaults()
"""SacctRow's defaults but `extra`'s (immutable ones: None, 0, "", False): the row `_sacct.c` fills in."""
_AT: Final = {name: i for i, name in enumerate(SacctRow.__struct_fields__)}


def _renderer() -> Any:
    if native is None:
        return None
    if JobId.__struct_fields__ != JOB_ID_FIELDS:
        raise RuntimeError(f"JobId's fields are not {JOB_ID_FIELDS}: update _sacct.c's render")
    positions = tuple(_AT[name] for name in ROW_FIELDS)
    templates = SlurmJob(job_id=1, job_state="-"), SacctData()  # every record sets job_id and job_state
    return native.renderer(
        SlurmJob,
        SacctData,
        msgspec.structs.astuple,
        JobId,
        datetime,
        timezone,
        positions,
        len(_AT),
        *templates,
    )


RENDERER: Final = _renderer()
"""What `native.render` needs (a capsule), made once; None without the extension."""
