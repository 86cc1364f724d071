"""`NodeCollector`: one call per interval, one `NodeSample` back, whatever the node is missing.

The collector owns everything that needs two readings (CPU percentages, per-process CPU utilisation,
network/disk/IB/Lustre rates, RAPL power, job starts and ends), so the readers stay stateless and
testable. It never raises for what a node may legitimately lack or lose: absent hardware (no
InfiniBand, no RAPL, no GPU) simply yields empty lists; a reader that fails becomes a short error
string in `NodeSample.errors` (Sonar's recoverable `errors`), logged once per distinct cause, not
once per interval. Mapping to line protocol / Sonar JSON and publishing happen elsewhere.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import msgspec

from hpcbus.producers.node._io import join_root, read_text
from hpcbus.producers.node.cpu import CpuReader, CpuStat, CpuUsage, cpu_usage
from hpcbus.producers.node.cpufreq import CpuFreq, CpuFreqReader
from hpcbus.producers.node.cpuset import job_cpus
from hpcbus.producers.node.disk import DiskRate, DiskReader, DiskStat, disk_rates
from hpcbus.producers.node.energy import RaplPower, RaplReader, RaplZone, rapl_power
from hpcbus.producers.node.gpu_nvml import GpuReading, NvmlGpuReader
from hpcbus.producers.node.infiniband import IbPort, IbRate, InfinibandReader, ib_rates
from hpcbus.producers.node.jobs import (
    JobEnded,
    JobOptions,
    JobPresence,
    JobReading,
    JobStarted,
    group_jobs,
    job_changes,
    job_key,
    job_presence,
    sonar_epoch,
)
from hpcbus.producers.node.load import LoadAvg, LoadReader
from hpcbus.producers.node.lustre import LustreRate, LustreReader, LustreStats, lustre_rates
from hpcbus.producers.node.memory import MemInfo, MemoryReader
from hpcbus.producers.node.net import NetDevice, NetRate, NetReader, net_rates
from hpcbus.producers.node.processes import ProcessGpu, ProcessReader, ProcessReading
from hpcbus.producers.node.sysinfo import Sysinfo, SysinfoReader

log = logging.getLogger(__name__)

T = TypeVar("T")

_MAX_REMEMBERED_CAUSES = 1000


class NodeCollectorConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Options of `hpcbus produce node`'s collection half (the `[node]` table)."""

    root: str = "/"
    """Directory under which `/proc` and `/sys` are read; `/` on a node, a fixture tree in tests."""
    jobs: JobOptions = msgspec.field(default_factory=JobOptions)
    """Which processes are reported, and whether identical ones are rolled up."""
    processes: bool = True
    """Read processes and group them into jobs (the expensive part; off for a node-only agent)."""
    job_events: Literal["slurm", "all", "none"] = "slurm"
    """Which jobs produce JobStarted/JobEnded: Slurm jobs only, also process-group jobs, or none."""
    net_exclude: list[str] = msgspec.field(default_factory=lambda: ["lo"])
    """Interface name patterns (fnmatch) left out of network readings."""
    disk_exclude: list[str] = msgspec.field(default_factory=lambda: ["loop*", "ram*", "zram*"])
    """Block device name patterns (fnmatch) left out of disk readings."""
    disk_partitions: bool = False
    """Also report partitions (they double-count their disk)."""
    gpus: bool = True
    """Read NVIDIA GPUs through NVML when present."""
    rapl: bool = True
    """Read RAPL energy counters when present."""
    cpufreq: bool = True
    """Read per-hwthread clock frequencies."""
    cpufreq_cpuinfo_fallback: bool = True
    """Without cpufreq sysfs (VMs), take `cpu MHz` from /proc/cpuinfo."""
    infiniband: bool = True
    """Read InfiniBand port counters when present."""
    lustre: bool = True
    """Read Lustre client statistics when present."""
    include_kernel_threads: bool = False
    """Also list kernel threads (never part of a job)."""
    cgroup_settle_s: float = 10.0
    """Processes older than this keep their cgroup-derived job without re-reading the cgroup file."""
    nvml_retry_s: float = 600.0
    """How often to retry NVML initialisation after it failed (silently)."""
    gpu_type_id: Literal["uuid", "pci"] = "uuid"
    """How a GPU is named on the bus, in every accelerator `type-id` (Sonar-mapped and CC lines) and in the
    job events' `accelerators`: `uuid` = NVML's UUID, `pci` = the PCI bus id as cc-metric-collector writes
    it with `use_pci_info_as_type_id` (`00000000:49:00.0`). cc-backend needs a start_job's accelerators to
    equal the metric lines' type-id, so a cluster mixing hpcbus and cc-metric-collector nodes sets `pci`
    here and `use_pci_info_as_type_id` there (the collector's own default, the NVML index, matches
    neither). `uuid` is the default because it is Sonar's card identity (the `uuid` of Sonar samples and
    sysinfo, which stay joinable) and follows a card moved to another slot; with `pci`, samples carry the
    bus id in Sonar's `uuid` field and sysinfo's `cards[].address` maps it back to the card."""


class NodeSample(msgspec.Struct, kw_only=True):
    """Everything read from the node at one time. Counters are cumulative; `*_rates`/`*_power`/
    `cpu_usage` cover the interval since the previous sample and are empty/None in the first one."""

    time: float
    """Sample time, seconds since the Unix epoch."""
    hostname: str
    interval_s: float | None = None
    """Seconds since the previous sample; None in the first."""
    boot_time: int | None = None
    """btime, seconds since the epoch (Sonar `system.boot`)."""
    cpu: CpuStat | None = None
    cpu_usage: CpuUsage | None = None
    memory: MemInfo | None = None
    load: LoadAvg | None = None
    net: list[NetDevice] = msgspec.field(default_factory=list)
    net_rates: list[NetRate] = msgspec.field(default_factory=list)
    disks: list[DiskStat] = msgspec.field(default_factory=list)
    disk_rates: list[DiskRate] = msgspec.field(default_factory=list)
    cpufreq: list[CpuFreq] = msgspec.field(default_factory=list)
    rapl: list[RaplZone] = msgspec.field(default_factory=list)
    rapl_power: list[RaplPower] = msgspec.field(default_factory=list)
    infiniband: list[IbPort] = msgspec.field(default_factory=list)
    infiniband_rates: list[IbRate] = msgspec.field(default_factory=list)
    lustre: list[LustreStats] = msgspec.field(default_factory=list)
    lustre_rates: list[LustreRate] = msgspec.field(default_factory=list)
    gpus: list[GpuReading] = msgspec.field(default_factory=list)
    jobs: list[JobReading] = msgspec.field(default_factory=list)
    job_events: list[JobStarted | JobEnded] = msgspec.field(default_factory=list)
    process_count: int = 0
    """Processes read (kernel threads excluded), before job filters."""
    errors: list[str] = msgspec.field(default_factory=list)
    """Recoverable problems of this sample, `<family>: <reason>` (Sonar `errors`)."""
    collect_s: float = 0.0
    """Wall-clock seconds `collect()` took (self-telemetry)."""


class NodeCollector:
    """Collects `NodeSample`s; keep one instance for the life of the agent (it holds the previous sample).

    `nvml` is the NVML module (default: `import pynvml` on first use); tests pass a fake.
    """

    def __init__(self, config: NodeCollectorConfig | None = None, nvml: Any = None):
        self.config = cfg = config or NodeCollectorConfig()
        root = cfg.root
        self.cpu_reader = CpuReader(root)
        self.memory_reader = MemoryReader(root)
        self.load_reader = LoadReader(root)
        self.net_reader = NetReader(root, exclude=cfg.net_exclude)
        self.disk_reader = DiskReader(root, exclude=cfg.disk_exclude, include_partitions=cfg.disk_partitions)
        self.process_reader = ProcessReader(
            root, include_kernel_threads=cfg.include_kernel_threads, cgroup_settle_s=cfg.cgroup_settle_s
        )
        self.cpufreq_reader = CpuFreqReader(root, cpuinfo_fallback=cfg.cpufreq_cpuinfo_fallback)
        self.rapl_reader = RaplReader(root)
        self.ib_reader = InfinibandReader(root)
        self.lustre_reader = LustreReader(root)
        self.gpu_reader = (
            NvmlGpuReader(nvml, retry_s=cfg.nvml_retry_s, type_id=cfg.gpu_type_id) if cfg.gpus else None
        )
        self.hostname = read_text(join_root(root, "/proc/sys/kernel/hostname"), os.uname().nodename)
        self._prev: NodeSample | None = None
        self._prev_own_cpu: dict[tuple[int, float], float] = {}
        self._prev_presence: dict[tuple[int, int], JobPresence] | None = None
        self._logged: set[tuple[str, str]] = set()

    # -- error handling -------------------------------------------------------------------------------

    def _guard(self, family: str, fn: Callable[[], T], errors: list[str]) -> T | None:
        """Run one reader; an exception becomes an error string, logged the first time it is seen."""
        try:
            return fn()
        except Exception as exc:  # a reader's bug or a kernel surprise must not cost the sample
            reason = f"{type(exc).__name__}: {exc}" if not isinstance(exc, OSError) else str(exc)
            msg = f"{family}: {reason}"
            errors.append(msg)
            key = (family, reason)
            if key not in self._logged:
                if len(self._logged) < _MAX_REMEMBERED_CAUSES:
                    self._logged.add(key)
                log.warning("%s (reported once; further occurrences only in samples)", msg)
            return None

    # -- collection -----------------------------------------------------------------------------------

    def collect(self, now: float | None = None) -> NodeSample:
        """Read everything once. `now` is the sample time (seconds since the epoch; default: now)."""
        started = time.monotonic()
        now = time.time() if now is None else now
        cfg = self.config
        prev = self._prev
        dt = now - prev.time if prev is not None else None
        errors: list[str] = []
        g = self._guard
        s = NodeSample(time=now, hostname=self.hostname, interval_s=dt, errors=errors)

        s.cpu = g("cpu", self.cpu_reader.read, errors)
        s.memory = g("memory", self.memory_reader.read, errors)
        s.load = g("load", self.load_reader.read, errors)
        s.net = g("net", self.net_reader.read, errors) or []
        s.disks = g("disk", self.disk_reader.read, errors) or []
        if cfg.cpufreq:
            s.cpufreq = g("cpufreq", self.cpufreq_reader.read, errors) or []
        if cfg.rapl:
            s.rapl = g("rapl", self.rapl_reader.read, errors) or []
        if cfg.infiniband:
            s.infiniband = g("infiniband", self.ib_reader.read, errors) or []
        if cfg.lustre:
            s.lustre = g("lustre", self.lustre_reader.read, errors) or []
        if self.gpu_reader is not None:
            gpu = self.gpu_reader
            since_us = int(prev.time * 1e6) if prev is not None else 0
            s.gpus = g("gpu", lambda: gpu.read(since_us), errors) or []

        s.boot_time = s.cpu.boot_time if s.cpu is not None else (prev.boot_time if prev else None)

        if prev is not None and dt is not None and dt > 0:
            if s.cpu is not None and prev.cpu is not None:
                s.cpu_usage = cpu_usage(prev.cpu, s.cpu)
            s.net_rates = net_rates(prev.net, s.net, dt)
            s.disk_rates = disk_rates(prev.disks, s.disks, dt)
            s.rapl_power = rapl_power(prev.rapl, s.rapl, dt)
            s.infiniband_rates = ib_rates(prev.infiniband, s.infiniband, dt)
            s.lustre_rates = lustre_rates(prev.lustre, s.lustre, dt)

        if cfg.processes:
            self._jobs(s, prev, errors)

        s.collect_s = time.monotonic() - started
        self._prev = s
        return s

    def _jobs(self, s: NodeSample, prev: NodeSample | None, errors: list[str]) -> None:
        cfg = self.config
        boot_time = s.boot_time
        if boot_time is None:
            errors.append("processes: skipped, boot time unknown (/proc/stat unreadable)")
            return
        procs = self._guard("processes", lambda: self.process_reader.read(s.time, boot_time), errors)
        if procs is None:
            return  # keep the previous presence: a failed read must not look like every job ending
        s.process_count = len(procs)
        self._cpu_util(procs, s.time, prev.time if prev is not None else None)
        if s.gpus:
            _attach_gpus(procs, s.gpus)
        s.jobs = self._guard("jobs", lambda: group_jobs(procs, boot_time, cfg.jobs), errors) or []
        if cfg.job_events != "none":
            presence = job_presence(procs, boot_time, slurm_only=cfg.job_events == "slurm")
            last_seen = prev.time if prev is not None else s.time
            s.job_events = job_changes(self._prev_presence, presence, s.time, last_seen)
            self._prev_presence = presence
            if any(isinstance(e, JobStarted) for e in s.job_events):
                self._job_cpus(s, procs, boot_time)

    def _job_cpus(self, s: NodeSample, procs: list[ProcessReading], boot_time: int) -> None:
        """Give each starting job the hwthreads it may use (read once per start, not per sample)."""
        epoch = sonar_epoch(boot_time)
        pids: dict[tuple[int, int], list[int]] = {}
        for p in procs:
            if p.pid:
                pids.setdefault(job_key(p, epoch), []).append(p.pid)
        root = self.config.root
        s.job_events = [
            msgspec.structs.replace(e, hwthreads=tuple(job_cpus(root, pids.get((e.job, e.epoch), []))))
            if isinstance(e, JobStarted)
            else e
            for e in s.job_events
        ]

    def _cpu_util(self, procs: list[ProcessReading], now: float, prev_time: float | None) -> None:
        """Per-process CPU % over the interval, from the previous sample's CPU times (no sleeping)."""
        before = self._prev_own_cpu
        current: dict[tuple[int, float], float] = {}
        dt = now - prev_time if prev_time is not None else 0.0
        for p in procs:
            own = p.user_time + p.system_time
            key = (p.pid, p.start_time)
            current[key] = own
            old = before.get(key)
            if old is not None and dt > 0:
                p.cpu_util = max(0.0, own - old) / dt * 100.0
            elif prev_time is not None and p.start_time >= prev_time:
                life = now - p.start_time
                if life > 0:
                    p.cpu_util = own / life * 100.0
        self._prev_own_cpu = current

    def sysinfo(self, now: float | None = None) -> Sysinfo:
        """The node description (read rarely: at start and daily), sharing this collector's NVML."""
        reader = SysinfoReader(self.config.root, gpus=self.gpu_reader)
        return reader.read(now)

    def close(self) -> None:
        """Release NVML."""
        if self.gpu_reader is not None:
            self.gpu_reader.close()


def _attach_gpus(procs: list[ProcessReading], gpus: list[GpuReading]) -> None:
    """Give each process its per-card GPU use (Sonar `processes[].gpus`), matched by pid."""
    by_pid: dict[int, list[ProcessGpu]] = {}
    for card in gpus:
        for gp in card.processes:
            by_pid.setdefault(gp.pid, []).append(
                ProcessGpu(
                    index=card.index,
                    uuid=card.uuid,
                    memory_kib=gp.memory_kib,
                    gpu_util=None if gp.sm_util is None else float(gp.sm_util),
                    memory_util=None if gp.mem_util is None else float(gp.mem_util),
                )
            )
    if not by_pid:
        return
    for p in procs:
        mine = by_pid.get(p.pid)
        if mine:
            p.gpus = mine
