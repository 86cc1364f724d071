"""Where each line of a sample goes on the way back (line protocol -> Sonar): the measurement's level, Sonar
field, conversion and valid range, for the registry's measurements and ClusterCockpit's aliases
(docs/mapping.md sections 4.1-4.4). Tables built once at import; `Assembler` and `Placer` look lines up here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

import msgspec

from hpcbus.schemas.sonar.types import (
    SampleGpu,
    SampleSystem,
)
from hpcbus.schemas.translate.registry import CONV_KIB_TO_MIB, CONV_PSTATE, REGISTRY

__all__ = [
    "BUSY_PARTS",
    "COUNTED_TYPE",
    "DISKSTAT_N",
    "DISPATCH",
    "MAX_CPUS",
    "MAX_DISK_COLUMN",
    "PROCESS_AS_IS",
    "U64",
    "ZERO_DEFAULT_GPU",
    "ZERO_DEFAULT_SYSTEM",
    "GroupKey",
    "LineKey",
    "Target",
    "to_int",
]

U64 = 2**63 - 1
_I64_MIN = -(2**63)
MAX_CPUS = 1 << 16
"""A hwthread index above this is taken for garbage rather than grown into a list."""
MAX_DISK_COLUMN = 64


def to_int(x: float | int) -> int:
    return x if isinstance(x, int) else round(x)


def _to_float(x: float | int) -> float:
    return float(x)


def _mib_to_kib(x: float | int) -> int:
    return round(x * 1024)


def _pstate(x: float | int) -> int:
    return round(x) + 1


class Target(NamedTuple):
    """Where the value of one measurement goes."""

    level: str
    attr: str
    conv: Callable[[float | int], float | int]
    lo: int
    """Lowest valid Sonar value (0 for uint64, -2^63 for int64 fields); floats are not bounded."""
    counted: bool
    """A registry measurement (counts toward the skeleton's line total); False for ClusterCockpit aliases."""
    column: int = -1
    type: str = ""
    """The `type` tag of lines of this level (docs/mapping.md section 3)."""


def _zero_defaults(struct: type[msgspec.Struct]) -> frozenset[str]:
    """Fields whose default is 0: Sonar omits them when 0, and the bus writes their 0 as a line (a dashboard
    needs the point), so a 0 line must leave the field at its default, or the envelope would not come back
    byte for byte (msgspec omits a float default only when it is the default object itself)."""
    return frozenset(
        f.name for f in msgspec.structs.fields(struct) if type(f.default) in (int, float) and f.default == 0
    )


ZERO_DEFAULT_SYSTEM = _zero_defaults(SampleSystem)
ZERO_DEFAULT_GPU = _zero_defaults(SampleGpu)

_TYPE_OF_LEVEL = {
    "node": "node",
    "hwthread": "hwthread",
    "accelerator": "accelerator",
    "disk": "node",
    "job": "node",
    "process": "node",
    "process_gpu": "accelerator",
    "busy": "hwthread",
}
"""The `type` tag a line of each level carries (docs/mapping.md section 3); other lines of the same name are
different quantities (a per-core `cpu_load`, a node-level `cpu_user`) and have no Sonar field."""

_SIGNED = frozenset({"temperature", "rolledup"})
_SONAR_FLOATS = frozenset({"load1", "load5", "load15", "cpu_avg", "cpu_util", "gpu_util", "gpu_memory_util"})


def _target(level: str, attr: str, conv: str, counted: bool, column: int = -1) -> Target:
    if attr in _SONAR_FLOATS:
        fn: Callable[[float | int], float | int] = _to_float
    elif conv == CONV_KIB_TO_MIB:
        fn = _mib_to_kib
    elif conv == CONV_PSTATE:
        fn = _pstate
    else:
        fn = to_int
    return Target(level, attr, fn, _I64_MIN if attr in _SIGNED else 0, counted, column, _TYPE_OF_LEVEL[level])


DISPATCH: dict[str, Target] = {m.name: _target(m.level, m.field, m.conv, True, m.column) for m in REGISTRY}

# ClusterCockpit collector names (docs/mapping.md section 4.4). Not counted toward a skeleton's total.
_CC_ALIASES: dict[str, Target] = {
    "load_one": _target("node", "load1", "", False),
    "nv_util": _target("accelerator", "ce_util", "", False),
    "nv_fb_mem_used": _target("accelerator", "memory", CONV_KIB_TO_MIB, False),
    "nv_mem_util": _target("accelerator", "memory_util", "", False),
    "nv_power_usage": _target("accelerator", "power", "", False),
    "nv_temp": _target("accelerator", "temperature", "", False),
    "nv_fan": _target("accelerator", "fan", "", False),
    "nv_sm_clock": _target("accelerator", "ce_clock", "", False),
    "nv_mem_clock": _target("accelerator", "memory_clock", "", False),
    "nv_perf_state": _target("accelerator", "performance_state", CONV_PSTATE, False),
    "nv_power_max_limit": _target("accelerator", "power_limit", "", False),
}
BUSY_PARTS = ("cpu_user", "cpu_nice", "cpu_system", "cpu_irq", "cpu_softirq")
"""Sonar's busy time per core is user+nice+system+irq+softirq (FACTS: /proc/stat); cpustat sends each as %."""
for _name in (*BUSY_PARTS, "cpu_used"):
    _CC_ALIASES[_name] = Target("busy", _name, _to_float, 0, False, -1, "hwthread")
DISPATCH.update(_CC_ALIASES)
PROCESS_AS_IS: dict[str, tuple[str, type, int]] = {
    name: (t.attr, float if t.conv is _to_float else int, t.lo)
    for name, t in DISPATCH.items()
    if t.level == "process" and t.conv in (_to_float, to_int)
}
"""Process measurements whose line value is the Sonar value itself (when of the Sonar type): (attribute,
type, lowest valid value), for the inline placing in `Placer.put_all`."""
COUNTED_TYPE: dict[str, str] = {name: t.type for name, t in DISPATCH.items() if t.counted}
"""Measurement -> the `type` tag of its level, for the lines that count toward a skeleton's total: the hot
path of `Assembler.add_lines` needs only this; every other line goes through `DISPATCH`."""

DISKSTAT_N = re.compile(r"diskstat_([0-9]{1,3})")

GroupKey = tuple[str, str, int]
LineKey = tuple[str, str | None, str | None]
