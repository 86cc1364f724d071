"""Sonar's JSON envelopes as `msgspec.Struct`s: the spec's types plus every field real Sonar emits.

Why structs with constraints rather than dicts plus checks: msgspec checks types, unknown keys, missing keys,
bounds, string lengths and regex patterns in C while it decodes, so most of the spec's rules cost
nothing extra on the hot path (`schemas.sonar.validate` adds the few rules a type cannot express). The same
annotations generate the JSON Schema files (`schemas.sonar.jsonschema`), so the wire contract is written once.

Conventions, all from the spec ("in a serialization format that allows fields to be omitted, all fields
except union fields will have default values, which are zero, empty string, false ... or the empty array"):

* Every struct has `omit_defaults=True` (Sonar omits zero values rather than sending them, so re-encoding
  gives Sonar's own shape), `forbid_unknown_fields=True` (a misspelt key such as `os` for `os_name` is an
  error, not silently dropped data) and `kw_only=True` (fields keep the spec's order on the wire).
* A field is required (has no default) only where the spec says so in words: SlurmJob's "job_id, job_step,
  job_name, and job_state must be transmitted in every record", ClusterNodes' "the array of names may not be
  empty", the `data`/`errors` union and the `data.type` tag. A type such as `NonemptyString`, `NonzeroUint`,
  `Timestamp` or `Hostname` ("zero is an error, not simply absence of data") constrains a value that is
  *present*; it does not make the field mandatory. An optional field defaults to the zero value, so an absent
  field stays absent on output (`omit_defaults`) and nothing is invented, while a present empty string or 0
  is still refused. Also required, by the spec's words on uniqueness: `KVPair.key` ("a unique key within the
  array"), `SysinfoSoftwareVersion.key` ("a unique identifier"), `ClusterPartition.name` ("a Partition has a
  unique name").
* Nothing else is required (issue 10 decided it): not the attributes' `time`, `cluster` and `node`, not
  `SampleAttributes.system`, `SampleJob.user`, the GPU `uuid`s, the envelope's `meta` with its
  `producer`/`version`, `Error.detail`, nor the sysinfo OS names and hardware counts. A struct-valued field
  (`meta`, `data.attributes`, `system`) defaults to the empty object (`default_factory`); msgspec's
  `omit_defaults` omits only scalar and empty-collection defaults, so an absent object is written back as `{}`,
  which the spec defines as the same value. What hpcbus cannot *translate* without such a field (a sample
  without `node` has no `hostname` for its metric lines) is the translator's business
  (`schemas.translate.envelope_to_lines`): it never invents the value, and validation does not refuse it.
* Most checks happen inside msgspec's decoder; the exceptions are named where they are made (Timestamp's
  pattern, NodeRange syntax) and done by `schemas.sonar.validate`.
* `uint64` fields are `int` with `ge=0` and `le=2**63-1`. msgspec can only bound-check within int64, and
  InfluxDB stores integers as int64 too, so a value above 2^63-1 could not travel further anyway; no real
  Sonar value comes near it. `ExtendedUint` is a plain uint on the wire (0 unset, 1 infinite, v+2 for v).
* Real Sonar (v0.14-v0.19) emits more than the spec text describes; those fields are here, marked
  "(not in the spec text)" with the Sonar version that introduced them where known.

`gc=False`: these structs never form reference cycles, and keeping thousands of decoded processes out of the
garbage collector's tracking makes decoding measurably faster.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

import msgspec

__all__ = [
    "DATA_TYPES",
    "AnyEnvelope",
    "ClusterAttributes",
    "ClusterData",
    "ClusterEnvelope",
    "ClusterNodes",
    "ClusterPartition",
    "Error",
    "ErrorsEnvelope",
    "ExtendedUint",
    "Hostname",
    "Int64",
    "JobsAttributes",
    "JobsData",
    "JobsEnvelope",
    "KVPair",
    "Metadata",
    "NodeRange",
    "NonemptyString",
    "NonzeroUint",
    "OptionalTimestamp",
    "SacctData",
    "SampleAttributes",
    "SampleData",
    "SampleDisk",
    "SampleEnvelope",
    "SampleGpu",
    "SampleJob",
    "SampleProcess",
    "SampleProcessGpu",
    "SampleSystem",
    "SlurmJob",
    "SpecJobsData",
    "SysinfoAttributes",
    "SysinfoData",
    "SysinfoEnvelope",
    "SysinfoGpuCard",
    "SysinfoSoftwareVersion",
    "Timestamp",
    "Uint",
]

# --- Patterns ---------------------------------------------------------------------------------------------
# Written for both Python's `re` (what msgspec runs) and ECMA-262 (what JSON Schema validators run):
# `[0-9]` rather than `\d` (Python's `\d` also matches e.g. Arabic-Indic digits), and `(?!\n)$` at the end
# because Python's `$` also matches before a final newline ("host\n" must not pass).

_END = r"(?!\n)$"
_MONTH_DAY = (
    r"(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
    r"|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    r"|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
# 29 February only in leap years: divisible by 4 but not by 100, or divisible by 400.
_LEAP_DAY = r"(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][048]|[13579][26])00)-02-29"
_DATE = rf"(?:[0-9]{{4}}-{_MONTH_DAY}|{_LEAP_DAY})"
_TIME = r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9]"
_OFFSET = r"(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])"

TIMESTAMP_PATTERN = rf"^{_DATE}T{_TIME}{_OFFSET}{_END}"
"""RFC 3339 `yyyy-mm-ddThh:mm:ss+hh:mm` or `...Z`, no fractional seconds, a date that exists.

The whole check is in the pattern (days per month, leap years included), so one regex call settles it.
Leap seconds (`:60`) are refused: Sonar never writes them and Python's datetime cannot hold them.
"""
OPTIONAL_TIMESTAMP_PATTERN = rf"^(?:{_DATE}T{_TIME}{_OFFSET})?{_END}"

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOSTNAME_PATTERN = rf"^{_LABEL}(?:\.{_LABEL})*{_END}"
"""RFC 1123 host name: dot-separated labels of letters, digits and inner hyphens, each 1-63 characters."""

UINT64_MAX_ACCEPTED = 2**63 - 1
"""Largest uint64 value accepted; see the module docstring for why it is int64's maximum."""

# --- The spec's named types -------------------------------------------------------------------------------
# `extra={"kind": ...}` names the spec type so `schemas.sonar.diagnose` can explain a violation in the spec's
# words instead of quoting a regex.

Uint = Annotated[
    int, msgspec.Meta(ge=0, le=UINT64_MAX_ACCEPTED, description="uint64", extra={"kind": "uint64"})
]
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1, description="int64", extra={"kind": "int64"})]
NonzeroUint = Annotated[
    int,
    msgspec.Meta(
        ge=1,
        le=UINT64_MAX_ACCEPTED,
        description="NonzeroUint: uint64 value where zero is an error, not simply absence of data",
        extra={"kind": "NonzeroUint"},
    ),
]
ExtendedUint = Annotated[
    int,
    msgspec.Meta(
        ge=0,
        le=UINT64_MAX_ACCEPTED,
        description="ExtendedUint: 0 for unset, 1 for infinite, v+2 for every other value v",
        extra={"kind": "ExtendedUint"},
    ),
]
NonemptyString = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        description="NonemptyString: string value where an empty value is an error",
        extra={"kind": "NonemptyString"},
    ),
]
# Timestamps: msgspec checks only the length (free, in C); the pattern is checked by `schemas.sonar.validate`
# with a per-envelope cache, because a jobs envelope repeats the same few times hundreds of times and a regex
# call per string from inside msgspec more than doubled its decoding time. The JSON Schema still carries it.
Timestamp = Annotated[
    str,
    msgspec.Meta(
        min_length=20,
        max_length=25,
        description="Timestamp: RFC 3339 yyyy-mm-ddThh:mm:ss+hh:mm ('Z' for +00:00), no sub-second precision",
        extra_json_schema={"pattern": TIMESTAMP_PATTERN},
        extra={"kind": "Timestamp"},
    ),
]
OptionalTimestamp = Annotated[
    str,
    msgspec.Meta(
        max_length=25,
        description="OptionalTimestamp: a Timestamp, or the empty string for missing data",
        extra_json_schema={"pattern": OPTIONAL_TIMESTAMP_PATTERN},
        extra={"kind": "OptionalTimestamp"},
    ),
]
Hostname = Annotated[
    str,
    msgspec.Meta(
        max_length=253,
        pattern=HOSTNAME_PATTERN,
        description="Hostname: dotted host name or prefix of same (letters, digits, inner hyphens)",
        extra={"kind": "Hostname"},
    ),
]
NodeRange = Annotated[
    str,
    msgspec.Meta(
        min_length=1,
        description="NodeRange: compact host list such as c[1-3,5]-[2-4].fox (Slurm hostlist syntax)",
        extra={"kind": "NodeRange"},
    ),
]
"""Only non-emptiness is a type constraint; the syntax is checked with `schemas.noderange.expand`."""


class _Struct(msgspec.Struct, omit_defaults=True, forbid_unknown_fields=True, kw_only=True, gc=False):
    """Shared configuration (inherited by every struct below; `kw_only` must be repeated per class)."""


# --- Shared objects -------------------------------------------------------------------------------------


class KVPair(_Struct, kw_only=True):
    """Carrier of arbitrary attribute data."""

    key: NonemptyString
    """A unique key within the array for the attribute."""
    value: str = ""
    """Some attribute value."""


class Metadata(_Struct, kw_only=True):
    """Information about the data producer and the data format (the spec's MetadataObject)."""

    producer: NonemptyString = ""
    """The name of the component that generated the data (eg "sonar", "slurm-monitor")."""
    version: NonemptyString = ""
    """The semver of the producer."""
    format: Uint = 0
    """The data format version. The spec describes version 0; other values are accepted and kept (the corpus
    has a made-up 37 that Sonar's own reader accepts), since a version only flags changed semantics."""
    attrs: list[KVPair] = []
    """Generator-dependent attribute values."""
    token: str = ""
    """EXPERIMENTAL: an API token for the cluster named in the data (never filled in by Sonar)."""


class Error(_Struct, kw_only=True):
    """A continuable or non-continuable error (the spec's ErrorObject); every field is optional (Sonar's own
    fixture `sonar__newfmt_sysinfo.json` record 3 sends an error with its `detail` alone)."""

    time: OptionalTimestamp = ""
    """Time when the error was generated."""
    detail: NonemptyString = ""
    """A sensible English-language error message describing the error."""
    cluster: Hostname = ""
    """Canonical cluster name for node generating the error."""
    node: Hostname = ""
    """Name of node generating the error."""


# --- Sysinfo ----------------------------------------------------------------------------------------------


class SysinfoGpuCard(_Struct, kw_only=True):
    """Per-card information; string values are card-specific and not all are available on all cards."""

    index: Uint = 0
    """Local card index, may change at boot."""
    uuid: str = ""
    """UUID as reported by card (constructed by the producer if the card has none)."""
    address: str = ""
    """Intra-system card address, eg PCI address."""
    manufacturer: str = ""
    """A keyword: "NVIDIA", "AMD", "Intel" (others TBD)."""
    model: str = ""
    """The manufacturer's model string."""
    architecture: str = ""
    """Card-dependent, for NVIDIA this is "Turing", "Volta" etc."""
    driver: str = ""
    """The manufacturer's driver string."""
    firmware: str = ""
    """The manufacturer's firmware string."""
    memory: Uint = 0
    """GPU memory in kilobytes."""
    power_limit: Uint = 0
    """Power limit in watts."""
    max_power_limit: Uint = 0
    """Max power limit in watts."""
    min_power_limit: Uint = 0
    """Min power limit in watts."""
    max_ce_clock: Uint = 0
    """Max clock of compute element (MHz)."""
    max_memory_clock: Uint = 0
    """Max clock of GPU memory (MHz)."""


class SysinfoSoftwareVersion(_Struct, kw_only=True):
    """One software package available on the node (dropped by Sonar in v0.16, still accepted)."""

    key: NonemptyString
    """A unique identifier for the software package."""
    name: str = ""
    """Human-readable name of the software package."""
    version: NonemptyString = ""
    """The package's version number, in some package-specific format (the spec does not require it in words:
    absent is accepted, a present empty string is not)."""


class SysinfoAttributes(_Struct, kw_only=True):
    """A node: its CPUs, memory, devices and topology."""

    time: Timestamp = ""
    """Time the current data were obtained."""
    cluster: Hostname = ""
    """The canonical cluster name."""
    node: Hostname = ""
    """The name of the host as it is known to itself."""
    os_name: NonemptyString = ""
    """Operating system name (the sysname field of struct utsname)."""
    os_release: NonemptyString = ""
    """Operating system version (the release field of struct utsname)."""
    architecture: NonemptyString = ""
    """Architecture name (the machine field of struct utsname). Required by the spec, but Sonar 0.13 did not
    send it (corpus `sonar__newfmt_sysinfo.json` record 1): real data wins, so it may be absent."""
    numa_nodes: Uint = 0
    """Number of NUMA nodes (not in the spec text; Sonar v0.19)."""
    sockets: NonzeroUint = 0
    """Number of CPU sockets."""
    cores_per_socket: NonzeroUint = 0
    """Number of physical cores per socket."""
    threads_per_core: NonzeroUint = 0
    """Number of hyperthreads per physical core."""
    cpu_model: str = ""
    """Manufacturer's model name."""
    memory: NonzeroUint = 0
    """Primary memory in kilobytes."""
    topo_svg: str = ""
    """Base64-encoded SVG output of lstopo."""
    topo_text: str = ""
    """Text output of lstopo (not in the spec text; Sonar v0.18)."""
    cards: list[SysinfoGpuCard] = []
    """Per-card information."""
    software: list[SysinfoSoftwareVersion] = []
    """Per-software-package information (Sonar stopped sending it in v0.16)."""
    distances: list[list[Uint]] = []
    """NUMA distance matrix, one row per NUMA node (not in the spec text; Sonar v0.19)."""


# --- Sample -----------------------------------------------------------------------------------------------


class SampleGpu(_Struct, kw_only=True):
    """Utilization figures for one GPU card; some fields are available on some cards only."""

    index: Uint = 0
    """Local card index, may change at boot (Sonar omits it for card 0)."""
    uuid: NonemptyString = ""
    """Card UUID."""
    failing: Uint = 0
    """If not zero, an error code indicating a card failure state; 1 is "generic failure"."""
    fan: Uint = 0
    """Percent of primary fan's max speed, may exceed 100% on some cards."""
    compute_mode: str = ""
    """Current compute mode, card-specific if known at all."""
    performance_state: ExtendedUint = 0
    """Current performance level, card-specific, as ExtendedUint (0 = unknown, so P0 is sent as 2)."""
    memory: Uint = 0
    """Memory use in kilobytes."""
    ce_util: Uint = 0
    """Percent of computing element capability used."""
    memory_util: Uint = 0
    """Percent of memory used."""
    temperature: Int64 = 0
    """Degrees C card temperature at primary sensor (can be negative)."""
    power: Uint = 0
    """Watts current power usage."""
    power_limit: Uint = 0
    """Watts current power limit."""
    ce_clock: Uint = 0
    """Compute element current clock (MHz)."""
    memory_clock: Uint = 0
    """Memory current clock (MHz)."""


class SampleDisk(_Struct, kw_only=True):
    """One block device's counters from /proc/diskstats (not in the spec text; Sonar v0.15)."""

    name: str = ""
    """Device name, eg "sda1", "nvme0n1", "dm-0"."""
    major: Uint = 0
    """Device major number."""
    minor: Uint = 0
    """Device minor number."""
    stats: list[Uint] = []
    """The numeric columns of the device's /proc/diskstats line, in kernel order (17 on current kernels)."""


class SampleSystem(_Struct, kw_only=True):
    """State of the node as a whole, independent of the jobs running on it."""

    boot: OptionalTimestamp = ""
    """Boot time of the node, in UTC (not in the spec text; Sonar v0.15)."""
    cpus: list[Uint] = []
    """Per core: CPU seconds used since boot (the spec's SampleCpu)."""
    gpus: list[SampleGpu] = []
    """The state of individual GPU devices."""
    disks: list[SampleDisk] = []
    """Per block device counters (not in the spec text; Sonar v0.15)."""
    used_memory: Uint = 0
    """Primary memory in use in kilobytes (MemTotal - MemAvailable)."""
    load1: float = 0.0
    """One-minute load average (not in the spec text; Sonar v0.15)."""
    load5: float = 0.0
    """Five-minute load average (not in the spec text; Sonar v0.15)."""
    load15: float = 0.0
    """Fifteen-minute load average (not in the spec text; Sonar v0.15)."""
    runnable_entities: Uint = 0
    """Currently runnable scheduling entities, processes and threads (not in the spec text; Sonar v0.15)."""
    existing_entities: Uint = 0
    """Currently existing scheduling entities (not in the spec text; Sonar v0.15)."""


class SampleProcessGpu(_Struct, kw_only=True):
    """Per-process per-GPU sample data."""

    index: Uint = 0
    """Local card index, may change at boot."""
    uuid: NonemptyString = ""
    """Card UUID."""
    gpu_util: float = 0.0
    """Current GPU percentage utilization for the process on the card."""
    gpu_memory: Uint = 0
    """Current GPU memory used in kilobytes for the process on the card."""
    gpu_memory_util: float = 0.0
    """Current GPU memory usage percentage for the process on the card."""


class SampleProcess(_Struct, kw_only=True):
    """Sample values for a single process within a job."""

    resident_memory: Uint = 0
    """Kilobytes of private resident memory."""
    virtual_memory: Uint = 0
    """Kilobytes of virtual data+stack memory."""
    cmd: str = ""
    """The command (not the command line); zombies get a <defunct> annotation."""
    pid: Uint = 0
    """Process ID; zero (omitted) for rolled-up processes."""
    ppid: Uint = 0
    """Parent-process ID."""
    in_container: bool = False
    """The process runs in a container (not in the spec text)."""
    num_threads: Uint = 0
    """Number of threads minus one: the main thread is not counted (not in the spec text)."""
    cpu_avg: float = 0.0
    """Average CPU percentage over the process's lifetime; 100.0 is one full core."""
    cpu_util: float = 0.0
    """Current sampled CPU utilization; 100.0 is one full core."""
    cpu_time: Uint = 0
    """Cumulative CPU time in seconds over the process's lifetime."""
    data_read: Uint = 0
    """Kilobytes read, from /proc/<pid>/io (not in the spec text)."""
    data_written: Uint = 0
    """Kilobytes written, from /proc/<pid>/io (not in the spec text)."""
    data_cancelled: Uint = 0
    """Kilobytes of cancelled writes, from /proc/<pid>/io (not in the spec text)."""
    rolledup: Int64 = 0
    """Number of additional processes with the same cmd rolled into this record."""
    gpus: list[SampleProcessGpu] = []
    """GPU sample data for all cards used by the process."""


class SampleJob(_Struct, kw_only=True):
    """Sample data for a single job on the node. (job, epoch) identify it; epoch is 0 for Slurm jobs."""

    job: Uint = 0
    """The job ID: the Slurm job ID, or the process group ID for a non-Slurm job."""
    user: NonemptyString = ""
    """User name; `_user_<uid>` if only the uid is known, `_user_unknown` otherwise."""
    epoch: Uint = 0
    """Zero for batch jobs, otherwise a boot counter of the node (never 0 together with job 0)."""
    processes: list[SampleProcess] = []
    """Processes in the job, all with the same job ID."""


class SampleAttributes(_Struct, kw_only=True):
    """The state of a node and of its processes at a point in time."""

    time: Timestamp = ""
    """Time the current data were obtained."""
    cluster: Hostname = ""
    """The canonical cluster name whence the datum originated."""
    node: Hostname = ""
    """The name of the node as it is known to the node itself."""
    system: SampleSystem = msgspec.field(default_factory=SampleSystem)
    """State of the node as a whole."""
    jobs: list[SampleJob] = []
    """State of jobs on the node; empty for a heartbeat from an idle node."""
    errors: list[Error] = []
    """Recoverable errors, if any."""


# --- Jobs -------------------------------------------------------------------------------------------------


class SacctData(_Struct, kw_only=True):
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


class SlurmJob(_Struct, kw_only=True):
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


class JobsAttributes(_Struct, kw_only=True):
    """A collection of job records from the cluster's job manager."""

    time: Timestamp = ""
    """Time the current data were obtained."""
    cluster: Hostname = ""
    """The canonical cluster name."""
    slurm_jobs: list[SlurmJob] = []
    """Individual job records; there may be one per job step."""


# --- Cluster ----------------------------------------------------------------------------------------------


class ClusterPartition(_Struct, kw_only=True):
    """A partition: a unique name and some nodes (a node may be in several partitions)."""

    name: NonemptyString
    """Partition name."""
    nodes: list[NodeRange] = []
    """Nodes in the partition."""


class ClusterNodes(_Struct, kw_only=True):
    """Managed nodes that share the same state(s)."""

    names: Annotated[list[NodeRange], msgspec.Meta(min_length=1)]
    """The nodes; the spec requires at least one NodeRange."""
    states: list[str] = []
    """The state(s) of the nodes, sinfo's StateComplete split into upper-case words (eg MIXED, DRAIN)."""


class ClusterAttributes(_Struct, kw_only=True):
    """Cluster description: partitions and node states."""

    time: Timestamp = ""
    """Time the current data were obtained."""
    cluster: Hostname = ""
    """The canonical cluster name."""
    slurm: bool = False
    """True if at least some nodes are under Slurm management."""
    partitions: list[ClusterPartition] = []
    """Descriptions of the partitions on the cluster."""
    nodes: list[ClusterNodes] = []
    """Descriptions of the managed nodes on the cluster."""


# --- Data (the tagged part) -------------------------------------------------------------------------------
# `data.type` is a msgspec tag: it picks the struct while decoding and is written back on encoding, so it is
# never stored twice. The `type` property exposes it as the spec names it.


class SampleData(_Struct, tag_field="type", tag="sample", kw_only=True):
    """Sample data, for successful sample probes."""

    attributes: SampleAttributes = msgspec.field(default_factory=SampleAttributes)
    """The sample data themselves."""

    @property
    def type(self) -> str:
        """The `data.type` tag, always "sample"."""
        return "sample"


class SysinfoData(_Struct, tag_field="type", tag="sysinfo", kw_only=True):
    """Node data, for successful sysinfo probes."""

    attributes: SysinfoAttributes = msgspec.field(default_factory=SysinfoAttributes)
    """The node data themselves."""

    @property
    def type(self) -> str:
        """The `data.type` tag, always "sysinfo"."""
        return "sysinfo"


class JobsData(_Struct, tag_field="type", tag="job", kw_only=True):
    """Jobs data, tagged "job" as real Sonar sends it (and as Sonar's own Go decoder expects)."""

    attributes: JobsAttributes = msgspec.field(default_factory=JobsAttributes)
    """The jobs data themselves."""

    TAG: ClassVar[str] = "job"

    @property
    def type(self) -> str:
        """The `data.type` tag as received: "job" here, "jobs" for `SpecJobsData`."""
        return self.TAG


class SpecJobsData(JobsData, tag="jobs", kw_only=True):
    """Jobs data tagged "jobs", as the spec text says (and Sonar's synthetic fixture uses).

    A subclass rather than a flag, so that decoding remembers which spelling arrived and re-encoding writes
    the same one back, while `isinstance(data, JobsData)` holds for both.
    """

    TAG: ClassVar[str] = "jobs"


class ClusterData(_Struct, tag_field="type", tag="cluster", kw_only=True):
    """Cluster data, for successful cluster probes."""

    attributes: ClusterAttributes = msgspec.field(default_factory=ClusterAttributes)
    """The cluster data themselves."""

    @property
    def type(self) -> str:
        """The `data.type` tag, always "cluster"."""
        return "cluster"


DATA_TYPES: dict[str, type[_Struct]] = {
    "sample": SampleData,
    "sysinfo": SysinfoData,
    "job": JobsData,
    "jobs": SpecJobsData,
    "cluster": ClusterData,
}
"""Every accepted `data.type` value and the struct it selects."""

# --- Envelopes --------------------------------------------------------------------------------------------
# `data` and `errors` are exclusive (the spec's only union). Both are optional here and the rule is checked
# by `schemas.sonar.validate`, because msgspec cannot express "exactly one of two keys"; the JSON Schema
# files add it as a `oneOf`.


class SampleEnvelope(_Struct, kw_only=True):
    """A node's sample: sent from each node at each sampling interval."""

    meta: Metadata = msgspec.field(default_factory=Metadata)
    """Information about the producer and data format."""
    data: SampleData | None = None
    """Sample data, for successful probes."""
    errors: list[Error] = []
    """Error information, for unsuccessful probes."""


class SysinfoEnvelope(_Struct, kw_only=True):
    """A node's hardware configuration ("nodeinfo"), sent every 24 h and at boot."""

    meta: Metadata = msgspec.field(default_factory=Metadata)
    """Information about the producer and data format."""
    data: SysinfoData | None = None
    """Node data, for successful probes."""
    errors: list[Error] = []
    """Error information, for unsuccessful probes."""


class JobsEnvelope(_Struct, kw_only=True):
    """Job records from a cluster's job manager, sent from one master node."""

    meta: Metadata = msgspec.field(default_factory=Metadata)
    """Information about the producer and data format."""
    data: JobsData | SpecJobsData | None = None
    """Jobs data, for successful probes ("type" is "job" or "jobs")."""
    errors: list[Error] = []
    """Error information, for unsuccessful probes."""


class ClusterEnvelope(_Struct, kw_only=True):
    """Partitions and node states of a cluster, sent from one master node."""

    meta: Metadata = msgspec.field(default_factory=Metadata)
    """Information about the producer and data format."""
    data: ClusterData | None = None
    """Cluster data, for successful probes."""
    errors: list[Error] = []
    """Error information, for unsuccessful probes."""


class ErrorsEnvelope(_Struct, kw_only=True):
    """An errors-only envelope whose kind (sample, sysinfo, job, cluster) was not known from context.

    Such an envelope is `{"meta": ..., "errors": [...]}` whatever probe failed: the four envelope types have
    the same keys, and an error object carries only time, detail, cluster and node. So its kind can only come
    from where it was found (Kafka topic, NATS subject, file name): pass `expect=` to the decoder to get the
    proper envelope type; without it, this is what you get.
    """

    meta: Metadata = msgspec.field(default_factory=Metadata)
    """Information about the producer and data format."""
    errors: list[Error] = []
    """Error information."""


class AnyEnvelope(_Struct, kw_only=True):
    """What `schemas.sonar.validate` decodes into: one struct for all kinds, so that a single msgspec pass
    both dispatches on `data.type` and checks the types. It is then rewrapped, without copying, in the kind's
    own envelope class. Use `decode_envelope` rather than decoding into this directly: it adds the rules
    msgspec cannot check."""

    meta: Metadata = msgspec.field(default_factory=Metadata)
    data: SampleData | SysinfoData | JobsData | SpecJobsData | ClusterData | None = None
    errors: list[Error] = []
