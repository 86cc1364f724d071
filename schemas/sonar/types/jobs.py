"""Job records from the cluster's job manager: the attributes of a `job` envelope (Slurm jobs, sacct data)."""

from __future__ import annotations

import msgspec

from hpcbus.schemas.sonar.types.common import SonarStruct
from hpcbus.schemas.sonar.types.scalars import (
    Clustername,
    ExtendedUint,
    NonemptyString,
    NonzeroUint,
    OptionalTimestamp,
    Timestamp,
    Uint,
)


class SacctData(SonarStruct, kw_only=True):
    """Data aggregated by sacct, named as sacct names them (hence the CamelCase wire names)."""

    min_cpu: Uint = msgspec.field(name="MinCPU", default=0)
    """Minimum (system + user) CPU time of all tasks in job."""
    alloc_tres: str = msgspec.field(name="AllocTRES", default="")
    """Resources allocated to the job/step after it started running."""
    ave_cpu: Uint = msgspec.field(name="AveCPU", default=0)
    """Average (system + user) CPU time of all tasks in job."""
    ave_disk_read: Uint = msgspec.field(name="AveDiskRead", default=0)
    """Average amount read by all tasks in job."""
    ave_disk_write: Uint = msgspec.field(name="AveDiskWrite", default=0)
    """Average amount written by all tasks in job."""
    ave_rss: Uint = msgspec.field(name="AveRSS", default=0)
    """Average resident set size of all tasks in job."""
    ave_vm_size: Uint = msgspec.field(name="AveVMSize", default=0)
    """Average virtual memory size of all tasks in job."""
    elapsed_raw: Uint = msgspec.field(name="ElapsedRaw", default=0)
    """The job's elapsed time in seconds."""
    system_cpu: Uint = msgspec.field(name="SystemCPU", default=0)
    """System CPU time used by the job or job step."""
    user_cpu: Uint = msgspec.field(name="UserCPU", default=0)
    """User CPU time used by the job or job step."""
    max_rss: Uint = msgspec.field(name="MaxRSS", default=0)
    """Maximum resident set size of all tasks in job."""
    max_vm_size: Uint = msgspec.field(name="MaxVMSize", default=0)
    """Maximum virtual memory size of all tasks in job."""
    req_cpus: Uint = msgspec.field(name="ReqCPUS", default=0)
    """Requested CPUs (not in the spec text; only in Sonar's synthetic fixture)."""
    req_mem: Uint = msgspec.field(name="ReqMem", default=0)
    """Requested memory (not in the spec text; only in Sonar's synthetic fixture)."""
    req_nodes: Uint = msgspec.field(name="ReqNodes", default=0)
    """Requested nodes (not in the spec text; only in Sonar's synthetic fixture)."""


class SlurmJob(SonarStruct, kw_only=True):
    """One Slurm job or job step, as seen by sacct (or the Slurm REST API).

    The spec: "The first four fields, job_id, job_step, job_name, and job_state must be transmitted in every
    record. Other fields depend on the nature and state of the job." So only `job_id` and `job_state` are
    required here; `job_step` and `job_name` are strings whose default, the empty string, is also their
    absence ("This field's default value is the empty string"; real Sonar omits an empty `job_step`, see the
    corpus). Every other field may be absent, `submit_time` included: a stateful producer (Sonar, hpcbus'
    own Slurm producer) sends changed fields only, and the consumer must assume records "both partial and
    potentially redundant". An absent field is kept absent, never filled in.
    """

    job_id: NonzeroUint
    """The Slurm job ID that directly controls the task; for array/het jobs the subjob's own ID."""
    job_step: str = ""
    """The step: "" for the job itself (omitted, as Sonar omits it), otherwise a number, "batch", "extern"."""
    job_name: str = ""
    """The name of the job (an empty name is omitted, as Sonar omits empty strings)."""
    job_state: NonemptyString
    """PENDING, RUNNING, COMPLETED, ...; real Sonar also sends eg "CANCELLED by 2101037"."""
    array_job_id: NonzeroUint = 0
    """If not zero (omitted), the overarching ID of an array job."""
    array_task_id: Uint = 0
    """If array_job_id is set, the array element's index."""
    het_job_id: NonzeroUint = 0
    """If not zero (omitted), the overarching ID of a heterogeneous job."""
    het_job_offset: Uint = 0
    """If het_job_id is set, the het job element's index."""
    user_name: str = ""
    """The name of the user running the job."""
    account: str = ""
    """The name of the user's account."""
    submit_time: Timestamp = ""
    """The time the job was submitted; may be absent (a record with changed fields only), never empty."""
    time_limit: ExtendedUint = 0
    """The time limit; the spec says minutes, real Sonar sends seconds (both as ExtendedUint)."""
    partition: str = ""
    """The name of the partition."""
    reservation: str = ""
    """The name of the reservation."""
    nodes: list[str] = []
    """Nodes allocated to the job or step, as node ranges (Sonar v0.14 sends "None assigned" when pending)."""
    priority: ExtendedUint = 0
    """The job priority, as ExtendedUint."""
    distribution: str = ""
    """Requested layout (sacct Layout)."""
    gres_detail: list[str] = []
    """Requested generic resources."""
    requested_resources: str = ""
    """Requested TRES (not in the spec text; Sonar v0.16)."""
    allocated_resources: str = ""
    """Allocated TRES (not in the spec text; Sonar v0.14)."""
    requested_cpus: Uint = 0
    """Number of requested CPUs."""
    minimum_cpus_per_node: Uint = 0
    """Minimum CPUs per node."""
    requested_memory_per_node: Uint = 0
    """Requested memory per node in kilobytes."""
    requested_node_count: Uint = 0
    """Number of requested nodes."""
    start_time: OptionalTimestamp = ""
    """Time the job started, if started (so empty or omitted for pending jobs)."""
    suspend_time: Uint = 0
    """Number of seconds the job was suspended."""
    end_time: OptionalTimestamp = ""
    """Time the job ended (or was cancelled), if ended."""
    exit_code: Uint = 0
    """Job exit code (the status half of sacct's ExitCode), if ended."""
    sacct: SacctData | None = None
    """Data specific to sacct output."""


class JobsAttributes(SonarStruct, kw_only=True):
    """A collection of job records from the cluster's job manager."""

    time: Timestamp = ""
    """Time the current data were obtained."""
    cluster: Clustername = ""
    """The canonical cluster name."""
    slurm_jobs: list[SlurmJob] = []
    """Individual job records; there may be one per job step."""
