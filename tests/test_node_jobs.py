"""Job grouping (Sonar rules), roll-up, filters, start/end detection, and a real process group."""

import os
import pwd
import subprocess
import time

import msgspec
import pytest

from hpcbus.producers.node.jobs import (
    JobEnded,
    JobOptions,
    JobStarted,
    group_jobs,
    job_changes,
    job_presence,
    sonar_epoch,
)
from hpcbus.producers.node.processes import ProcessGpu, ProcessReader, ProcessReading
from tests.node_fixtures import FIX, slurm_2605

BTIME = 1795305053
NOW = BTIME + 800.0
ALL = JobOptions(min_uid=0)


def linuxproc():
    return ProcessReader(str(FIX / "slurm-linuxproc")).read(NOW, BTIME)


def proc(pid, ppid=1, pgid=None, uid=1000, user="alice", cmd="x", job=0, cpu=1.0, **kw) -> ProcessReading:
    return ProcessReading(
        pid=pid,
        ppid=ppid,
        pgid=pgid if pgid is not None else pid,
        sid=pid,
        uid=uid,
        user=user,
        state="S",
        cmd=cmd,
        start_time=BTIME + pid,
        user_time=cpu,
        system_time=0.0,
        children_time=0.0,
        cpu_time=cpu,
        cpu_avg=1.0,
        num_threads=1,
        resident_kib=100,
        rss_kib=200,
        virtual_kib=300,
        vsize_kib=400,
        job=job,
        **kw,
    )


def test_sonar_epoch_matches_the_fox_sample():
    # slurmmonitor fox sample: boot 2026-01-14T11:39:00Z, non-Slurm job epoch 190553940
    assert sonar_epoch(1768390740) == 190553940


def test_linuxproc_grouping_slurm_and_process_groups():
    jobs = {(j.job, j.epoch): j for j in group_jobs(linuxproc(), BTIME, ALL)}
    epoch = BTIME - 1577836800
    assert set(jobs) == {(57, 0), (58, 0), (3030, epoch), (3031, epoch), (3040, epoch)}
    j57 = jobs[(57, 0)]
    assert j57.slurm and [p.pid for p in j57.processes] == [
        3001,
        3002,
        3003,
        3010,
        3011,
        3012,
        3013,
        3014,
        3015,
        3016,
    ]
    assert not jobs[(3030, epoch)].slurm
    assert [p.cmd for p in jobs[(3030, epoch)].processes] == ["bash"]


def test_rollup_of_identical_childless_siblings():
    jobs = {j.job: j for j in group_jobs(linuxproc(), BTIME, JobOptions(min_uid=0, rollup=True))}
    records = jobs[57].processes
    rolled = [p for p in records if p.rolledup]
    assert len(rolled) == 1
    r = rolled[0]
    assert (r.pid, r.ppid, r.cmd, r.rolledup) == (0, 3010, "a.out", 3)
    assert r.user_time == pytest.approx((1000 + 1100 + 1200 + 1300) / 100)
    assert r.num_threads == 8
    # mpi-helper has a child: never rolled up, nor its child (different parent)
    assert {p.pid for p in records if not p.rolledup} == {3001, 3002, 3003, 3010, 3015, 3016}


def test_rollup_sums_gpu_use_per_card():
    gpu = [ProcessGpu(index=0, uuid="GPU-a", memory_kib=1000, gpu_util=30.0, memory_util=None)]
    procs = [proc(10, cmd="w", gpus=list(gpu)), proc(11, cmd="w", gpus=list(gpu)), proc(12, cmd="w")]
    for p in procs:
        p.pgid = 10
    (job,) = group_jobs(procs, BTIME, JobOptions(rollup=True))
    (r,) = job.processes
    assert r.rolledup == 2 and r.pid == 0
    assert r.gpus == [ProcessGpu(index=0, uuid="GPU-a", memory_kib=2000, gpu_util=60.0, memory_util=None)]


def test_filters_system_users_excluded_users_commands_and_min_cpu_time():
    procs = [
        proc(1, uid=0, user="root", cmd="systemd"),
        proc(20, user="alice", cmd="sim", cpu=100.0),
        proc(21, user="alice", cmd="sim", cpu=0.5, pgid=20),
        proc(30, user="bob", cmd="sshd"),
        proc(40, uid=1001, user="carol", cmd="zsh"),
    ]
    jobs = group_jobs(
        procs, BTIME, JobOptions(exclude_users=["carol"], exclude_commands=["ssh"], min_cpu_time=1.0)
    )
    assert [(j.job, [p.pid for p in j.processes]) for j in jobs] == [(20, [20])]
    assert [j.job for j in group_jobs(procs, BTIME, ALL)] == [1, 20, 30, 40]


def test_slurm_job_user_ignores_root_slurmstepd():
    procs = [
        proc(5, uid=0, user="root", cmd="slurmstepd", job=9),
        proc(6, ppid=5, job=9, user="dave", uid=1234),
    ]
    (j,) = group_jobs(procs, BTIME, ALL)
    assert (j.job, j.epoch, j.user, j.uid) == (9, 0, "dave", 1234)


def test_pgid_zero_never_merges_unrelated_processes():
    jobs = group_jobs([proc(1, pgid=0), proc(7, pgid=0)], BTIME, ALL)
    assert [j.job for j in jobs] == [1, 7]


def test_job_events_start_end_and_startup():
    a = [proc(5, job=100), proc(6, job=101), proc(7)]
    b = [proc(5, job=100), proc(8, job=102)]
    first = job_changes(None, job_presence(a, BTIME), NOW, NOW)
    assert {(e.job, e.at_startup) for e in first if isinstance(e, JobStarted)} == {(100, True), (101, True)}
    events = job_changes(job_presence(a, BTIME), job_presence(b, BTIME), NOW + 30, NOW)
    started = [e for e in events if isinstance(e, JobStarted)]
    ended = [e for e in events if isinstance(e, JobEnded)]
    assert [(e.job, e.at_startup, e.time, e.start_time) for e in started] == [
        (102, False, NOW + 30, BTIME + 8)
    ]
    assert [(e.job, e.last_seen, e.time) for e in ended] == [(101, NOW, NOW + 30)]
    # process-group jobs only when asked for
    everything = job_changes(job_presence(a, BTIME, False), job_presence(b, BTIME, False), NOW + 30, NOW)
    assert {e.job for e in everything} == {101, 102, 7}  # process group 7 ended too


def test_job_events_are_a_tagged_union():
    e = JobEnded(job=1, epoch=0, user="u", slurm=True, time=2.0, last_seen=1.0, start_time=0.5)
    data = msgspec.json.encode(e)
    assert b'"type":"job_ended"' in data
    assert msgspec.json.decode(data, type=JobStarted | JobEnded) == e


def test_real_process_group_is_one_job():
    with open("/proc/stat", "rb") as f:
        btime = int(next(line for line in f.read().split(b"\n") if line.startswith(b"btime")).split()[1])
    leader = subprocess.Popen(["sh", "-c", "sleep 30 & sleep 30 & wait"], process_group=0)
    try:
        deadline = time.time() + 10
        while True:
            procs = ProcessReader("/").read(time.time(), btime)
            mine = [p for p in procs if p.pgid == leader.pid]
            if len(mine) == 3 or time.time() > deadline:
                break
            time.sleep(0.05)
        jobs = [j for j in group_jobs(procs, btime, ALL) if j.job == leader.pid]
        assert len(jobs) == 1
        job = jobs[0]
        assert job.epoch == btime - 1577836800 and not job.slurm
        assert job.user == pwd.getpwuid(os.geteuid()).pw_name
        assert sorted(p.cmd for p in job.processes) == ["sh", "sleep", "sleep"]
        sleeps = [p for p in job.processes if p.cmd == "sleep"]
        assert all(p.ppid == leader.pid and p.pgid == leader.pid for p in sleeps)
        (rolled_job,) = [
            j for j in group_jobs(procs, btime, JobOptions(min_uid=0, rollup=True)) if j.job == leader.pid
        ]
        assert sorted((p.cmd, p.rolledup) for p in rolled_job.processes) == [("sh", 0), ("sleep", 1)]
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()


@pytest.mark.parametrize("job_id_paths", [False, True], ids=["sluid-paths", "CgroupJobIdPaths=yes"])
def test_slurm_26_05_cgroups_attribute_processes_under_both_layouts(tmp_path, job_id_paths):
    """Issue 32 item 3: Slurm 26.05's cgroup/v2 names a job's directory by its SLUID unless
    `CgroupJobIdPaths=yes` (the tree: `tests.node_fixtures.slurm_2605`, modelled on SchedMD/slurm
    `src/plugins/cgroup/v2/cgroup_v2.c` `cgroup_p_step_create`: `<scope>/<SLUID or job_<id>>/step_<s>/slurm`
    for the stepd, `.../user/task_<n>` for tasks; the SLUID from `doc/html/cgroup_v2.shtml`). The SLUID holds
    no job id (`src/common/sluid.h`: cluster, submit time, sequence), so it is mapped through the stepd in
    its `slurm` leaf (`slurmstepd: [1392969.0]`); the daemonized `dask-worker` (parent init) is job 1392969's
    under both layouts, a user's fake `slurmstepd` maps nothing, and a SLUID without stepds is not guessed."""
    root = slurm_2605(tmp_path, job_id_paths=job_id_paths)
    procs = {p.pid: p for p in ProcessReader(str(root)).read(NOW, BTIME)}
    assert procs[2060].ppid == 1 and procs[2060].pgid == 2060  # nothing but its cgroup is left
    assert {pid: (procs[pid].job, procs[pid].step) for pid in (2001, 2010, 2011, 2020, 2021, 2060, 2070)} == {
        2001: (1392969, "0"),
        2010: (1392969, "0"),
        2011: (1392969, "0"),
        2020: (1392969, "extern"),
        2021: (1392969, "extern"),
        2060: (1392969, "0"),
        2070: (1392969, "0"),
    }
    assert (procs[2080].job, procs[2080].step) == (
        0,
        "batch",
    )  # its stepds are gone: job unknown, not guessed
    jobs = {(j.job, j.epoch): j for j in group_jobs(list(procs.values()), BTIME, ALL)}
    assert 2060 in [p.pid for p in jobs[(1392969, 0)].processes]
    assert (2080, sonar_epoch(BTIME)) in jobs and not jobs[(2080, sonar_epoch(BTIME))].slurm
    assert not any(job == 999 for job, _ in jobs)


def test_a_sluid_whose_stepds_disagree_is_mapped_to_nothing(tmp_path):
    """Two stepds in `slurm` leaves of one SLUID naming two job ids cannot both be right: the SLUID is
    mapped to neither (never a guess), and its processes fall back to their stepd ancestor or group."""
    root = slurm_2605(tmp_path)
    (root / "proc" / "2021" / "cmdline").write_bytes(b"slurmstepd: [1392970.extern]\0")
    procs = {p.pid: p for p in ProcessReader(str(root)).read(NOW, BTIME)}
    assert procs[2060].job == 0  # daemonized: no ancestor either
    assert procs[2010].job == 1392969  # child of the stepd titled 1392969.0
    assert procs[2020].job == 1392970  # child of the stepd titled 1392970.extern
