"""The metric registry: every numeric Sonar sample field, the line it becomes, its unit, type and level.

Declared once here; `docs/mapping.md` holds the table generated from it (`python -m schemas.translate.registry`
prints it; fed the document on stdin it prints the document updated) and a test fails when the two drift apart, so the written contract
and the code cannot disagree. Producers that emit the same quantities (hpcbus' node producer) take names,
units and types from here too.

Why each measurement has exactly one value type: InfluxDB fixes a field's type with its first point and drops
later points of another type. Names that cc-metric-collector also emits (or that sites rename collector
metrics to, such as `acc_utilization`) are floats, as collectors send them; Sonar-only integer quantities are
integers (exact for every uint64 Sonar can send, see `schemas.sonar.types.Uint`).
"""

from __future__ import annotations

import sys
from typing import NamedTuple

__all__ = [
    "BY_NAME",
    "CONV_IDENTITY",
    "CONV_KIB_TO_MIB",
    "CONV_PSTATE",
    "DISK_STAT_NAMES",
    "HIGH_CARDINALITY_TAGS",
    "LEVELS",
    "REGISTRY",
    "ZERO_OMITTED",
    "ZERO_WITH_BOOT",
    "ZERO_WRITTEN",
    "Metric",
    "disk_stat_name",
    "markdown_table",
]

LEVELS = ("node", "hwthread", "accelerator", "disk", "job", "process", "process_gpu")
"""Where a measurement lives; section 3 of docs/mapping.md gives the tags of each level."""

CONV_IDENTITY = "identity"
CONV_KIB_TO_MIB = "kib/1024"
"""Sonar KiB -> MiB on the bus (what cc-metric-collector's nvidia collector sends); division by 1024 is exact."""
CONV_PSTATE = "pstate-1"
"""Sonar `performance_state` is P-state + 1 (real Sonar); the bus carries the P-state itself."""

ZERO_WRITTEN = "written"
"""A zero value gets its line: a series a dashboard or cc-metric-store plots per node, hwthread, GPU or disk
(an idle node must show load 0, not a gap)."""
ZERO_WITH_BOOT = "written if `boot`"
"""Written as zero when the envelope has `system.boot`: these fields came with Sonar 0.15 together with `boot`;
an older Sonar never measures them, and a 0 line would claim an idle node."""
ZERO_OMITTED = "omitted"
"""No line for 0 (absent = zero, as in Sonar): a zero that means "not reported" (P-state 0 = unknown, no fan,
no clock or limit read), or a per-process figure (see docs/mapping.md principle 7)."""


class Metric(NamedTuple):
    """One measurement on the bus."""

    name: str
    """Measurement name."""
    level: str
    """One of LEVELS."""
    field: str
    """Attribute of the Sonar struct at that level (`cpus` for the hwthread list, `stats` for disk columns,
    "" for a value derived by the translator)."""
    unit: str
    """Unit of the value on the bus."""
    kind: type
    """`int` or `float`: the one line-protocol type of this measurement."""
    conv: str
    """CONV_* rule from the Sonar value to the bus value (inverted exactly on the way back)."""
    agg: str
    """How the InfluxDB writer aggregates it when it drops high-cardinality tags: sum, avg, max."""
    cc: str
    """What cc-metric-collector emits for the same quantity ("" when nothing)."""
    column: int = -1
    """For disk stats: the 0-based position in `SampleDisk.stats`."""
    zero: str = ZERO_OMITTED
    """ZERO_*: whether a zero value is written as a line (set per level and name below, `_ZERO`)."""


DISK_STAT_NAMES = (
    "reads",
    "reads_merged",
    "read_sectors",
    "read_ms",
    "writes",
    "writes_merged",
    "writes_sectors",
    "writes_ms",
    "ioops",
    "ioops_ms",
    "ioops_weighted_ms",
    "discards",
    "discards_merged",
    "discards_sectors",
    "discards_ms",
    "flushes",
    "flushes_ms",
)
"""The /proc/diskstats columns after major, minor and name, named as cc-metric-collector's iostat names them
(`io_<name>`). iostat sends per-interval *differences*; Sonar's `stats` are the cumulative counters, so they
get their own prefix `diskstat_` (a counter and its rate are different names)."""


def disk_stat_name(column: int) -> str:
    """Measurement of disk stats column `column` (0-based); columns beyond the known 17 are numbered."""
    if column < len(DISK_STAT_NAMES):
        return "diskstat_" + DISK_STAT_NAMES[column]
    return f"diskstat_{column + 1}"


_I, _F = int, float

_DECLARED: tuple[Metric, ...] = (
    # node: type=node (no type-id on the bus: schemas.lineprotocol.node_level_tags)
    Metric("mem_used", "node", "used_memory", "kB (KiB)", _F, CONV_IDENTITY, "avg", "mem_used (memstat, kB)"),
    Metric("cpu_load", "node", "load1", "run-queue length", _F, CONV_IDENTITY, "avg", "load_one"),
    Metric("load_five", "node", "load5", "run-queue length", _F, CONV_IDENTITY, "avg", "load_five"),
    Metric("load_fifteen", "node", "load15", "run-queue length", _F, CONV_IDENTITY, "avg", "load_fifteen"),
    Metric("proc_run", "node", "runnable_entities", "count", _F, CONV_IDENTITY, "avg", "proc_run"),
    Metric("proc_total", "node", "existing_entities", "count", _F, CONV_IDENTITY, "avg", "proc_total"),
    # hwthread: type=hwthread,type-id=<i>
    Metric("cpu_time", "hwthread", "cpus", "s (busy since boot)", _I, CONV_IDENTITY, "sum", ""),
    # accelerator: type=accelerator,type-id=<uuid>
    Metric("acc_utilization", "accelerator", "ce_util", "%", _F, CONV_IDENTITY, "avg", "nv_util"),
    Metric(
        "acc_mem_used", "accelerator", "memory", "MiB", _F, CONV_KIB_TO_MIB, "sum", "nv_fb_mem_used (MiB)"
    ),
    Metric("acc_mem_util", "accelerator", "memory_util", "%", _F, CONV_IDENTITY, "avg", "nv_mem_util"),
    Metric("acc_power", "accelerator", "power", "W", _F, CONV_IDENTITY, "sum", "nv_power_usage"),
    Metric(
        "acc_power_limit", "accelerator", "power_limit", "W", _F, CONV_IDENTITY, "sum", "nv_power_max_limit"
    ),
    Metric("acc_temp", "accelerator", "temperature", "degC", _F, CONV_IDENTITY, "max", "nv_temp"),
    Metric("acc_fan", "accelerator", "fan", "%", _F, CONV_IDENTITY, "avg", "nv_fan"),
    Metric("acc_clock", "accelerator", "ce_clock", "MHz", _F, CONV_IDENTITY, "avg", "nv_sm_clock"),
    Metric("acc_mem_clock", "accelerator", "memory_clock", "MHz", _F, CONV_IDENTITY, "avg", "nv_mem_clock"),
    Metric(
        "acc_pstate", "accelerator", "performance_state", "P-state", _F, CONV_PSTATE, "max", "nv_perf_state"
    ),
    Metric("acc_failing", "accelerator", "failing", "code", _F, CONV_IDENTITY, "max", ""),
    # disk: type=node,type-id=disk,stype=disk,stype-id=<name>
    *(
        Metric(
            disk_stat_name(i),
            "disk",
            "stats",
            "count" if "ms" not in s else "ms",
            _I,
            CONV_IDENTITY,
            "sum",
            f"io_{s} (per-interval difference)",
            i,
        )
        for i, s in enumerate(DISK_STAT_NAMES)
    ),
    # job: type=node,type-id=job,stype=job,stype-id=<jobkey>
    Metric("job_processes", "job", "", "count", _I, CONV_IDENTITY, "sum", ""),
    # process: type=node,type-id=process,stype=process,stype-id=<jobkey>/<pid>
    Metric("process_rss", "process", "resident_memory", "kB (KiB)", _I, CONV_IDENTITY, "sum", ""),
    Metric("process_vmem", "process", "virtual_memory", "kB (KiB)", _I, CONV_IDENTITY, "sum", ""),
    Metric("process_cpu_avg", "process", "cpu_avg", "% of a core", _F, CONV_IDENTITY, "sum", ""),
    Metric("process_cpu_util", "process", "cpu_util", "% of a core", _F, CONV_IDENTITY, "sum", ""),
    Metric("process_cpu_time", "process", "cpu_time", "s", _I, CONV_IDENTITY, "sum", ""),
    Metric("process_threads", "process", "num_threads", "count (minus one)", _I, CONV_IDENTITY, "sum", ""),
    Metric("process_read", "process", "data_read", "kB (KiB)", _I, CONV_IDENTITY, "sum", ""),
    Metric("process_written", "process", "data_written", "kB (KiB)", _I, CONV_IDENTITY, "sum", ""),
    Metric("process_cancelled", "process", "data_cancelled", "kB (KiB)", _I, CONV_IDENTITY, "sum", ""),
    Metric("process_rolledup", "process", "rolledup", "count", _I, CONV_IDENTITY, "sum", ""),
    # process on a GPU: type=accelerator,type-id=<uuid>,stype=process,stype-id=<jobkey>/<pid>
    Metric("process_acc_utilization", "process_gpu", "gpu_util", "%", _F, CONV_IDENTITY, "sum", ""),
    Metric("process_acc_mem_used", "process_gpu", "gpu_memory", "MiB", _F, CONV_KIB_TO_MIB, "sum", ""),
    Metric("process_acc_mem_util", "process_gpu", "gpu_memory_util", "%", _F, CONV_IDENTITY, "sum", ""),
)

_ZERO_BY_LEVEL = {"hwthread": ZERO_WRITTEN, "disk": ZERO_WRITTEN, "job": ZERO_WRITTEN}
_ZERO = {
    "mem_used": ZERO_WRITTEN,
    "cpu_load": ZERO_WITH_BOOT,
    "load_five": ZERO_WITH_BOOT,
    "load_fifteen": ZERO_WITH_BOOT,
    "proc_run": ZERO_WITH_BOOT,
    "proc_total": ZERO_WITH_BOOT,
    "acc_utilization": ZERO_WRITTEN,
    "acc_mem_used": ZERO_WRITTEN,
    "acc_mem_util": ZERO_WRITTEN,
    "acc_power": ZERO_WRITTEN,
    "acc_failing": ZERO_WRITTEN,
}
"""Which zeros become lines. Not listed: `acc_power_limit`, `acc_temp`, `acc_fan`, `acc_clock`,
`acc_mem_clock`, `acc_pstate` (0 = the card does not report it), and the per-process levels."""

REGISTRY: tuple[Metric, ...] = tuple(
    m._replace(zero=_ZERO.get(m.name, _ZERO_BY_LEVEL.get(m.level, ZERO_OMITTED))) for m in _DECLARED
)

BY_NAME: dict[str, Metric] = {m.name: m for m in REGISTRY}
"""Measurement name -> Metric (the reassembler's dispatch table)."""

HIGH_CARDINALITY_TAGS = frozenset({"stype-id", "job", "epoch", "pid", "ppid", "cmd"})
"""Tags whose number of values grows with jobs and processes: the InfluxDB writer drops or aggregates them
(for `stype=job|process` lines) by default. `user` is moderate and kept."""

IDENTITY_FIELDS: dict[str, frozenset[str]] = {
    "SampleGpu": frozenset({"index", "uuid", "compute_mode"}),
    "SampleDisk": frozenset({"name", "major", "minor"}),
    "SampleJob": frozenset({"job", "user", "epoch", "processes"}),
    "SampleProcess": frozenset({"cmd", "pid", "ppid", "in_container", "gpus"}),
    "SampleProcessGpu": frozenset({"index", "uuid"}),
    "SampleSystem": frozenset({"boot", "gpus", "disks"}),
}
"""Fields that are *not* metric lines (identity, strings, containers): they travel as tags and/or in the
skeleton. A test checks that every field of the sample structs is either here or in REGISTRY, so a field
added to `schemas.sonar.types` cannot be forgotten silently (it would still survive, in the skeleton)."""


def markdown_table() -> str:
    """The metric table of docs/mapping.md section 4."""
    rows = [
        "| Sonar field | level | measurement | unit | type | conversion | writer agg | cc-metric-collector | zero |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    prefix = {
        "node": "system.",
        "hwthread": "system.",
        "accelerator": "system.gpus[].",
        "disk": "system.disks[].",
        "job": "jobs[]",
        "process": "jobs[].processes[].",
        "process_gpu": "jobs[].processes[].gpus[].",
    }
    for m in REGISTRY:
        if m.level == "hwthread":
            field = "system.cpus[i]"
        elif m.level == "disk":
            field = f"system.disks[].stats[{m.column}]"
        elif m.level == "job":
            field = "jobs[] (derived: sum of 1 + rolledup)"
        else:
            field = prefix[m.level] + m.field
        conv = {CONV_IDENTITY: "", CONV_KIB_TO_MIB: "KiB / 1024", CONV_PSTATE: "value - 1"}[m.conv]
        rows.append(
            f"| `{field}` | {m.level} | `{m.name}` | {m.unit} | {m.kind.__name__} | {conv} | {m.agg} | "
            f"{m.cc or '-'} | {m.zero} |"
        )
    rows.append(
        "| `system.disks[].stats[k]`, k >= 17 | disk | `diskstat_<k+1>` | count | int |  | sum | - | written |"
    )
    return "\n".join(rows)


_BEGIN, _END = "<!-- registry:begin -->", "<!-- registry:end -->"


def render_doc(doc: str) -> str:
    """`doc` with the text between the registry markers replaced by the current table."""
    head, _, rest = doc.partition(_BEGIN)
    _, _, tail = rest.partition(_END)
    return f"{head}{_BEGIN}\n{markdown_table()}\n{_END}{tail}"


if __name__ == "__main__":
    # Prints the table; `... registry < docs/mapping.md` prints the whole document updated (no file I/O here).
    sys.stdout.write(render_doc(sys.stdin.read()) if not sys.stdin.isatty() else markdown_table() + "\n")
