"""Which fields of each Sonar sample object become metric lines, and their values (docs/mapping.md section 4).

The registry (`registry.REGISTRY`) says per level (node, accelerator, process, process GPU) which struct
fields are metrics, how a value converts and whether a zero is written; this module turns that into what
the sample walk (`sample_to_lp.walk_sample`) asks per object: its lines' names and values, and the zeros the
skeleton keeps in their place. Which fields of an object become lines is worked out once per pattern of
zero and non-zero values (`Plan`), not field by field, and the values come out of the struct in one call
(`Level.read`); an object whose values are not all of their declared types and plain (int64, finite normal
float) takes the field-by-field way (`field_values`), which decides the same for the values it shares with
the shortcut. The compiled writer (`_write.c`) follows the tables written here (`Level.coded`,
`PROCESS_FIELDS`, `PROCESS_GPU_FIELDS`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from operator import truth
from typing import Any, NamedTuple

import msgspec

from hpcbus.schemas.lineprotocol.format import FLOAT_MIN_NORMAL, INT64_MAX, INT64_MIN
from hpcbus.schemas.sonar.types import SampleGpu, SampleProcess, SampleProcessGpu, SampleSystem
from hpcbus.schemas.translate.registry import (
    CONV_KIB_TO_MIB,
    CONV_PSTATE,
    REGISTRY,
    ZERO_WITH_BOOT,
    ZERO_WRITTEN,
    disk_stat_name,
)

__all__ = [
    "DISK_NAMES",
    "GPU",
    "NODE",
    "NODE_BOOT",
    "PROCESS",
    "PROCESS_FIELDS",
    "PROCESS_GPU",
    "PROCESS_GPU_FIELDS",
    "Level",
    "Plan",
    "Plans",
    "ReadValues",
    "Values",
    "field_values",
    "lines_template",
    "object_lines",
    "plain_ints",
]

_F53 = 2**53


def _to_float(v: int | float) -> float | None:
    """A Sonar number as a float line value, or None when the float would not give it back exactly."""
    if type(v) is int:
        return float(v) if -_F53 <= v <= _F53 else None
    return None if -FLOAT_MIN_NORMAL < v < FLOAT_MIN_NORMAL and v != 0 else v


def _kib_to_mib(v: int) -> float | None:
    return v / 1024 if v <= _F53 else None


def _pstate(v: int) -> float | None:
    return float(v - 1) if v <= _F53 else None


def _converter(kind: type, conv: str) -> Callable[[int], float | int | None] | None:
    """None = the value goes out as it is (an int: schemas.sonar.types bounds every integer to int64)."""
    if conv == CONV_KIB_TO_MIB:
        return _kib_to_mib
    if conv == CONV_PSTATE:
        return _pstate
    return _to_float if kind is float else None


_Conv = Callable[[int], float | int | None] | None
_CODES: dict[_Conv, int] = {None: 0, _to_float: 1, _kib_to_mib: 2, _pstate: 3}
"""Each converter's code for a compiled `field_values` (`Level.coded`)."""
_Table = tuple[tuple[str, str, _Conv, object, bool], ...]
_Pick = Callable[[tuple[Any, ...]], tuple[Any, ...]]

Values = tuple[float | int, ...]
"""The values of one object's lines, in line order."""


def _fields(level: str, cls: type[msgspec.Struct], *, boot: bool = False) -> _Table:
    """(attribute, measurement, converter, the attribute's zero, whether a zero is written) for every
    registry entry of `level`; `boot`: the envelope has `system.boot` (Sonar >= 0.15)."""
    defaults = {f.name: f.default for f in msgspec.structs.fields(cls)}
    return tuple(
        (
            m.field,
            m.name,
            _converter(m.kind, m.conv),
            defaults[m.field],
            m.zero == ZERO_WRITTEN or (boot and m.zero == ZERO_WITH_BOOT),
        )
        for m in REGISTRY
        if m.level == level
    )


def _picker(indices: Sequence[int]) -> _Pick:
    """The items at `indices` of a tuple, as a tuple (`itemgetter` in C; it returns a bare item for one)."""
    if len(indices) > 1:
        return operator.itemgetter(*indices)
    if indices:
        only = indices[0]
        return lambda t: (t[only],)
    return lambda t: ()


def lines_template(names: Sequence[str], kinds: Sequence[type], time: int) -> str:
    """The text of lines `names` as a `%` template of their plain values of types `kinds` (`%s` writes an
    int or a float as `plain_value` does, less the `i` of an int), with NUL where each line's tag set goes:
    `(template % values).replace("\0", tag_text)`. Measurement names need no escaping (see payloads)."""
    return "".join(
        f"{name}\0 value=%s{'i' if kind is int else ''} {time}\n"
        for name, kind in zip(names, kinds, strict=True)
    )


class Plan(NamedTuple):
    """The lines of a level's object for one pattern of zero and non-zero values of their declared types."""

    names: tuple[str, ...]
    pick: _Pick
    """The line values out of all the level's values (`Level.read`)."""
    floats: _Pick
    """The float values out of the line values."""
    zeros: dict[str, object]
    """Attribute -> zero for each field that becomes a line (shared: do not mutate)."""
    template: str
    """`lines_template` of the lines."""

    def plain(self, values: Values) -> bool:
        """Every value is plain: an int64, or a finite normal float (which `_to_float` keeps as it is). Then
        the plan's lines are exactly those `field_values` finds, and `template` writes them.

        In two C-level passes rather than a test per value: the sum of magnitudes bounds each of them (float
        rounding is monotonic, and a NaN or an infinity makes the sum fail the test), so it may only refuse
        plain values (a huge sum: `field_values` then writes them), never accept others."""
        if not sum(map(abs, values)) <= INT64_MAX:
            return False
        floats = self.floats(values)
        return not floats or min(map(abs, floats)) >= FLOAT_MIN_NORMAL


class Level:
    """The registry fields of one struct (`_fields`), read in one call when they hold their declared types."""

    def __init__(self, table: _Table) -> None:
        self.table = table
        attrs = [attr for attr, *_ in table]
        self.read: Callable[[object], tuple[Any, ...]] = (
            operator.attrgetter(*attrs) if len(attrs) > 1 else lambda obj: (getattr(obj, attrs[0]),)
        )
        self.coded = tuple((attr, name, _CODES[conv], zero, keep) for attr, name, conv, zero, keep in table)
        """`table` with each converter as its code (`_CODES`): what a compiled `field_values` reads."""
        self.types = tuple(type(zero) for _, _, _, zero, _ in table)
        """The declared type of each field, as its zero has it (Uint/Int64: int, float: float)."""
        self.fast = all(
            conv is None or (conv is _to_float and type(zero) is float) for _, _, conv, zero, _ in table
        )
        """Whether a plain value of the declared type is the line value as it is (no conversion), so the
        shortcut applies; levels that convert ints (kib/1024, P-state, floats from ints) take `field_values`."""

    def plan(self, mask: tuple[bool, ...], time: int) -> Plan:
        """The `Plan` of the values whose truth values are `mask`."""
        chosen = [
            i for i, (row, nonzero) in enumerate(zip(self.table, mask, strict=True)) if nonzero or row[4]
        ]
        kinds = [self.types[i] for i in chosen]
        names = tuple(self.table[i][1] for i in chosen)
        return Plan(
            names,
            _picker(chosen),
            _picker([j for j, kind in enumerate(kinds) if kind is float]),
            {self.table[i][0]: self.table[i][3] for i in chosen},
            lines_template(names, kinds, time),
        )


NODE = Level(_fields("node", SampleSystem))
NODE_BOOT = Level(_fields("node", SampleSystem, boot=True))
GPU = Level(_fields("accelerator", SampleGpu))
PROCESS = Level(_fields("process", SampleProcess))
PROCESS_GPU = Level(_fields("process_gpu", SampleProcessGpu))
DISK_NAMES = tuple(disk_stat_name(i) for i in range(17))

assert PROCESS.fast  # what PROCESS_FIELDS says holds for the shortcut of `object_lines` only
PROCESS_FIELDS: tuple[tuple[str, str, bool, bool, object], ...] = tuple(
    (attr, name, kind is float, keep_zero, zero)
    for (attr, name, _, zero, keep_zero), kind in zip(PROCESS.table, PROCESS.types, strict=True)
)
"""(attribute, measurement, float-typed, zero written, its zero) of each process field that may become a
line, in line order: the table a compiled writer of process lines follows (no field converts its value)."""
assert all(conv in (_to_float, _kib_to_mib) for _, _, conv, _, _ in PROCESS_GPU.table)
PROCESS_GPU_FIELDS: tuple[tuple[str, str, bool, bool, object], ...] = tuple(
    (attr, name, conv is _kib_to_mib, keep_zero, zero)
    for attr, name, conv, zero, keep_zero in PROCESS_GPU.table
)
"""(attribute, measurement, KiB -> MiB (an int divided by 1024; else a float as it is), zero written, its
zero) of each field of a process' GPU that may become a line, in line order: for a compiled writer."""


ReadValues = Callable[[object, Level], tuple[tuple[str, ...], Values, dict[str, object]] | None]
"""`Writer.read_values`."""
Plans = dict[tuple[Level, tuple[bool, ...]], Plan]
"""The plans of one sample, per level and pattern of zeros (`object_lines`)."""


def field_values(obj: object, table: _Table) -> tuple[tuple[str, ...], Values, dict[str, object]]:
    """(measurements, values, zeros) of the non-zero fields of `obj` listed in `table`, and of zeros where
    the table says so; `zeros` maps each field that became a line to its zero, so the skeleton keeps only
    what did not travel as a line. Field by field: for any values (see `object_lines` for the shortcut)."""
    names: list[str] = []
    values: list[float | int] = []
    zeros: dict[str, object] = {}
    for attr, name, conv, zero, keep_zero in table:
        v = getattr(obj, attr)
        if v or keep_zero:
            bv = v if conv is None else conv(v)
            if bv is not None:
                names.append(name)
                values.append(bv)
                zeros[attr] = zero
    return tuple(names), tuple(values), zeros


def object_lines(
    obj: object,
    level: Level,
    plans: dict[tuple[Level, tuple[bool, ...]], Plan],
    time: int,
    read: ReadValues | None = None,
) -> tuple[tuple[str, ...], Values, str | None, dict[str, object]]:
    """`field_values` of `obj` and, when every value is plain, the `lines_template` of its lines. `plans` caches the
    plans of one sample (a few patterns of zeros per level); the zeros returned may be shared: do not mutate.
    `read` (a writer's `read_values`) may compute `field_values` instead, or say None."""
    if level.fast:
        vals = level.read(obj)
        if tuple(map(type, vals)) == level.types:
            key = (level, tuple(map(truth, vals)))
            plan = plans.get(key)
            if plan is None:
                plan = plans[key] = level.plan(key[1], time)
            values = plan.pick(vals)
            if plan.plain(values):
                return plan.names, values, plan.template, plan.zeros
    got = read(obj, level) if read is not None else None
    names, values, zeros = got if got is not None else field_values(obj, level.table)
    return names, values, None, zeros


def plain_ints(values: Sequence[object]) -> bool:
    """Every value is an int64."""
    if not values:
        return True
    return set(map(type, values)) == {int} and min(values) >= INT64_MIN and max(values) <= INT64_MAX  # type: ignore[type-var, operator]
