"""What the metric registry says about one measurement, and the words it says it with.

Kept apart from the declarations (`sonar.py`, `node.py`) so that both, and every reader, share one record and
one vocabulary of levels, conversions and zero rules.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = [
    "AGGREGATIONS",
    "CONV_IDENTITY",
    "CONV_KIB_TO_MIB",
    "CONV_PSTATE",
    "LEVELS",
    "ZERO_OMITTED",
    "ZERO_WITH_BOOT",
    "ZERO_WRITTEN",
    "Metric",
]

LEVELS: dict[str, str] = {
    "node": "`type=node` (no `type-id` on the bus)",
    "hwthread": "`type=hwthread,type-id=<i>`",
    "socket": "`type=socket,type-id=<package>`",
    "socket_rapl": "`type=socket,type-id=<package>,stype=rapl,stype-id=<zone name>`",
    "accelerator": "`type=accelerator,type-id=<uuid>`",
    "disk": "`type=node,type-id=disk,stype=disk,stype-id=<device>`",
    "network": "`type=node,type-id=network,stype=network,stype-id=<interface>`",
    "infiniband": "`type=node,type-id=infiniband,stype=infiniband,stype-id=<hca>:<port>`",
    "filesystem": "`type=node,type-id=filesystem,stype=filesystem,stype-id=<fs name>`",
    "rapl": "`type=node,type-id=rapl,stype=rapl,stype-id=<zone name>`",
    "job": "`type=node,type-id=job,stype=job,stype-id=<jobkey>`",
    "process": "`type=node,type-id=process,stype=process,stype-id=<jobkey>/<pid>`",
    "process_gpu": "`type=accelerator,type-id=<uuid>,stype=process,stype-id=<jobkey>/<pid>`",
}
"""Where a measurement lives: level name -> the tags of its lines (docs/mapping.md section 3). A device below
the node has its `stype` as `type-id` (`schemas.lineprotocol.node_level_tags`), so cc-metric-store files it
at `network` / `networketh0` below the host."""

AGGREGATIONS = ("sum", "avg", "max")
"""How values of several children make their parent's (cc-backend's metric `aggregation`: a node's value from
its hwthreads or devices; the InfluxDB writer's fold of a job's processes)."""

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
    """One measurement on the bus: its name is declared once, with one unit and one type at every level."""

    name: str
    levels: tuple[str, ...]
    """Keys of LEVELS where lines of this name are written (most have one)."""
    unit: str
    """Unit of the value on the bus."""
    kind: type
    """`int` or `float`: the one line-protocol type of this measurement (InfluxDB fixes a field's type with
    its first point and drops later points of another type)."""
    agg: str
    """One of AGGREGATIONS."""
    source: str
    """Where the value comes from: the Sonar sample field (`system.gpus[].power`) or what the node agent
    reads (`/proc/net/dev counter`)."""
    cc: str
    """What cc-metric-collector emits for the same quantity ("" when nothing)."""
    field: str = ""
    """For a Sonar measurement: the attribute of the Sonar struct at its level (`cpus` for the hwthread list,
    `stats` for disk columns, "" for a value derived by the translator)."""
    conv: str = CONV_IDENTITY
    """CONV_* rule from the Sonar value to the bus value (inverted exactly on the way back)."""
    column: int = -1
    """For disk stats: the 0-based position in `SampleDisk.stats`."""
    zero: str = ZERO_WRITTEN
    """ZERO_*: whether a zero value is written as a line."""

    @property
    def level(self) -> str:
        """The (first) level: the only one of every Sonar measurement."""
        return self.levels[0]
