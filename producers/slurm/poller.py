"""Run `sacct`, `squeue --json` and `sinfo` once and hand back what they said, parsed.

Why it is built this way:

* **asyncio subprocesses with a timeout.** slurmdbd can hang for minutes (a database lock, a big purge);
  the service must keep its NATS connection and its SIGTERM handling alive meanwhile, and a command that
  overruns is killed rather than waited for.
* **A failing command is one log line, and the poll goes on with the others.** slurmdbd down makes sacct
  fail while squeue and sinfo (slurmctld) still answer, and the reverse happens too; whatever answered is
  published. The line names the command and stderr's first line, which is where Slurm puts the reason.
* **The environment is passed through** (`SLURM_CONF` picks the cluster; a site may rely on other
  `SLURM_*` variables), with only `TZ` replaced when `--tz` asks for a zone, so that sacct prints and reads
  times in the zone we parse them in (see `zone`).
* **The sacct window is explicit** (`-S start -E end` in local time): the caller remembers where the last
  successful window ended and starts the next one an overlap earlier, so slurmdbd's lag never loses a job
  and a poll that failed is simply covered by the next one.
* **squeue fills what sacct cannot show**: held jobs are never eligible, so no sacct window lists them, and
  while slurmdbd is down only slurmctld knows the queue. Its records are used only for jobs sacct did not
  list, so the two sources never alternate for one job (their renderings differ slightly).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, tzinfo

import msgspec

from hpcbus.producers.slurm.settings import SlurmSettings
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.slurm.sacct import SACCT_FIELDS, SacctRow, parse_sacct, sacct_argv
from hpcbus.schemas.slurm.sinfo import SINFO_NODES_ARGV, SINFO_PARTITIONS_ARGV, cluster_attributes
from hpcbus.schemas.slurm.squeue import SQUEUE_ARGV, parse_squeue_json
from hpcbus.schemas.sonar.types import ClusterAttributes, SlurmJob

__all__ = ["CommandResult", "Poll", "Poller", "read_sacct", "read_squeue", "run_command", "sacct_time"]

log = logging.getLogger("hpcbus.slurm")


class CommandResult(msgspec.Struct, kw_only=True):
    """What one command did; `failure` is the one-line reason when it did not succeed."""

    argv: list[str]
    stdout: bytes = b""
    returncode: int | None = None
    failure: str = ""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failure


def _first_line(data: bytes) -> str:
    for line in data.decode(errors="replace").splitlines():
        if line.strip():
            return line.strip()
    return ""


async def run_command(argv: Sequence[str], *, env: Mapping[str, str], timeout: float) -> CommandResult:
    """Run `argv` without a shell; never raises for the command's own failures (they are in `failure`)."""
    command = shlex.join(argv)
    started = time.monotonic()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
        )
    except OSError as exc:
        return CommandResult(argv=list(argv), failure=f"{command}: cannot run: {exc.strerror or exc}")
    try:
        stdout, stderr = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return CommandResult(
            argv=list(argv),
            failure=f"{command}: timed out after {timeout:g} s",
            seconds=time.monotonic() - started,
        )
    except asyncio.CancelledError:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        raise
    seconds = time.monotonic() - started
    if proc.returncode != 0:
        reason = _first_line(stderr) or "(nothing on stderr)"
        return CommandResult(
            argv=list(argv),
            stdout=stdout,
            returncode=proc.returncode,
            failure=f"{command}: exit {proc.returncode}: {reason}",
            seconds=seconds,
        )
    if stderr.strip():
        log.debug("%s: stderr: %s", argv[0], _first_line(stderr))
    return CommandResult(argv=list(argv), stdout=stdout, returncode=0, seconds=seconds)


def sacct_time(when: datetime, tz: tzinfo) -> str:
    """`YYYY-MM-DDTHH:MM:SS` in `tz`: how sacct reads `-S`/`-E` (local time, no offset)."""
    return when.astimezone(tz).strftime("%Y-%m-%dT%H:%M:%S")


def read_sacct(stdout: bytes, tz: tzinfo) -> tuple[list[SacctRow], list[Problem]]:
    """Rows of `sacct -aP --noheader -o SACCT_FIELDS` output; a bad line is a Problem placed at
    `sacct:<line>` and skipped, the lines around it are kept."""
    rows: list[SacctRow] = []
    problems: list[Problem] = []
    for item in parse_sacct(stdout.decode(errors="replace"), SACCT_FIELDS, tz, place="sacct"):
        if isinstance(item, Problem):
            problems.append(item)
        else:
            rows.append(item)
    return rows, problems


def read_squeue(stdout: bytes, tz: tzinfo, listed: set[int]) -> tuple[list[SlurmJob], list[Problem]]:
    """Pending/running jobs of `squeue --json` whose id is not in `listed` (the jobs sacct reported)."""
    jobs: list[SlurmJob] = []
    problems: list[Problem] = []
    for item in parse_squeue_json(stdout, tz, place="squeue"):
        if isinstance(item, Problem):
            problems.append(item)
        elif item.job_id not in listed:
            jobs.append(item)
    return jobs, problems


class Poll(msgspec.Struct, kw_only=True):
    """One round of commands: sacct rows, the squeue-only jobs, the cluster attributes, what went wrong."""

    time: datetime
    """When the poll started (aware, in the Slurm zone): the envelopes' time and the sacct window's end."""
    window: tuple[str, str] = ("", "")
    """The sacct `-S`/`-E` arguments used."""
    sacct_ok: bool = False
    """sacct answered: its window can be advanced."""
    rows: list[SacctRow] = []
    queued: list[SlurmJob] = []
    """squeue records of pending/running jobs that sacct did not list."""
    cluster: ClusterAttributes | None = None
    """None when either sinfo command failed."""
    problems: list[Problem] = []
    """Lines or records that could not be read (each with command and line number); the rest is kept."""
    failures: list[str] = []
    """One line per command that failed."""
    seconds: dict[str, float] = {}
    """Run time per command, for the poll's log line."""


class Poller:
    """Runs the commands for one cluster with one environment and zone."""

    def __init__(
        self,
        settings: SlurmSettings,
        cluster: str,
        tz: tzinfo,
        tz_env: str | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """`env` is the commands' environment (default: this process's); `tz_env` replaces its `TZ`."""
        self.settings = settings
        self.cluster = cluster
        self.tz = tz
        env = dict(os.environ if env is None else env)
        if tz_env is not None:
            env["TZ"] = tz_env
        self.env = env

    def sacct_argv(self, start: datetime, end: datetime) -> list[str]:
        return sacct_argv(
            sacct_time(start, self.tz),
            sacct_time(end, self.tz),
            fields=SACCT_FIELDS,
            states=self.settings.states,
        )

    async def _run(self, argv: Sequence[str]) -> CommandResult:
        return await run_command(argv, env=self.env, timeout=self.settings.timeout)

    async def poll(self, start: datetime, now: datetime) -> Poll:
        """Run every command (concurrently: they ask different daemons) for the window `start`..`now`."""
        now = now.astimezone(self.tz).replace(microsecond=0)
        sacct_cmd = self.sacct_argv(start, now)
        commands: dict[str, Sequence[str]] = {
            "sacct": sacct_cmd,
            "sinfo-partitions": SINFO_PARTITIONS_ARGV,
            "sinfo-nodes": SINFO_NODES_ARGV,
        }
        if self.settings.use_squeue:
            commands["squeue"] = SQUEUE_ARGV
        results = dict(
            zip(commands, await asyncio.gather(*(self._run(a) for a in commands.values())), strict=True)
        )
        poll = Poll(time=now, window=(sacct_cmd[-3], sacct_cmd[-1]))
        poll.seconds = {name: r.seconds for name, r in results.items()}
        for result in results.values():
            if not result.ok:
                poll.failures.append(result.failure)

        sacct = results["sacct"]
        if sacct.ok:
            poll.sacct_ok = True
            poll.rows, problems = read_sacct(sacct.stdout, self.tz)
            poll.problems.extend(problems)

        squeue = results.get("squeue")
        if squeue is not None and squeue.ok:
            poll.queued, problems = read_squeue(squeue.stdout, self.tz, {row.job_id for row in poll.rows})
            poll.problems.extend(problems)

        partitions, nodes = results["sinfo-partitions"], results["sinfo-nodes"]
        if partitions.ok and nodes.ok:
            attributes, problems = cluster_attributes(
                partitions.stdout.decode(errors="replace"),
                nodes.stdout.decode(errors="replace"),
                cluster=self.cluster,
                time=now,
                place="sinfo",
            )
            poll.cluster = attributes
            poll.problems.extend(problems)
        return poll
