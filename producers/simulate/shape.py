"""The simulated node: a `NodeSample` shaped like a real 128-core, 4-GPU compute node running jobs.

Why a `NodeSample` and not ready-made lines: the node agent's own `Pipeline` then turns it into exactly
the messages a real node sends (Sonar-mapped lines, ClusterCockpit lines, job events, one payload per
subject, the same Nats-Msg-Ids), so the load a scale test puts on the bus is the real one, and it follows
every change of that path without a second definition to keep in step.

The shape comes from the shared corpus (`/work/shared/corpus/sonar`, see its PROVENANCE.md):

- CPUs, memory, load, disks and the Slurm jobs with their processes from the one Sonar sample of a real
  Slurm compute node (`slurmmonitor__fox_sample_slurmnode_v0.18.json`, c1-10.fox: 128 CPUs, 3 jobs);
- the 4 GPUs and the GPU job (processes with per-card use) from a real 4-card node
  (`jobanalyzer__n1_sample_gpu_v0.14.jsonl`, n1: 4 x RTX 2080 Ti).

Counters advance with each tick, so rates and percentages are plausible, and every value is a pure
function of (template, node index, tick time): a simulated node's sample for a given time is always the
same message, which keeps re-sends deduplicated and fault tests countable.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcbus.producers.node.collector import NodeSample
from hpcbus.producers.node.cpu import CpuPercent, CpuStat, CpuTicks, CpuUsage, HwthreadCpu
from hpcbus.producers.node.cpufreq import CpuFreq
from hpcbus.producers.node.disk import DiskRate, DiskStat
from hpcbus.producers.node.energy import RaplPower, RaplZone
from hpcbus.producers.node.gpu_nvml import GpuReading
from hpcbus.producers.node.infiniband import IbPort, IbRate
from hpcbus.producers.node.jobs import JobReading
from hpcbus.producers.node.load import LoadAvg
from hpcbus.producers.node.memory import MemInfo
from hpcbus.producers.node.net import NetDevice, NetRate
from hpcbus.producers.node.processes import ProcessGpu, ProcessReading

CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "corpus" / "sonar"
CPU_NODE = "slurmmonitor__fox_sample_slurmnode_v0.18.json"
GPU_NODE = "jobanalyzer__n1_sample_gpu_v0.14.jsonl"
MEM_TOTAL_KIB = 512 * 2**20
"""The fox node's used memory (162 GiB) fits a 512 GiB node, the usual size of a 128-core node."""
CLOCK_TICKS = 100
BOOT_AGE_S = 10 * 86400


class CorpusError(RuntimeError):
    """The corpus files the shape is built from are missing or not what they should be."""


def _attributes(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
        first = text.lstrip().splitlines()[0] if path.suffix == ".jsonl" else text
        attrs: dict[str, Any] = json.loads(first)["data"]["attributes"]
    except (OSError, ValueError, KeyError, IndexError) as exc:
        raise CorpusError(f"{path}: cannot read a Sonar sample envelope ({exc})") from None
    return attrs


@dataclass(frozen=True)
class Template:
    """What every simulated node shares: the corpus node's per-CPU load, jobs and GPUs."""

    busy_share: list[float]
    """Per hwthread, the share of time busy (from the fox node's busy seconds since boot)."""
    used_kib: int
    load: tuple[float, float, float, int, int]
    disks: list[dict[str, Any]]
    jobs: list[dict[str, Any]]
    gpus: list[dict[str, Any]]

    @classmethod
    def from_corpus(cls, corpus: Path = CORPUS) -> Template:
        cpu = _attributes(corpus / CPU_NODE)
        gpu = _attributes(corpus / GPU_NODE)
        system = cpu["system"]
        busy = [float(b) for b in system["cpus"]]
        top = max(busy) or 1.0
        gpu_jobs = [j for j in gpu["jobs"] if any(p.get("gpus") for p in j["processes"])]
        return cls(
            busy_share=[min(0.98, b / top) for b in busy],
            used_kib=int(system["used_memory"]),
            load=(
                float(system["load1"]),
                float(system["load5"]),
                float(system["load15"]),
                int(system["runnable_entities"]),
                int(system["existing_entities"]),
            ),
            disks=list(system.get("disks", [])),
            jobs=list(cpu["jobs"]) + gpu_jobs,
            gpus=list(gpu["system"]["gpus"]),
        )


def _wave(node: int, t: float, period: float = 600.0) -> float:
    """A slow deterministic wobble in [0, 1): nodes differ in phase, samples in time."""
    return 0.5 + 0.5 * math.sin(2 * math.pi * (t / period + node / 7.0))


class SimulatedNode:
    """One node: `sample(t)` is its `NodeSample` at time `t` (seconds), a pure function of node and time."""

    def __init__(self, template: Template, index: int, hostname: str, interval: float) -> None:
        self.t = template
        self.index = index
        self.hostname = hostname
        self.interval = interval
        self.boot = 1_700_000_000 - BOOT_AGE_S
        self.job_offset = 10_000_000 * (index + 1)

    def _ticks(self, busy: float, age: float) -> CpuTicks:
        total = int(age * CLOCK_TICKS)
        used = int(total * busy)
        return CpuTicks(user=int(used * 0.92), system=used - int(used * 0.92), idle=total - used)

    def _cpu(self, t: float) -> tuple[CpuStat, CpuUsage, list[CpuFreq]]:
        age = t - self.boot
        wobble = _wave(self.index, t)
        shares = [min(0.99, s * (0.9 + 0.1 * wobble)) for s in self.t.busy_share]
        hw = [
            HwthreadCpu(hwthread=i, ticks=self._ticks(s, age), busy_s=int(age * s))
            for i, s in enumerate(shares)
        ]
        total = CpuTicks(
            user=sum(h.ticks.user for h in hw),
            system=sum(h.ticks.system for h in hw),
            idle=sum(h.ticks.idle for h in hw),
        )
        stat = CpuStat(
            clock_ticks=CLOCK_TICKS,
            node=total,
            node_busy_s=sum(h.busy_s for h in hw),
            hwthreads=hw,
            boot_time=self.boot,
            procs_running=self.t.load[3],
        )

        def pct(i: int, s: float) -> CpuPercent:
            used = round(100 * s, 2)
            return CpuPercent(
                hwthread=i,
                user=round(used * 0.92, 2),
                nice=0.0,
                system=round(used * 0.08, 2),
                idle=round(100 - used, 2),
                iowait=0.0,
                irq=0.0,
                softirq=0.0,
                steal=0.0,
                guest=0.0,
                guest_nice=0.0,
                used=used,
            )

        per = [pct(i, s) for i, s in enumerate(shares)]
        usage = CpuUsage(interval_s=self.interval, node=pct(-1, sum(shares) / len(shares)), hwthreads=per)
        freq = [CpuFreq(hwthread=i, mhz=round(2000 + 1000 * s, 1)) for i, s in enumerate(shares)]
        return stat, usage, freq

    def _disks(self, t: float) -> tuple[list[DiskStat], list[DiskRate]]:
        stats, rates = [], []
        age = t - self.boot
        for d in self.t.disks:
            s = list(d.get("stats", []))[:11] + [0] * max(0, 11 - len(d.get("stats", [])))
            scale = age / BOOT_AGE_S
            reads, writes = int(s[0] * scale), int(s[4] * scale)
            stats.append(
                DiskStat(
                    name=d["name"],
                    major=int(d["major"]),
                    minor=int(d["minor"]),
                    reads=reads,
                    read_bytes=int(s[2] * scale) * 512,
                    writes=writes,
                    write_bytes=int(s[6] * scale) * 512,
                    io_ms=int(s[9] * scale),
                    stats=[int(v * scale) for v in s],
                )
            )
            rates.append(
                DiskRate(
                    name=d["name"],
                    read_bytes_per_s=round(s[2] * 512 / BOOT_AGE_S, 1),
                    write_bytes_per_s=round(s[6] * 512 / BOOT_AGE_S, 1),
                    reads_per_s=round(s[0] / BOOT_AGE_S, 2),
                    writes_per_s=round(s[4] / BOOT_AGE_S, 2),
                    busy_percent=round(min(100.0, s[9] / BOOT_AGE_S / 10), 2),
                )
            )
        return stats, rates

    def _gpus(self, t: float) -> list[GpuReading]:
        out = []
        for i, g in enumerate(self.t.gpus):
            util = int(g.get("ce_util", 0) * (0.8 + 0.4 * _wave(self.index + i, t)))
            out.append(
                GpuReading(
                    index=int(g.get("index", i)),
                    uuid=f"{g['uuid'][:-4]}{self.index % 0x10000:04x}",
                    bus_id=f"00000000:{0x18 + 0x20 * i:02X}:00.0",
                    name="NVIDIA GeForce RTX 2080 Ti",
                    fan_percent=g.get("fan"),
                    compute_mode="Default",
                    performance_state=max(0, int(g.get("performance_state", 1)) - 1),
                    memory_total_kib=11 * 2**20,
                    memory_used_kib=g.get("memory"),
                    ce_util_percent=min(100, util),
                    memory_util_percent=g.get("memory_util"),
                    temperature_c=g.get("temperature"),
                    power_w=float(g.get("power", 0)),
                    power_limit_w=float(g.get("power_limit", 0)),
                    ce_clock_mhz=g.get("ce_clock"),
                    memory_clock_mhz=g.get("memory_clock"),
                    energy_j=float(g.get("power", 0)) * (t - self.boot),
                )
            )
        return out

    def _jobs(self, t: float, gpus: list[GpuReading]) -> list[JobReading]:
        by_index = {g.index: g for g in gpus}
        jobs = []
        for n, j in enumerate(self.t.jobs):
            slurm = not j.get("epoch")
            job = int(j["job"]) + self.job_offset
            user = str(j["user"])
            uid = 10_000 + n
            procs = []
            for p in j["processes"]:
                cpu_time = (
                    float(p.get("cpu_time", 0)) + (t - 1_700_000_000) * float(p.get("cpu_avg", 0)) / 100
                )
                pgpus = [
                    ProcessGpu(
                        index=int(g["index"]),
                        uuid=by_index[int(g["index"])].uuid if int(g["index"]) in by_index else g["uuid"],
                        memory_kib=g.get("gpu_memory"),
                        gpu_util=g.get("gpu_util"),
                        memory_util=g.get("gpu_memory_util"),
                    )
                    for g in p.get("gpus", [])
                ]
                pid = int(p.get("pid", 0) or 0) or (4_000_000 + n)
                procs.append(
                    ProcessReading(
                        pid=pid,
                        ppid=int(p.get("ppid", 1)),
                        pgid=pid,
                        sid=pid,
                        uid=uid,
                        user=user,
                        state="R" if p.get("cpu_util") else "S",
                        cmd=str(p["cmd"])[:15],
                        start_time=float(self.boot + 3600 * (n + 1)),
                        user_time=cpu_time * 0.95,
                        system_time=cpu_time * 0.05,
                        children_time=0.0,
                        cpu_time=cpu_time,
                        cpu_avg=float(p.get("cpu_avg", 0.0)),
                        cpu_util=float(p["cpu_util"]) if "cpu_util" in p else float(p.get("cpu_avg", 0.0)),
                        num_threads=int(p.get("num_threads", 0)) + 1,
                        resident_kib=int(p.get("resident_memory", 0)),
                        rss_kib=int(p.get("resident_memory", 0)),
                        virtual_kib=int(p.get("virtual_memory", 0)),
                        vsize_kib=int(p.get("virtual_memory", 0)),
                        read_bytes=int(p.get("data_read", 0)) * 1024,
                        write_bytes=int(p.get("data_written", 0)) * 1024,
                        job=job if slurm else 0,
                        rolledup=int(p.get("rolledup", 0)),
                        gpus=pgpus,
                    )
                )
            jobs.append(
                JobReading(
                    job=job,
                    epoch=0 if slurm else int(j["epoch"]),
                    user=user,
                    uid=uid,
                    slurm=slurm,
                    processes=procs,
                )
            )
        return jobs

    def sample(self, t: float) -> NodeSample:
        cpu, usage, freq = self._cpu(t)
        disks, disk_rates = self._disks(t)
        gpus = self._gpus(t)
        jobs = self._jobs(t, gpus)
        age = t - self.boot
        load1, load5, load15, running, total = self.t.load
        used = int(self.t.used_kib * (0.95 + 0.1 * _wave(self.index, t)))
        rx = 1.2e8 * (0.5 + _wave(self.index, t))
        tx = 0.9e8 * (0.5 + _wave(self.index + 3, t))
        rapl_w = [180.0 + 60 * _wave(self.index + k, t) for k in range(2)]
        return NodeSample(
            time=t,
            hostname=self.hostname,
            interval_s=self.interval,
            boot_time=self.boot,
            cpu=cpu,
            cpu_usage=usage,
            memory=MemInfo(
                total=MEM_TOTAL_KIB * 1024,
                available=(MEM_TOTAL_KIB - used) * 1024,
                free=(MEM_TOTAL_KIB - used) * 1024 // 2,
                cached=(MEM_TOTAL_KIB - used) * 1024 // 3,
                anon_pages=used * 1024,
            ),
            load=LoadAvg(load1=load1, load5=load5, load15=load15, running=running, total=total),
            net=[
                NetDevice(
                    interface="eno1",
                    rx_bytes=int(rx * age),
                    rx_packets=int(rx * age / 1500),
                    tx_bytes=int(tx * age),
                    tx_packets=int(tx * age / 1500),
                )
            ],
            net_rates=[
                NetRate(
                    interface="eno1",
                    rx_bytes_per_s=round(rx, 1),
                    tx_bytes_per_s=round(tx, 1),
                    rx_packets_per_s=round(rx / 1500, 1),
                    tx_packets_per_s=round(tx / 1500, 1),
                )
            ],
            disks=disks,
            disk_rates=disk_rates,
            cpufreq=freq,
            rapl=[
                RaplZone(
                    zone=f"intel-rapl:{k}",
                    name=f"package-{k}",
                    package=k,
                    energy_uj=int(rapl_w[k] * age * 1e6) % 2**38,
                    max_energy_range_uj=2**38,
                )
                for k in range(2)
            ],
            rapl_power=[
                RaplPower(
                    zone=f"intel-rapl:{k}",
                    name=f"package-{k}",
                    package=k,
                    power_w=round(rapl_w[k], 2),
                    energy_j=round(rapl_w[k] * self.interval, 2),
                )
                for k in range(2)
            ],
            infiniband=[
                IbPort(
                    device="mlx5_0",
                    port=1,
                    rcv_bytes=int(rx * age),
                    xmit_bytes=int(tx * age),
                    rcv_packets=int(rx * age / 4096),
                    xmit_packets=int(tx * age / 4096),
                    state="ACTIVE",
                    link_layer="InfiniBand",
                )
            ],
            infiniband_rates=[
                IbRate(
                    device="mlx5_0",
                    port=1,
                    rcv_bytes_per_s=round(rx, 1),
                    xmit_bytes_per_s=round(tx, 1),
                    rcv_packets_per_s=round(rx / 4096, 1),
                    xmit_packets_per_s=round(tx / 4096, 1),
                )
            ],
            gpus=gpus,
            jobs=jobs,
            process_count=sum(len(j.processes) for j in jobs) + 300,
        )
