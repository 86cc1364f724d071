"""A `NodeSample` as Sonar's sample envelope, a `Sysinfo` as Sonar's sysinfo envelope.

Why go through Sonar's envelope at all, rather than writing lines directly: the translator
(`schemas.translate`) is the one definition of how a sample looks on the bus (docs/mapping.md). A node
producer that built its own lines would be a second definition that drifts; one that builds the envelope
gets exactly the lines a real Sonar node would produce, the skeleton event that makes reassembly lossless,
and `--format sonar` for free.

The numbers follow real Sonar (v0.19, `src/linux/procfs.rs` and `ps_newfmt.rs`), not the collector's
natural units, so a consumer cannot tell this producer from Sonar:

- `system.cpus[i]`: busy seconds (user+nice+system+irq+softirq) since boot, floored; `used_memory` =
  MemTotal - MemAvailable, KiB; `load1/5/15`; `runnable_entities`/`existing_entities` from /proc/loadavg.
- Process `cpu_time`: (utime+stime+cutime+cstime) rounded to whole seconds (half up), `cpu_avg`: lifetime
  percent rounded to one decimal (ps's %CPU), `cpu_util`: percent of one core over the last interval, three
  decimals; `resident_memory` = RssAnon KiB, `virtual_memory` = data+stack KiB; `data_read/written/
  cancelled` = bytes / 1024 rounded *up* (Sonar's `div_ceil`); `num_threads` = threads - 1 (the main thread
  is not counted; a rolled-up record counts the non-main threads of all its processes).
- `epoch` = boot time - 2020-01-01Z for jobs outside Slurm, 0 (omitted) for Slurm jobs.
- GPU `performance_state` = P-state + 1 (0 = unknown), `power`/`power_limit` whole watts (truncated, as
  Sonar's integer milliwatt division), `fan` rounded.
- `time` is local time with its offset (`2026-01-28T09:22:48+01:00`, never `Z`), `system.boot` is UTC.
- Readers that failed (`NodeSample.errors`) become the sample's recoverable `errors`.

Pure functions of their input: no clock, no I/O, so tests pin every value.
"""

from __future__ import annotations

import math
import time

import msgspec

from hpcbus import __version__
from hpcbus.producers.node._io import clock_ticks
from hpcbus.producers.node.collector import NodeSample
from hpcbus.producers.node.gpu_nvml import GpuCard, GpuReading
from hpcbus.producers.node.jobs import JobReading
from hpcbus.producers.node.processes import ProcessReading
from hpcbus.producers.node.sysinfo import Sysinfo
from hpcbus.schemas.sonar.types import (
    Error,
    Metadata,
    SampleAttributes,
    SampleData,
    SampleDisk,
    SampleEnvelope,
    SampleGpu,
    SampleJob,
    SampleProcess,
    SampleProcessGpu,
    SampleSystem,
    SysinfoAttributes,
    SysinfoData,
    SysinfoEnvelope,
    SysinfoGpuCard,
)

__all__ = [
    "PRODUCER",
    "meta",
    "sample_envelope",
    "sonar_time",
    "sysinfo_envelope",
    "utc_time",
]

PRODUCER = "hpcbus"
"""`meta.producer` of every envelope this producer writes (Sonar writes "sonar")."""

_UINT_MAX = 2**63 - 1  # schemas.sonar.types accepts uint64 up to int64's maximum


def meta() -> Metadata:
    """`{"producer": "hpcbus", "version": <hpcbus version>}`; format 0, the only one the spec defines."""
    return Metadata(producer=PRODUCER, version=__version__)


def sonar_time(t: float) -> str:
    """Local time with its UTC offset, whole seconds (floored, like the line timestamps): Sonar's `time`."""
    sec = math.floor(t)
    lt = time.localtime(sec)
    off = lt.tm_gmtoff or 0
    sign = "+" if off >= 0 else "-"
    off = abs(off)
    return time.strftime("%Y-%m-%dT%H:%M:%S", lt) + f"{sign}{off // 3600:02d}:{off % 3600 // 60:02d}"


def utc_time(t: float) -> str:
    """UTC with `+00:00` (Sonar never writes `Z`): Sonar's `system.boot`."""
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(math.floor(t)))


def _u(v: float | int | None) -> int:
    """A non-negative integer for a Sonar `Uint`: None -> 0, rounded half up, clamped into range."""
    if v is None or not math.isfinite(v):
        return 0
    n = math.floor(v + 0.5)
    return 0 if n < 0 else min(n, _UINT_MAX)


def _zero(cls: type[msgspec.Struct], name: str) -> float:
    """The field's own default object: msgspec's `omit_defaults` recognises a float default by identity, so
    a computed 0.0 would be written out (`"cpu_util":0.0`) where Sonar omits the field."""
    for f in msgspec.structs.fields(cls):
        if f.name == name:
            default = f.default
            assert type(default) is float
            return default
    raise KeyError(name)


_CPU_AVG0 = _zero(SampleProcess, "cpu_avg")
_CPU_UTIL0 = _zero(SampleProcess, "cpu_util")
_GPU_UTIL0 = _zero(SampleProcessGpu, "gpu_util")
_GPU_MEM_UTIL0 = _zero(SampleProcessGpu, "gpu_memory_util")
_LOAD1_0 = _zero(SampleSystem, "load1")
_LOAD5_0 = _zero(SampleSystem, "load5")
_LOAD15_0 = _zero(SampleSystem, "load15")


def _fl(v: float | None, zero: float) -> float:
    """A float field: the struct's default object for zero (so it is omitted), else the value."""
    if v is None or v == 0 or not math.isfinite(v):
        return zero
    return float(v)


def _watts(v: float | None) -> int:
    """Whole watts, truncated: Sonar's NVML shim divides milliwatts by 1000 in integer arithmetic."""
    if v is None or not math.isfinite(v) or v <= 0:
        return 0
    return min(int(v), _UINT_MAX)


def _kib_up(nbytes: int) -> int:
    """Bytes -> KiB rounded up, as Sonar does for /proc/<pid>/io (a 1-byte read is not 0 KiB)."""
    return min(-(-nbytes // 1024), _UINT_MAX) if nbytes > 0 else 0


def _cpu_seconds(seconds: float, tck: int) -> int:
    """Sonar's `cpu_time`: whole seconds rounded half up, computed on ticks as Sonar does (no float drift)."""
    ticks = round(seconds * tck)
    return max(0, (ticks + tck // 2) // tck)


def _gpu(g: GpuReading) -> SampleGpu:
    return SampleGpu(
        index=g.index,
        # `uuid` is required non-empty; a card too broken to tell its UUID still deserves a record.
        uuid=g.uuid or g.bus_id or f"unknown-gpu-{g.index}",
        failing=g.failing,
        fan=_u(g.fan_percent),
        compute_mode=g.compute_mode or "",
        performance_state=0 if g.performance_state is None else g.performance_state + 1,
        memory=_u(g.memory_used_kib),
        ce_util=_u(g.ce_util_percent),
        memory_util=_u(g.memory_util_percent),
        temperature=g.temperature_c or 0,
        power=_watts(g.power_w),
        power_limit=_watts(g.power_limit_w),
        ce_clock=_u(g.ce_clock_mhz),
        memory_clock=_u(g.memory_clock_mhz),
    )


def _process(p: ProcessReading, tck: int) -> SampleProcess:
    merged = p.rolledup + 1 if p.rolledup > 0 else 1
    return SampleProcess(
        resident_memory=_u(p.resident_kib),
        virtual_memory=_u(p.virtual_kib),
        cmd=p.cmd,
        pid=0 if p.rolledup > 0 else p.pid,
        ppid=p.ppid,
        num_threads=max(0, p.num_threads - merged),
        cpu_avg=_fl(round(max(0.0, p.cpu_avg), 1), _CPU_AVG0),
        cpu_util=_fl(None if p.cpu_util is None else round(max(0.0, p.cpu_util), 3), _CPU_UTIL0),
        cpu_time=_cpu_seconds(p.cpu_time, tck),
        data_read=_kib_up(p.read_bytes),
        data_written=_kib_up(p.write_bytes),
        data_cancelled=_kib_up(p.cancelled_write_bytes),
        rolledup=p.rolledup,
        gpus=[
            SampleProcessGpu(
                index=g.index,
                uuid=g.uuid or f"unknown-gpu-{g.index}",
                gpu_util=_fl(g.gpu_util, _GPU_UTIL0),
                gpu_memory=_u(g.memory_kib),
                gpu_memory_util=_fl(g.memory_util, _GPU_MEM_UTIL0),
            )
            for g in p.gpus
        ],
    )


def _job(j: JobReading, tck: int) -> SampleJob:
    return SampleJob(
        job=j.job,
        user=j.user or "_user_unknown",
        epoch=j.epoch,
        processes=[_process(p, tck) for p in j.processes],
    )


def sample_envelope(s: NodeSample, cluster: str, *, node: str = "") -> SampleEnvelope:
    """The Sonar sample envelope of one reading; `node` overrides `s.hostname`."""
    host = node or s.hostname
    when = sonar_time(s.time)
    tck = s.cpu.clock_ticks if s.cpu is not None else clock_ticks()
    system = SampleSystem(
        boot=utc_time(s.boot_time) if s.boot_time else "",
        cpus=s.cpu.sonar_cpus() if s.cpu is not None else [],
        gpus=[_gpu(g) for g in s.gpus],
        disks=[SampleDisk(name=d.name, major=d.major, minor=d.minor, stats=list(d.stats)) for d in s.disks],
        used_memory=s.memory.used if s.memory is not None else 0,
    )
    if s.load is not None:
        system.load1 = _fl(s.load.load1, _LOAD1_0)
        system.load5 = _fl(s.load.load5, _LOAD5_0)
        system.load15 = _fl(s.load.load15, _LOAD15_0)
        system.runnable_entities = s.load.running
        system.existing_entities = s.load.total
    attrs = SampleAttributes(
        time=when,
        cluster=cluster,
        node=host,
        system=system,
        jobs=[_job(j, tck) for j in s.jobs],
        errors=[Error(time=when, detail=e, cluster=cluster, node=host) for e in s.errors if e],
    )
    return SampleEnvelope(meta=meta(), data=SampleData(attributes=attrs))


def _card(c: GpuCard) -> SysinfoGpuCard:
    return SysinfoGpuCard(
        index=c.index,
        uuid=c.uuid,
        address=c.address,
        manufacturer=c.manufacturer,
        model=c.model,
        architecture=c.architecture,
        driver=c.driver,
        firmware=c.cuda_version,  # what Sonar puts there for NVIDIA cards
        memory=_u(c.memory_kib),
        power_limit=_watts(c.power_limit_w),
        max_power_limit=_watts(c.max_power_limit_w),
        min_power_limit=_watts(c.min_power_limit_w),
        max_ce_clock=_u(c.max_ce_clock_mhz),
        max_memory_clock=_u(c.max_memory_clock_mhz),
    )


def sysinfo_envelope(info: Sysinfo, cluster: str, *, node: str = "") -> SysinfoEnvelope:
    """The Sonar sysinfo envelope; an errors-only envelope when the node description lacks what the spec
    requires (no MemTotal, no OS name), because a made-up value would be worse than a reported gap."""
    host = node or info.hostname
    when = sonar_time(info.time)
    missing = [
        name
        for name, value in (
            ("memory", info.memory_kib),
            ("os_name", info.os_name),
            ("os_release", info.os_release),
            ("architecture", info.architecture),
        )
        if not value
    ]
    if missing:
        detail = f"sysinfo: could not read {', '.join(missing)}"
        return SysinfoEnvelope(
            meta=meta(), errors=[Error(time=when, detail=detail, cluster=cluster, node=host)]
        )
    attrs = SysinfoAttributes(
        time=when,
        cluster=cluster,
        node=host,
        os_name=info.os_name,
        os_release=info.os_release,
        architecture=info.architecture,
        numa_nodes=info.numa_nodes,
        sockets=max(1, info.sockets),
        cores_per_socket=max(1, info.cores_per_socket),
        threads_per_core=max(1, info.threads_per_core),
        cpu_model=info.cpu_model,
        memory=info.memory_kib,
        topo_svg=info.topo_svg or "",
        cards=[_card(c) for c in info.cards],
        distances=[list(row) for row in info.distances],
    )
    return SysinfoEnvelope(meta=meta(), data=SysinfoData(attributes=attrs))
