"""The measurements of a Sonar sample: every numeric field, the line it becomes, its unit, type and level.

What the translator (`schemas.translate`) writes and reads back. Names that cc-metric-collector also emits
(or that sites rename collector metrics to, such as `acc_utilization`) are floats, as collectors send them;
Sonar-only integer quantities are integers (exact for every uint64 Sonar can send, see
`schemas.sonar.types.Uint`).
"""

from __future__ import annotations

from hpcbus.schemas.metrics.model import (
    CONV_IDENTITY,
    CONV_KIB_TO_MIB,
    CONV_PSTATE,
    ZERO_OMITTED,
    ZERO_WITH_BOOT,
    ZERO_WRITTEN,
    Metric,
)

__all__ = ["DISK_STAT_NAMES", "SONAR", "disk_stat_name"]

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


_PREFIX = {
    "node": "system.",
    "accelerator": "system.gpus[].",
    "process": "jobs[].processes[].",
    "process_gpu": "jobs[].processes[].gpus[].",
}

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


def _m(
    name: str, level: str, field: str, unit: str, kind: type, conv: str, agg: str, cc: str, column: int = -1
) -> Metric:
    if level == "hwthread":
        source = "system.cpus[i]"
    elif level == "disk":
        source = f"system.disks[].stats[{column}]"
    elif level == "job":
        source = "jobs[] (derived: sum of 1 + rolledup)"
    else:
        source = _PREFIX[level] + field
    zero = _ZERO.get(name, _ZERO_BY_LEVEL.get(level, ZERO_OMITTED))
    return Metric(name, (level,), unit, kind, agg, source, cc, field, conv, column, zero)


_I, _F = int, float
_ID, _MIB = CONV_IDENTITY, CONV_KIB_TO_MIB

SONAR: tuple[Metric, ...] = (
    # node: type=node (no type-id on the bus: schemas.lineprotocol.node_level_tags)
    _m("mem_used", "node", "used_memory", "kB (KiB)", _F, _ID, "avg", "mem_used (memstat, kB)"),
    _m("cpu_load", "node", "load1", "run-queue length", _F, _ID, "avg", "load_one"),
    _m("load_five", "node", "load5", "run-queue length", _F, _ID, "avg", "load_five"),
    _m("load_fifteen", "node", "load15", "run-queue length", _F, _ID, "avg", "load_fifteen"),
    _m("proc_run", "node", "runnable_entities", "count", _F, _ID, "avg", "proc_run"),
    _m("proc_total", "node", "existing_entities", "count", _F, _ID, "avg", "proc_total"),
    # hwthread: type=hwthread,type-id=<i>
    _m("cpu_time", "hwthread", "cpus", "s (busy since boot)", _I, _ID, "sum", ""),
    # accelerator: type=accelerator,type-id=<uuid>
    _m("acc_utilization", "accelerator", "ce_util", "%", _F, _ID, "avg", "nv_util"),
    _m("acc_mem_used", "accelerator", "memory", "MiB", _F, _MIB, "sum", "nv_fb_mem_used (MiB)"),
    _m("acc_mem_util", "accelerator", "memory_util", "%", _F, _ID, "avg", "nv_mem_util"),
    _m("acc_power", "accelerator", "power", "W", _F, _ID, "sum", "nv_power_usage"),
    _m("acc_power_limit", "accelerator", "power_limit", "W", _F, _ID, "sum", "nv_power_max_limit"),
    _m("acc_temp", "accelerator", "temperature", "degC", _F, _ID, "max", "nv_temp"),
    _m("acc_fan", "accelerator", "fan", "%", _F, _ID, "avg", "nv_fan"),
    _m("acc_clock", "accelerator", "ce_clock", "MHz", _F, _ID, "avg", "nv_sm_clock"),
    _m("acc_mem_clock", "accelerator", "memory_clock", "MHz", _F, _ID, "avg", "nv_mem_clock"),
    _m("acc_pstate", "accelerator", "performance_state", "P-state", _F, CONV_PSTATE, "max", "nv_perf_state"),
    _m("acc_failing", "accelerator", "failing", "code", _F, _ID, "max", ""),
    # disk: type=node,type-id=disk,stype=disk,stype-id=<name>
    *(
        _m(
            disk_stat_name(i),
            "disk",
            "stats",
            "count" if "ms" not in s else "ms",
            _I,
            _ID,
            "sum",
            f"io_{s} (per-interval difference)",
            i,
        )
        for i, s in enumerate(DISK_STAT_NAMES)
    ),
    # job: type=node,type-id=job,stype=job,stype-id=<jobkey>
    _m("job_processes", "job", "", "count", _I, _ID, "sum", ""),
    # process: type=node,type-id=process,stype=process,stype-id=<jobkey>/<pid>
    _m("process_rss", "process", "resident_memory", "kB (KiB)", _I, _ID, "sum", ""),
    _m("process_vmem", "process", "virtual_memory", "kB (KiB)", _I, _ID, "sum", ""),
    _m("process_cpu_avg", "process", "cpu_avg", "% of a core", _F, _ID, "sum", ""),
    _m("process_cpu_util", "process", "cpu_util", "% of a core", _F, _ID, "sum", ""),
    _m("process_cpu_time", "process", "cpu_time", "s", _I, _ID, "sum", ""),
    _m("process_threads", "process", "num_threads", "count (minus one)", _I, _ID, "sum", ""),
    _m("process_read", "process", "data_read", "kB (KiB)", _I, _ID, "sum", ""),
    _m("process_written", "process", "data_written", "kB (KiB)", _I, _ID, "sum", ""),
    _m("process_cancelled", "process", "data_cancelled", "kB (KiB)", _I, _ID, "sum", ""),
    _m("process_rolledup", "process", "rolledup", "count", _I, _ID, "sum", ""),
    # process on a GPU: type=accelerator,type-id=<uuid>,stype=process,stype-id=<jobkey>/<pid>
    _m("process_acc_utilization", "process_gpu", "gpu_util", "%", _F, _ID, "sum", ""),
    _m("process_acc_mem_used", "process_gpu", "gpu_memory", "MiB", _F, _MIB, "sum", ""),
    _m("process_acc_mem_util", "process_gpu", "gpu_memory_util", "%", _F, _ID, "sum", ""),
)
"""The translator's measurements, in the order of docs/mapping.md section 4."""
