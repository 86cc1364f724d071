"""`hpcbus report` settings (`[report]`): how finely it plots and the flag thresholds it applies to jobs
that have no `job_summary` point."""

from __future__ import annotations

from typing import Annotated

import msgspec

from hpcbus.influx.settings import INFLUX
from hpcbus.keys import CPU_UNDERUSED, IDLE_GPU, MEM_OVERREQUESTED, CpuUnderused, IdleGpu, MemOverrequested
from hpcbus.options import Section
from hpcbus.schemas.jobsummary import Thresholds, thresholds_of


class ReportSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """How a job report is read and judged."""

    max_points: Annotated[int, msgspec.Meta(ge=10, le=100_000)] = 1000
    """Points per plotted series at most: a longer job is read in buckets of several samples (the
    bucket's mean), so a month-long job costs as much to report as an hour-long one."""
    idle_gpu: IdleGpu = IDLE_GPU
    mem_overrequested: MemOverrequested = MEM_OVERREQUESTED
    cpu_underused: CpuUnderused = CPU_UNDERUSED

    def thresholds(self) -> Thresholds:
        return thresholds_of(self)


REPORT = Section("report", ReportSettings, metavars={"max_points": "N"})


WRITE_ONLY = ("batch_lines", "gzip", "max_retry_wait", "processes", "max_future")
"""`[influx]` keys only the writer uses: accepted in a shared config file, but no flags of the report's."""

INFLUX_READ = Section(
    INFLUX.table,
    INFLUX.struct,
    title="influx (the InfluxDB `report` reads; the same [influx] table as `consume influx`)",
    env=INFLUX.env,
    flags={**INFLUX.flags, **{name: () for name in WRITE_ONLY}},
    metavars=INFLUX.metavars,
    notes={
        **{name: "Not used by `report` (it only reads)." for name in WRITE_ONLY},
        "api": "`report` reads with InfluxQL over `/query` either way (2.x and 3.x answer it too: the "
        "token in `Authorization`, the bucket as the database); the API only picks those credentials.",
        "db": "`report` reads this database (`bucket` with v2); it creates nothing.",
    },
)
"""`consume influx`'s `[influx]` section (same keys, flags and `INFLUX_*` variables), for reading."""
