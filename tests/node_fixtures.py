"""The node agent's fixture trees (tests/fixtures/node/<case>: the /proc and /sys files of real machines,
see its PROVENANCE.md) and a writable copy of one for a test to change."""

from __future__ import annotations

import shutil
from pathlib import Path

from hpcbus.producers.node import NodeCollector, NodeCollectorConfig
from hpcbus.producers.node.jobs import JobOptions
from hpcbus.producers.node.pipeline import AgentConfig, Pipeline

FIX = Path(__file__).parent / "fixtures" / "node"


def tree(tmp_path: Path, case: str = "hpc") -> Path:
    """A copy of fixture `case` under `tmp_path`, as the collector's root."""
    root = tmp_path / case
    shutil.copytree(FIX / case, root)
    return root


def agent_messages(tmp_path: Path, case: str) -> list[tuple[str, bytes]]:
    """(subject, payload) of all `produce node` publishes for fixture `case` but its Sonar JSON (two readings
    30 s apart: node, hwthread and device metrics, jobs and their processes, job events, its own telemetry):
    the line-protocol messages a `consume influx` worker gets from a node."""
    root = tmp_path / case
    shutil.copytree(FIX / case, root)
    collector = NodeCollector(
        NodeCollectorConfig(root=str(root), gpus=False, jobs=JobOptions(min_uid=0), job_events="all")
    )
    now = collector.collect().time
    pipeline = Pipeline("lab", "c1-10", AgentConfig(cc_job_events=True))
    out = []
    for t in (now + 30.0, now + 60.0):
        for m in pipeline.sample_messages(collector.collect(now=t), 1 << 20, queued=5, dropped=1):
            if ".sonar" not in m.subject:  # JSON, not for this sink
                out.append((m.subject, m.payload))
    return out


SLUID = "sEKNKTV3WPV500"
"""The SLUID of Slurm's own example (`doc/html/cgroup_v2.shtml`, `doc/man/man5/cgroup.conf.5`): the name of job
1392969's cgroup directory in `slurm_2605`."""
GONE_SLUID = "s0ABCDEFGH1234"
"""A SLUID-named job directory in `slurm_2605` whose stepds are gone: nothing on the node maps it."""


def add_process(
    root: Path,
    pid: int,
    ppid: int,
    comm: str,
    cgroup: str,
    cmdline: str,
    *,
    uids: tuple[int, int] | None = None,
) -> None:
    """A process in `root/proc` shaped like fixture `slurm-cgroup-v2`'s pid 2010 (its stat, statm and io, with
    this pid, parent, own process group, comm, cgroup and cmdline); `uids`: its real and effective uid in a
    `status` file (none without: the reader trusts no stepd whose owner it cannot read)."""
    template = FIX / "slurm-cgroup-v2" / "proc" / "2010"
    d = root / "proc" / str(pid)
    d.mkdir()
    rest = (template / "stat").read_text().split(") ", 1)[1].split()
    rest[1], rest[2] = str(ppid), str(pid)  # ppid, pgrp
    (d / "stat").write_text(f"{pid} ({comm}) {' '.join(rest)}\n")
    for name in ("statm", "io"):
        shutil.copy(template / name, d / name)
    (d / "cgroup").write_text(cgroup + "\n")
    # A stepd's title is one string (its argv rewritten, `setproctitle`); another command's words are its argv.
    argv = cmdline.encode() if comm == "slurmstepd" else cmdline.encode().replace(b" ", b"\0")
    (d / "cmdline").write_bytes(argv + b"\0")
    if uids is not None:
        real, effective = uids
        (d / "status").write_text(
            f"Name:\t{comm}\nState:\tS (sleeping)\nTgid:\t{pid}\nPid:\t{pid}\nPPid:\t{ppid}\n"
            f"Uid:\t{real}\t{effective}\t{effective}\t{effective}\nGid:\t{real}\t{real}\t{real}\t{real}\n"
        )


def slurm_2605(
    tmp_path: Path, *, job_id_paths: bool = False, stepd_uids: tuple[int, int] = (1000, 1000)
) -> Path:
    """Fixture `slurm-cgroup-v2` as Slurm 26.05's cgroup/v2 lays it out (SchedMD/slurm
    `src/plugins/cgroup/v2/cgroup_v2.c`, `cgroup_p_step_create`): job 1392969's directory named by its SLUID
    (`SLUID`), or `job_1392969` with `CgroupJobIdPaths=yes` (`job_id_paths`); each step's slurmstepd in the
    step's `slurm` leaf (pids 2001, 2021), its tasks in `user/task_<n>`. Added:

    - 2060 `dask-worker`, daemonized from step 0 (parent init, its own process group): only its cgroup says
      whose it is;
    - 2070 a user's process of step 0 named `slurmstepd` with the title `slurmstepd: [999.0]`, in a task's
      cgroup, not a `slurm` leaf: it must map nothing (`stepd_uids`: its real and effective uid, the user's);
    - 2080 `leftover` (parent init) in another SLUID's directory (`GONE_SLUID`) whose stepds are gone."""
    root = tree(tmp_path, "slurm-cgroup-v2")
    job = "job_1392969" if job_id_paths else SLUID
    scope = "0::/system.slice/slurmstepd.scope"
    for cgroup in (root / "proc").glob("*/cgroup"):
        cgroup.write_text(cgroup.read_text().replace("/job_1392969/", f"/{job}/"))
    add_process(root, 2060, 1, "dask-worker", f"{scope}/{job}/step_0/user/task_0", "dask-worker --nanny")
    fake = f"{scope}/{job}/step_0/user/task_1"
    add_process(root, 2070, 2010, "slurmstepd", fake, "slurmstepd: [999.0]", uids=stepd_uids)
    add_process(root, 2080, 1, "leftover", f"{scope}/{GONE_SLUID}/step_batch/user/task_0", "leftover")
    return root
