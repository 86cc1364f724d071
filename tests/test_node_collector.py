"""NodeCollector: two readings make rates, failures become sample errors, jobs start and end."""

import logging
import os
import shutil
import time
from pathlib import Path

import msgspec
import pytest

from hpcbus.producers.node import NodeCollector, NodeCollectorConfig, NodeSample
from hpcbus.producers.node.jobs import JobEnded, JobOptions, JobStarted
from hpcbus.producers.node.processes import ProcessGpu
from tests.node_fixtures import FIX, SLUID, slurm_2605, tree
from tests.test_node_gpu_nvml import Card, FakeNvml

BTIME = 1795305053


def collector(root, **kw):
    kw.setdefault("gpus", False)
    return NodeCollector(NodeCollectorConfig(root=str(root), **kw))


def bump_utime(stat: Path, ticks: int) -> None:
    data = stat.read_text()
    head, _, tail = data.rpartition(") ")
    f = tail.split(" ")
    f[11] = str(int(f[11]) + ticks)
    stat.write_text(head + ") " + " ".join(f))


def test_hpc_two_samples_give_rates_power_and_percentages(tmp_path):
    root = tree(tmp_path, "hpc")
    c = collector(root)
    first = c.collect(now=1768400000.0)
    assert first.errors == []
    assert first.interval_s is None and first.cpu_usage is None
    assert first.net_rates == [] and first.rapl_power == [] and first.infiniband_rates == []
    assert first.hostname == "c1-10" and first.boot_time == 1768390740
    assert len(first.rapl) == 4 and len(first.cpufreq) == 8 and len(first.lustre) == 1
    shutil.copytree(FIX / "hpc-later", root, dirs_exist_ok=True)
    s = c.collect(now=1768400010.0)
    assert s.errors == [] and s.interval_s == 10.0
    assert s.cpu_usage is not None and s.cpu_usage.node.used == pytest.approx(50.0)
    assert {p.zone: round(p.power_w, 6) for p in s.rapl_power} == {
        "intel-rapl:0": 100.0,
        "intel-rapl:0:0": 20.0,
        "intel-rapl:1": 100.0,
        "intel-rapl:1:0": 15.0,
    }
    assert s.infiniband_rates[0].rcv_bytes_per_s == pytest.approx(1e9)
    assert s.lustre_rates[0].read_bytes_per_s == pytest.approx(100 * 2**20)
    assert {r.interface: r.rx_bytes_per_s for r in s.net_rates}["eno1"] == pytest.approx(125e6)
    assert {r.name for r in s.disk_rates} == {"sda", "nvme0n1", "dm-0"}
    assert s.memory is not None and s.memory.used == 196608000 - 26643940
    assert s.load is not None and s.load.load1 == 4.12


def test_sample_round_trips_as_json(tmp_path):
    c = collector(tree(tmp_path, "slurm-cgroup-v2"), jobs=JobOptions(min_uid=0))
    s = c.collect(now=BTIME + 800.0)
    back = msgspec.json.decode(msgspec.json.encode(s), type=NodeSample)
    assert back == s
    assert any(isinstance(e, JobStarted) for e in back.job_events)


def test_missing_files_become_errors_logged_once(tmp_path, caplog):
    root = tree(tmp_path, "hpc")
    (root / "proc" / "stat").unlink()
    (root / "proc" / "meminfo").write_text("garbage\n")
    c = collector(root)
    with caplog.at_level(logging.WARNING, logger="hpcbus.producers.node.collector"):
        a = c.collect(now=1.0)
        b = c.collect(now=2.0)
    for s in (a, b):
        assert s.cpu is None and s.memory is None and s.cpu_usage is None
        assert s.load is not None and len(s.rapl) == 4  # the rest of the sample is kept
        assert [e.split(":")[0] for e in s.errors] == ["cpu", "memory", "processes"]
    assert len(caplog.records) == 2  # cpu and memory, once each; not per interval


def test_absent_hardware_is_not_an_error(tmp_path):
    s = collector(tree(tmp_path, "vm")).collect(now=BTIME + 1000.0)
    assert s.errors == []
    assert s.rapl == [] and s.infiniband == [] and s.lustre == [] and s.gpus == []
    assert [f.source for f in s.cpufreq] == ["cpuinfo", "cpuinfo"]


def test_job_start_and_end_through_the_collector(tmp_path):
    root = tree(tmp_path, "slurm-cgroup-v2")
    c = collector(root, jobs=JobOptions(min_uid=0))
    first = c.collect(now=BTIME + 800.0)
    assert [(e.job, e.at_startup) for e in first.job_events if isinstance(e, JobStarted)] == [(1392969, True)]
    assert {j.job for j in first.jobs} >= {1392969, 2030}
    assert c.collect(now=BTIME + 830.0).job_events == []
    for pid in (2001, 2010, 2011, 2020, 2021):
        shutil.rmtree(root / "proc" / str(pid))
    third = c.collect(now=BTIME + 860.0)
    (ended,) = third.job_events
    assert isinstance(ended, JobEnded)
    assert (ended.job, ended.epoch, ended.last_seen, ended.time) == (1392969, 0, BTIME + 830.0, BTIME + 860.0)
    assert ended.start_time == BTIME + 709.9
    # all jobs, including process groups, when configured
    c_all = collector(tree(tmp_path / "b", "slurm-cgroup-v2"), jobs=JobOptions(min_uid=0), job_events="all")
    assert {e.job for e in c_all.collect(now=BTIME + 800.0).job_events} == {1392969, 2030, 2040}
    c_none = collector(tree(tmp_path / "c", "slurm-cgroup-v2"), job_events="none")
    assert c_none.collect(now=BTIME + 800.0).job_events == []


def test_failed_process_read_does_not_end_every_job(tmp_path):
    root = tree(tmp_path, "slurm-cgroup-v2")
    c = collector(root, jobs=JobOptions(min_uid=0))
    c.collect(now=BTIME + 800.0)
    (root / "proc").rename(root / "proc-gone")
    s = c.collect(now=BTIME + 830.0)
    assert s.job_events == [] and any(e.startswith("cpu:") for e in s.errors)
    (root / "proc-gone").rename(root / "proc")
    assert c.collect(now=BTIME + 860.0).job_events == []


def test_cpu_util_from_the_previous_sample(tmp_path):
    root = tree(tmp_path, "slurm-cgroup-v2")
    c = collector(root, jobs=JobOptions(min_uid=0))
    first = c.collect(now=BTIME + 800.0)
    procs = {p.pid: p for j in first.jobs for p in j.processes}
    assert procs[2010].cpu_util is None  # first sample: no sleeping to get one
    bump_utime(root / "proc" / "2010" / "stat", 500)  # 5 s of CPU in 10 s
    # a process that started after the first sample: its lifetime is the interval
    shutil.copytree(root / "proc" / "2030", root / "proc" / "2031")
    stat = (root / "proc" / "2031" / "stat").read_text().replace("2030 (bash)", "2031 (bash)", 1)
    f = stat.split(" ")
    f[13], f[21] = "200", str(int((805.0) * 100))  # 2 s utime, started 805 s after boot
    (root / "proc" / "2031" / "stat").write_text(" ".join(f))
    second = c.collect(now=BTIME + 810.0)
    procs = {p.pid: p for j in second.jobs for p in j.processes}
    assert procs[2010].cpu_util == pytest.approx(50.0)
    assert procs[2011].cpu_util == pytest.approx(0.0)
    assert procs[2031].cpu_util == pytest.approx((2.0 + 0.03) / 5.0 * 100)


def test_gpu_use_is_attached_to_job_processes(tmp_path):
    fake = FakeNvml([Card(0)])
    c = NodeCollector(
        NodeCollectorConfig(root=str(tree(tmp_path, "slurm-cgroup-v2")), jobs=JobOptions(min_uid=0)),
        nvml=fake,
    )
    s = c.collect(now=BTIME + 800.0)
    assert [g.uuid for g in s.gpus] == ["GPU-00000000-926f-e54f-9828-ad1d8680469a"]
    assert fake.since == [0]
    (job,) = [j for j in s.jobs if j.job == 1392969]
    gambit = next(p for p in job.processes if p.pid == 2010)
    assert gambit.gpus == [
        ProcessGpu(
            index=0,
            uuid="GPU-00000000-926f-e54f-9828-ad1d8680469a",
            memory_kib=9050112,
            gpu_util=60.0,
            memory_util=14.0,
        )
    ]
    c.collect(now=BTIME + 830.0)
    assert fake.since == [0, int((BTIME + 800.0) * 1e6)]
    c.close()
    assert fake.shutdown_calls == 1


def test_real_node(caplog):
    c = NodeCollector(NodeCollectorConfig(jobs=JobOptions(min_uid=0)))
    s = c.collect()
    time.sleep(0.05)
    s2 = c.collect()
    assert s.errors == [] and s2.errors == []
    assert s.cpu is not None and s.memory is not None and s.load is not None
    assert s.process_count > 0
    me = [p for j in s2.jobs for p in j.processes if p.pid == os.getpid()]
    assert len(me) == 1 and me[0].cpu_util is not None
    info = c.sysinfo()
    assert info.memory_kib == s.memory.total
    c.close()


def test_a_slurm_26_05_job_starts_with_its_sluid_directory_cpuset(tmp_path):
    """Slurm 26.05 (cgroup/v2, SLUID-named job directories; tree `tests.node_fixtures.slurm_2605`, modelled
    on SchedMD/slurm `src/plugins/cgroup/v2/cgroup_v2.c`): the job starts under its job id, with the
    hwthreads of the SLUID directory's `cpuset.cpus.effective` (the `nodejob` event's), and the daemonized
    process is among its processes."""
    root = slurm_2605(tmp_path)
    cpuset = root / "sys/fs/cgroup/system.slice/slurmstepd.scope" / SLUID
    cpuset.mkdir(parents=True)
    (cpuset / "cpuset.cpus.effective").write_text("2-3\n")
    first = collector(root, jobs=JobOptions(min_uid=0)).collect(now=BTIME + 800.0)
    (started,) = [e for e in first.job_events if isinstance(e, JobStarted)]
    assert (started.job, started.epoch, started.hwthreads) == (1392969, 0, (2, 3))
    (job,) = [j for j in first.jobs if j.job == 1392969]
    assert 2060 in [p.pid for p in job.processes]
