"""`SacctRow`: one sacct line with every known column parsed, the form between parsing and rendering."""

from __future__ import annotations

from datetime import datetime

import msgspec

from hpcbus.schemas.slurm.values import JobId, Limit


class SacctRow(msgspec.Struct, gc=False):
    """One sacct line, every known column parsed; a column that was empty keeps its default.

    Built by keyword; positional arguments (every field has a default) are there for the compiled reader
    (`compiled.py`), which builds a row from a tuple several times faster than from keywords. `extra` stays
    the last field.

    Times are aware datetimes (sacct prints local time; `parse_sacct` attaches the caller's zone).
    Durations are seconds, an `int` when sacct printed whole seconds and a `float` when it printed a
    fraction (see `values.parse_duration` for why the type matters). Sizes are KiB.
    """

    line: int = 0
    """1-based line number in the parsed text, for messages."""
    job: JobId | None = None
    """JobID: the displayed id, with array/het/step structure."""
    job_id_raw: int | None = None
    """The job's own id from JobIDRaw (differs from `job.base` for array tasks and later het components)."""
    step_raw: str = ""
    """The step from JobIDRaw (same as `job.step`)."""
    job_name: str = ""
    user: str = ""
    """Empty on step rows: sacct reports the user on the job row only."""
    account: str = ""
    partition: str = ""
    reservation: str = ""
    layout: str = ""
    """Layout (`Cyclic`, `Block`, `Unknown`), Sonar's `distribution`."""
    state: str = ""
    """The state word, without `by <uid>`."""
    cancelled_by: int | None = None
    """The uid of `CANCELLED by <uid>`."""
    submit: datetime | None = None
    eligible: datetime | None = None
    start: datetime | None = None
    end: datetime | None = None
    elapsed_raw: int | None = None
    elapsed: int | float | None = None
    suspended: int | float | None = None
    user_cpu: int | float | None = None
    system_cpu: int | float | None = None
    total_cpu: int | float | None = None
    cpu_time: int | float | None = None
    ave_cpu: int | float | None = None
    min_cpu: int | float | None = None
    ave_disk_read: int | None = None
    ave_disk_write: int | None = None
    ave_rss: int | None = None
    ave_vmsize: int | None = None
    max_rss: int | None = None
    max_vmsize: int | None = None
    max_disk_read: int | None = None
    max_disk_write: int | None = None
    exit_status: int | None = None
    exit_signal: int | None = None
    req_cpus: int | None = None
    req_nodes: int | None = None
    alloc_cpus: int | None = None
    """NCPUS / AllocCPUS."""
    nnodes: int | None = None
    ntasks: int | None = None
    priority: int | None = None
    req_mem_kib: int | None = None
    """ReqMem in KiB: the job's total request since Slurm 21.08, per node (`Mn`) or per CPU (`Mc`) before."""
    req_mem_per_cpu: bool = False
    """True for an old-style `4000Mc` ReqMem: `req_mem_kib` is then per CPU, not per node."""
    time_limit: Limit = None
    """Minutes, `UNLIMITED`, or None (empty column or `Partition_Limit`)."""
    node_list: str = ""
    """NodeList as printed (a hostlist); empty for `None assigned`."""
    alloc_tres: str = ""
    req_tres: str = ""
    extra: dict[str, str] = {}
    """Columns this parser has no field for, verbatim, by their name as given in `fields`."""

    @property
    def job_id(self) -> int:
        """The job's own id: JobIDRaw's when present, else JobID's leading number (right unless array/het)."""
        if self.job_id_raw is not None:
            return self.job_id_raw
        if self.job is None:
            raise ValueError(f"line {self.line}: neither JobIDRaw nor JobID was parsed")
        return self.job.base

    @property
    def step(self) -> str:
        """The step name (`batch`, `extern`, `0`, ...); empty for the job row."""
        if self.job_id_raw is not None:
            return self.step_raw
        return self.job.step if self.job is not None else ""
