"""Which hwthreads a job may use on this node: cc-backend's `resources[].hwthreads`, as the node sees it.

Read once per job start (not per sample), for the `nodejob` event. Where it comes from, best first:

1. The job's cgroup cpuset, at the job's level (Slurm's task/cgroup confines the whole job there), the
   directory named `job_<id>` or, Slurm 26.05's cgroup/v2 default, the job's SLUID (`processes.job_component`):
   cgroup v2 `<mount><path up to job_N>/cpuset.cpus.effective`, v1 `<mount>/cpuset<path>/cpuset.cpus`.
2. Otherwise the CPU affinity (`Cpus_allowed_list` of /proc/<pid>/status) of the job's processes, joined:
   what `task/affinity` pinned them to, or every CPU when nothing did (which is then the truth too).

Nothing is guessed: when neither can be read the list is empty.
"""

from __future__ import annotations

from collections.abc import Iterable

from hpcbus.producers.node._io import join_root, read_text
from hpcbus.producers.node.processes import job_component

__all__ = ["job_cpus", "parse_cpu_list"]

_CGROUP = "/sys/fs/cgroup"


def parse_cpu_list(text: str) -> list[int]:
    """`0-3,8,10-11` -> [0, 1, 2, 3, 8, 10, 11]; [] for empty or malformed text."""
    out: set[int] = set()
    try:
        for part in text.replace("\n", ",").split(","):
            part = part.strip()
            if not part:
                continue
            lo, _, hi = part.partition("-")
            a, b = int(lo), int(hi or lo)
            if a < 0 or b < a or b - a > 65536:
                return []
            out.update(range(a, b + 1))
    except ValueError:
        return []
    return sorted(out)


def _job_path(path: str) -> str | None:
    """The cgroup path cut after its job's component (`job_<n>` or a SLUID), or None when there is none."""
    parts = path.split("/")
    for i, part in enumerate(parts):
        if job_component(part):
            return "/".join(parts[: i + 1])
    return None


def _cgroup_cpus(root: str, pid: int) -> list[int]:
    for line in read_text(join_root(root, f"/proc/{pid}/cgroup")).splitlines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        job = _job_path(path)
        if job is None:
            continue
        if hid == "0" and controllers == "":
            found = parse_cpu_list(read_text(join_root(root, f"{_CGROUP}{job}/cpuset.cpus.effective")))
        elif "cpuset" in controllers.split(","):
            found = parse_cpu_list(read_text(join_root(root, f"{_CGROUP}/cpuset{job}/cpuset.cpus")))
        else:
            continue
        if found:
            return found
    return []


def _affinity(root: str, pid: int) -> list[int]:
    for line in read_text(join_root(root, f"/proc/{pid}/status")).splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return parse_cpu_list(line.partition(":")[2])
    return []


def job_cpus(root: str, pids: Iterable[int]) -> list[int]:
    """The hwthreads of the job whose processes are `pids` (see the module docstring); [] when unknown."""
    pids = list(pids)
    for pid in pids:
        found = _cgroup_cpus(root, pid)
        if found:
            return found
    joined: set[int] = set()
    for pid in pids:
        joined.update(_affinity(root, pid))
    return sorted(joined)
