"""What `hpcbus produce node` costs a compute node, against `ps` over the same process table in the same run.

Four figures, each with its target (issues 14 and 24):

- CPU time of one sample (read /proc and /sys, build the Sonar envelope, write its lines and the
  ClusterCockpit lines into NATS payloads: `Pipeline.sample_messages`, what the agent runs, checked equal
  to the `Line` path) with 1000 extra processes on the node, against
  `ps -eo pid,ppid,pgid,uid,rss,vsz,time,comm` reading the same table (what Sonar used to run every
  interval): ours / ps <= 1.0. Both are the best of 7 alternating runs of CPU time (user + system), ours
  in this process (`time.process_time`), ps from `RUSAGE_CHILDREN`.
- The same sample on the node as it is (no extra processes), as a share of one core at the default 30 s
  interval: < 0.02 %.
  The extra processes are first left to grow older than the cgroup settle time (steady state, see `run`).
- Peak RSS of the real `hpcbus produce node`, on the compiled path and on the pure one (`HPCBUS_PURE=1`:
  the compiled extensions must not make the agent grow, issue 24) (a subprocess publishing to a local nats-server at a 1 s
  interval for a few samples over the 1000-process table, then SIGTERM; its own `VmHWM`, see PeakRss):
  <= 50 MB.

Every process this benchmark starts is killed and reaped in `finally`, also on errors and Ctrl-C. Processes
of every user are included (min_uid 0), so the extra `sleep`s are part of a job as a user's MPI ranks would be.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from bench.timing import best_of
from bench.timing import verdict as _verdict
from hpcbus.producers.node.processes import ProcessReader
from hpcbus.schemas.native import PURE

if TYPE_CHECKING:
    from hpcbus.producers.node import NodeSample
    from hpcbus.schemas.message import Message

N_EXTRA = 1000
INTERVAL = 30.0
PS_ARGV = ["ps", "-eo", "pid,ppid,pgid,uid,rss,vsz,time,comm"]
BOOT = "import sys; from hpcbus import cli; sys.exit(cli.main())"
RSS_RUN_SECONDS = 6.0
RSS_SLACK = 0.03
"""Peak RSS varies a little from run to run (allocator, sample timing): the compiled path may be this much above."""


def _spawn(n: int) -> list[subprocess.Popen[bytes]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(n):
            procs.append(
                subprocess.Popen(
                    ["sleep", "3600"],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
    except BaseException:
        _reap(procs)
        raise
    return procs


def _reap(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            p.kill()
    for p in procs:
        with contextlib.suppress(Exception):
            p.wait(10)


class _Sampler:
    """One producer pipeline as the agent runs it, minus NATS."""

    def __init__(self) -> None:
        from hpcbus.producers.node import NodeCollector, NodeCollectorConfig
        from hpcbus.producers.node.jobs import JobOptions
        from hpcbus.producers.node.pipeline import AgentConfig, Pipeline

        self.collector = NodeCollector(NodeCollectorConfig(jobs=JobOptions(min_uid=0), gpus=False))
        self.pipeline = Pipeline("bench", self.collector.hostname, AgentConfig())
        self.collector.collect()  # priming reading, as the agent takes one
        self.processes = 0
        self.best_read = float("inf")
        """Best CPU time of the reading alone (the collector), seconds."""
        self.last: NodeSample | None = None
        self._messages: list[Message] = []
        """The last sample's messages: their lines are counted outside the timed `sample`."""

    def sample(self) -> None:
        start = time.process_time()
        s = self.collector.collect()
        self.best_read = min(self.best_read, time.process_time() - start)
        messages = self.pipeline.sample_messages(s, 1 << 20)  # what the agent publishes
        self._messages = messages
        self.processes = s.process_count
        self.last = s

    @property
    def lines(self) -> int:
        """Lines the last sample published."""
        return sum(m.payload.count(b"\n") for m in self._messages)

    def check(self) -> None:
        """The fast path's messages equal the `Line` path's on the last reading (a fresh pipeline pair, so
        neither has seen its job events)."""
        from hpcbus.producers.node.pipeline import AgentConfig, Pipeline

        fast = Pipeline("bench", self.collector.hostname, AgentConfig())
        reference = Pipeline("bench", self.collector.hostname, AgentConfig())
        assert self.last is not None, "check() before any sample()"
        lines, _ = reference.sample_lines(self.last)
        if fast.sample_messages(self.last, 1 << 20) != reference.messages(lines, 1 << 20):
            raise AssertionError("node sample: sample_messages differs from messages(sample_lines)")


def _ps_cpu() -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(PS_ARGV, stdout=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _interleaved(
    ours: Callable[[], object], baseline: Callable[[], float], repeats: int = 7
) -> tuple[float, float]:
    """Best CPU time of each, measured alternately so a noisy neighbour hits both alike (a shared 2-core
    VM showed 30% swings between back-to-back best-of-5 runs)."""
    best_ours = best_base = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        ours()
        best_ours = min(best_ours, time.process_time() - start)
        best_base = min(best_base, baseline())
    return best_ours, best_base


def _peak_rss_mb(pure: bool = False) -> tuple[float, int] | None:
    """Peak RSS (MB) and samples taken of the real command (`pure`: with `HPCBUS_PURE=1`, every compiled
    extension off); None when no nats-server can be started."""
    from tests.services import NatsServer, PeakRss, ServiceError

    tmp = Path(tempfile.mkdtemp(prefix="hpcbus-bench-node-"))
    config = tmp / "node.toml"
    config.write_text(
        "[node]\ngpus = false\n\n[node.jobs]\nmin_uid = 0\n\n[node_agent]\nstream_max_bytes = 268435456\n"
    )
    try:
        try:
            server = NatsServer(tmp / "nats").start()
        except ServiceError:
            return None
        try:
            argv = [sys.executable, "-c", BOOT, "produce", "node", "--nats", server.url, "--cluster", "bench"]
            argv += ["--interval", "1", "--config", str(config)]
            with open(tmp / "agent.log", "wb") as log:
                env = (
                    {**os.environ, PURE: "1"} if pure else {k: v for k, v in os.environ.items() if k != PURE}
                )
                proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=log, env=env)
            peak = PeakRss(proc.pid)
            try:
                time.sleep(RSS_RUN_SECONDS)
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
            text = (tmp / "agent.log").read_text(errors="replace")
            samples = 0
            for line in text.splitlines():
                if "stopped after" in line:
                    samples = int(line.split("stopped after", 1)[1].split()[0])
            return peak.wait() / 2**20, samples
        finally:
            server.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run() -> list[str]:
    out: list[str] = []
    idle = _Sampler()
    t_idle = best_of(idle.sample)
    share = t_idle / INTERVAL * 100
    out.append(
        f"{'node sample, node as is':<44} {t_idle * 1e3:8.1f} ms CPU/sample ({idle.processes} procs, "
        f"{idle.lines} lines)  at {INTERVAL:.0f} s: {share:.4f}% of a core  target < 0.02%: {_verdict(share < 0.02)}"
    )
    extra = _spawn(N_EXTRA)
    try:
        # Steady state: a job's processes live far longer than the reader's cgroup settle time, after which
        # each one's cgroup file is read once, not every sample (producers/node/processes.py). Measuring
        # processes younger than that would time a node whose every process started in the last 10 s.
        time.sleep(ProcessReader().cgroup_settle_s + 1)
        busy = _Sampler()
        t_ours, t_ps = _interleaved(busy.sample, _ps_cpu)
        busy.check()
        ratio = t_ours / t_ps if t_ps else float("inf")
        out.append(
            f"{f'node sample vs ps, +{N_EXTRA} procs':<44} {t_ours * 1e3:8.1f} ms CPU/sample ({busy.processes} "
            f"procs, {busy.lines} lines; reading /proc {busy.best_read * 1e3:.1f} ms)  ps {t_ps * 1e3:.1f} ms  "
            f"ratio {ratio:4.2f}x  "
            f"target <= 1.00x: {_verdict(ratio <= 1.0)}"
        )
        rss, pure = _peak_rss_mb(), _peak_rss_mb(pure=True)
        if rss is None or pure is None:
            out.append(f"{'node producer peak RSS':<44} skipped: no nats-server")
        else:
            (mb, samples), (pure_mb, _) = rss, pure
            out.append(
                f"{f'node producer peak RSS, +{N_EXTRA} procs':<44} {mb:8.1f} MB  ({samples} samples published)  "
                f"target <= 50 MB: {_verdict(mb <= 50)}"
            )
            # issue 24: the compiled extensions must not make the agent bigger (RSS_SLACK: run-to-run noise)
            grown = mb <= pure_mb * (1 + RSS_SLACK)
            out.append(
                f"{'node producer peak RSS, compiled vs pure path':<44} {mb:8.1f} MB vs {pure_mb:.1f} MB "
                f"(HPCBUS_PURE=1)  target: not grown (<= +{RSS_SLACK:.0%}): {_verdict(grown)}"
            )
    finally:
        _reap(extra)
    return out


if __name__ == "__main__":
    for line in run():
        print(line, flush=True)
