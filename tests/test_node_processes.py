"""Process reader against fixture trees (cgroup v1, v2, linuxproc ancestry) and the real /proc."""

import os
import pwd
import shutil
import subprocess
import sys

import pytest

from hpcbus.producers.node._io import page_size
from hpcbus.producers.node.processes import (
    CgroupJob,
    ProcessReader,
    UserNames,
    parse_cgroup_job,
    parse_stepd_cmdline,
)
from tests.node_fixtures import FIX, add_process, slurm_2605, tree

SL = "sEKNKTV3WPV500"  # Slurm's own example SLUID (doc/html/cgroup_v2.shtml)
BTIME = 1795305053  # btime of the captured vm/proc/stat, copied into the Slurm cases
NOW = BTIME + 800.0
KIB = page_size() // 1024


def read(case: str, **kw):
    return {p.pid: p for p in ProcessReader(str(FIX / case), **kw).read(NOW, BTIME)}


def test_cgroup_v1_jobs_steps_memory_io():
    procs = read("slurm-cgroup-v1")
    assert sorted(procs) == [1001, 1010, 1011, 1020, 1040, 1050, 1060]  # 1030 has no stat: skipped
    p = procs[1010]
    assert (p.job, p.step, p.cmd, p.ppid, p.pgid, p.sid) == (748468, "0", "python3", 1001, 1010, 1010)
    assert p.num_threads == 9
    assert p.resident_kib == (3300000 - 20000) * KIB  # RssAnon = statm resident - shared
    assert p.rss_kib == 3300000 * KIB
    assert p.virtual_kib == 3900000 * KIB
    assert p.vsize_kib == 4200000 * KIB
    assert (p.read_bytes, p.write_bytes, p.cancelled_write_bytes) == (1048576, 2097152, 4096)
    assert (p.user_time, p.system_time, p.children_time, p.cpu_time) == (3600.0, 12.0, 0.0, 3612.0)
    assert p.start_time == BTIME + 701.0
    assert p.cpu_avg == pytest.approx(3612.0 / (NOW - BTIME - 701.0) * 100)
    assert p.has_children and not procs[1011].has_children
    assert (procs[1011].job, procs[1011].step) == (748468, "0")
    assert (procs[1020].job, procs[1020].step) == (748468, "extern")
    assert (procs[1040].job, procs[1040].step) == (280678, "interactive")
    assert procs[1050].job == 0 and procs[1050].step == ""
    # io unreadable -> zeros, process still reported
    assert (procs[1060].job, procs[1060].read_bytes, procs[1060].write_bytes) == (748468, 0, 0)
    # slurmstepd outside the job's cgroups still belongs to its step through its own cmdline
    assert (procs[1001].job, procs[1001].step) == (748468, "0")


def test_uid_is_owner_of_the_pid_directory():
    procs = read("slurm-cgroup-v1")
    owner = os.stat(FIX / "slurm-cgroup-v1" / "proc" / "1010").st_uid
    assert procs[1010].uid == owner
    assert procs[1010].user == UserNames()(owner)


def test_cgroup_v2_kernel_threads_zombies_and_odd_paths():
    procs = read("slurm-cgroup-v2")
    assert 2 not in procs  # kthreadd skipped by PF_KTHREAD
    assert {pid: (p.job, p.step) for pid, p in procs.items() if p.job} == {
        2001: (1392969, "0"),
        2010: (1392969, "0"),
        2011: (1392969, "0"),
        2020: (1392969, "extern"),
        2021: (1392969, "extern"),
    }
    assert procs[2040].job == 0  # "/job_hello/" is not a job
    z = procs[2050]
    assert (z.state, z.cmd, z.resident_kib) == ("Z", "defunct <defunct>", 0)
    assert 2 in read("slurm-cgroup-v2", include_kernel_threads=True)


def test_linuxproc_jobs_from_slurmstepd_ancestors():
    procs = read("slurm-linuxproc")
    jobs = {pid: (p.job, p.step) for pid, p in procs.items()}
    assert jobs[3001] == jobs[3002] == jobs[3003] == (57, "batch")
    assert {jobs[pid] for pid in (3010, 3011, 3012, 3013, 3014, 3015, 3016)} == {(57, "0")}
    assert jobs[3020] == jobs[3021] == (58, "extern")
    assert jobs[3030] == jobs[3031] == jobs[3040] == (0, "")


def test_a_users_process_posing_as_slurmstepd_is_no_stepd(tmp_path):
    """`cp /bin/sleep /tmp/slurmstepd; exec -a 'slurmstepd: [4242.0]' /tmp/slurmstepd 999`: comm and title of
    a stepd, owned by the user, would give it and its children to another user's job 4242. Only a stepd whose
    real and effective uid are root's (`status`) counts: not the user's, not a set-uid program's (effective 0,
    real the user), not one whose owner cannot be read; a root one outside job cgroups (linuxproc) does."""
    root = tree(tmp_path, "slurm-linuxproc")
    session = "0::/user.slice/user-1000.slice/session-3.scope"
    posing = {3050: (1000, 1000), 3060: (1000, 0), 3070: None, 3080: (0, 0)}
    for n, (pid, uids) in enumerate(posing.items()):
        add_process(root, pid, 1, "slurmstepd", session, f"slurmstepd: [{4242 + n}.0]", uids=uids)
        add_process(root, pid + 1, pid, "sleep", session, "sleep 999")
    procs = read_root(root)
    jobs = {pid: (p.job, p.step) for pid, p in procs.items()}
    assert {pid: jobs[pid] for pid in (3050, 3051, 3060, 3061, 3070, 3071)} == dict.fromkeys(
        (3050, 3051, 3060, 3061, 3070, 3071), (0, "")
    )
    assert jobs[3080] == jobs[3081] == (4245, "0")  # root's: slurmd's stepd under proctrack/linuxproc
    assert jobs[3010] == (57, "0") and jobs[3020] == (58, "extern")  # the fixture's own stepds: root's


@pytest.mark.parametrize("job_id_paths", [False, True], ids=["sluid-paths", "CgroupJobIdPaths=yes"])
def test_a_root_stepd_counts_only_in_its_own_jobs_cgroup(tmp_path, job_id_paths):
    """Where the stepd's cgroup is a Slurm job's, root's title is believed only there: in the step's `slurm`
    leaf (SLUID layout, the step agreeing) or in the job its title names (`job_<id>` layout). Pid 2070 of
    `slurm_2605`, a root `slurmstepd: [999.0]` in job 1392969's task cgroup, maps nothing and gives its child
    nothing (the child is the job of the real stepd above)."""
    root = slurm_2605(tmp_path, job_id_paths=job_id_paths, stepd_uids=(0, 0))
    scope = "0::/system.slice/slurmstepd.scope"
    add_process(root, 2071, 2070, "sleep", f"{scope}/elsewhere", "sleep 999")
    procs = read_root(root)
    assert procs[2070].job == 1392969  # its own cgroup's
    assert (procs[2071].job, procs[2071].step) == (1392969, "0")  # the real stepd above 2070's: never job 999
    assert procs[2060].job == 1392969  # the SLUID is still mapped by the real stepds alone
    assert procs[2010].job == 1392969 and procs[2001].job == 1392969


def read_root(root):
    return {p.pid: p for p in ProcessReader(str(root)).read(NOW, BTIME)}


def test_vm_capture_sleep_and_zombie():
    procs = {p.pid: p for p in ProcessReader(str(FIX / "vm")).read(BTIME + 1000.0, BTIME)}
    assert sorted(procs) == [15721, 15722]  # pid 2 is kthreadd
    s = procs[15721]
    assert (s.cmd, s.pgid, s.ppid, s.state, s.job) == ("sleep", 15721, 15680, "S", 0)
    assert s.start_time == BTIME + 788.73
    assert s.vsize_kib == 730 * KIB and s.rss_kib == 423 * KIB and s.resident_kib == (423 - 395) * KIB
    assert s.read_bytes == 24576
    assert procs[15722].cmd == "true <defunct>"


def test_process_vanishing_between_reads_is_skipped(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(FIX / "slurm-cgroup-v2", root)
    (root / "proc" / "2011" / "statm").unlink()  # exited between reading stat and statm
    procs = {p.pid for p in ProcessReader(str(root)).read(NOW, BTIME)}
    assert 2011 not in procs and 2010 in procs


def test_malformed_stat_costs_only_that_process(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(FIX / "slurm-cgroup-v2", root)
    (root / "proc" / "2010" / "stat").write_text("2010 (gambit) R x y z\n")
    (root / "proc" / "2011" / "stat").write_text("garbage")
    procs = {p.pid for p in ProcessReader(str(root)).read(NOW, BTIME)}
    assert 2010 not in procs and 2011 not in procs and {2001, 2020, 2030} <= procs


def test_cgroup_result_is_cached_only_for_settled_processes(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(FIX / "slurm-cgroup-v2", root)
    reader = ProcessReader(str(root), cgroup_settle_s=10.0)
    reader.read(NOW, BTIME)
    # 2010 started at 710.5 s after boot: old -> cached; a cgroup change is not seen again
    (root / "proc" / "2010" / "cgroup").write_text("0::/user.slice\n")
    assert {p.pid: p.job for p in reader.read(NOW, BTIME)}[2010] == 1392969
    # a young process (2030 started 650 s after boot, 50 s before now) is re-read every time
    young = ProcessReader(str(root), cgroup_settle_s=100.0)
    assert {p.pid: p.job for p in young.read(BTIME + 700.0, BTIME)}[2030] == 0
    (root / "proc" / "2030" / "cgroup").write_text("0::/system.slice/slurmstepd.scope/job_77/step_0/user\n")
    assert {p.pid: p.job for p in young.read(BTIME + 700.0, BTIME)}[2030] == 77


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b"0::/system.slice/slurmstepd.scope/job_1392969/step_0/user/task_0\n", (1392969, "0")),
        (b"10:devices:/slurm/uid_2101171/job_280678/step_interactive/task_0\n", (280678, "interactive")),
        (b"4:memory:/slurm/uid_1000/job_42/step_batch\n", (42, "batch")),
        (b"2:cpu:/slurm/job_7/\n1:name=systemd:/x/job_8/step_0\n", (7, "")),
        (b"1:name=systemd:/\n0::/job_hello/\n0::/job_9/step_extern\n", (9, "extern")),
        # Slurm 26.05 cgroup/v2: the job's directory named by its SLUID (job id 0 until its stepd maps it)
        (
            b"0::/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/user/task_0\n",
            (0, "0", "sEKNKTV3WPV500"),
        ),
        (b"0::/system.slice/slurmstepd.scope/s8FXKTA79XAR00/step_batch\n", (0, "batch", "s8FXKTA79XAR00")),
        (b"0::/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_extern/slurm\n", (0, "extern", SL, True)),
        (b"0::/system.slice/slurmstepd.scope/sEKNKTV3WPV500/step_0/slurm/x\n", (0, "0", SL)),  # not the leaf
        (b"0::/x/sEKNKTV3WPV500/\n", None),  # no step: not Slurm's layout
        (b"0::/x/sEKNKTV3WPV50I/step_0\n", None),  # I is no Crockford digit
        (b"0::/x/sGKNKTV3WPV500/step_0\n", None),  # the first digit holds 4 bits: 0-F
        (b"1:cpuset:/slurm/job_5/step_0\n0::/s/sEKNKTV3WPV500/step_0\n", (5, "0")),  # the first line wins
        (b"random garbage\n", None),
        (b"0::/job_12", None),  # no trailing "/": not Sonar's pattern
        (b"", None),
    ],
)
def test_parse_cgroup_job(text, expected):
    assert parse_cgroup_job(text) == (None if expected is None else CgroupJob(*expected))


def test_parse_stepd_cmdline():
    assert parse_stepd_cmdline(b"slurmstepd: [57.batch]\0\0\0") == (57, "batch")
    assert parse_stepd_cmdline(b"slurmstepd: [12345]\0") == (12345, "")
    assert parse_stepd_cmdline(b"/usr/sbin/slurmstepd\0") is None


def test_user_names_cache_and_unknown_uid():
    names = UserNames()
    assert names(0) == pwd.getpwuid(0).pw_name
    unknown = 2**31 - 7
    assert names(unknown) == f"_user_{unknown}"
    assert names(unknown) == f"_user_{unknown}"  # cached miss, no exception


def test_real_proc_sees_a_spawned_process():
    with open("/proc/stat", "rb") as f:
        btime = int(next(line for line in f.read().split(b"\n") if line.startswith(b"btime")).split()[1])
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], process_group=0)
    try:
        import time

        procs = {p.pid: p for p in ProcessReader("/").read(time.time(), btime)}
        me = procs[child.pid]
        assert me.pgid == child.pid and me.ppid == os.getpid()
        assert me.uid == os.geteuid()
        assert me.rss_kib > 0 and me.resident_kib > 0 and me.vsize_kib > me.rss_kib
        assert os.getpid() in procs and procs[os.getpid()].has_children
    finally:
        child.kill()
        child.wait()
