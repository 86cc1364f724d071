"""`hpcbus produce slurm` as a source of the producer runtime (`hpcbus.sources`): one poll of sacct, squeue
and sinfo every `interval` seconds, its messages through the runtime's outbox, and the state file saved only
once JetStream has acknowledged everything of that poll and the polls before it (a commit), so the file
never claims that something was sent which a crash could still lose; the worst a crash costs is records
sent twice (with the same `Nats-Msg-Id`, which the stream drops within its duplicate window).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from datetime import datetime, tzinfo

from nats.aio.client import Client as NATS

from hpcbus.producers.ccbackend import CcBackendRelay
from hpcbus.producers.slurm.poller import Poller
from hpcbus.producers.slurm.producer import Outgoing, SlurmProducer
from hpcbus.producers.slurm.settings import SlurmSettings
from hpcbus.producers.slurm.state import SlurmState
from hpcbus.schemas.message import Message
from hpcbus.settings import CcBackendSettings
from hpcbus.sources import Backlog, Poll

log = logging.getLogger("hpcbus.slurm")

MAX_PROBLEMS_LOGGED = 20
"""Problems logged one by one per poll; the rest are counted (a broken sacct must not flood the journal)."""


def report(poll_failures: list[str], out: Outgoing, elapsed: float) -> None:
    for failure in poll_failures:
        log.error("%s", failure)
    for problem in out.problems[:MAX_PROBLEMS_LOGGED]:
        log.warning("%s", problem)
    if len(out.problems) > MAX_PROBLEMS_LOGGED:
        log.warning("... and %d more problems", len(out.problems) - MAX_PROBLEMS_LOGGED)
    log.info("poll: %s (%.2f s)", out.summary(), elapsed)


class SlurmSource:
    """The pieces one poll needs, built once per process."""

    name = "slurm"
    max_pending = 0

    def __init__(
        self,
        settings: SlurmSettings,
        cluster: str,
        tz: tzinfo,
        tz_env: str | None,
        *,
        prefix: str = "",
        cc: CcBackendSettings | None = None,
    ) -> None:
        self.settings = settings
        self.relay = CcBackendRelay(cc or CcBackendSettings())
        self.tz = tz
        self.path = settings.state_file if settings.state == "file" else ""
        """The state file (`state = "file"`); "" with none, or with the state in JetStream (`entries`)."""
        self.state: SlurmState = SlurmState.load(self.path, cluster) if self.path else SlurmState(cluster)
        self.producer = SlurmProducer(settings, cluster, self.state, prefix=prefix, relay=self.relay)
        self.poller = Poller(settings, cluster, tz, tz_env)
        self.wake = asyncio.Event()
        self.failures: list[str] = []
        """The Slurm commands that failed in the last poll (`--once` exits 1 on any)."""
        self.sent = 0
        self._next = 0.0
        self._polls = 0

    def due_in(self) -> float:
        return self._next - time.monotonic()

    async def poll(self, backlog: Backlog) -> Poll:
        """Ask Slurm once; what to publish, and the state to save once it is acknowledged."""
        self._next = time.monotonic() + self.settings.interval
        started = time.monotonic()
        now = datetime.now(self.tz)
        asked = await self.poller.poll(self.producer.window_start(now), now)
        out = self.producer.build(asked)
        report(asked.failures, out, time.monotonic() - started)
        self.failures = asked.failures
        messages = [Message(s, p, i) for s, p, i in out.messages()]
        self.sent += len(messages)
        self._polls += 1
        return Poll(messages, commit=functools.partial(self._commit, self._polls))

    def _commit(self, poll: int) -> None:
        """The state in memory already holds every later poll: save it only when the latest is acked."""
        if poll == self._polls:
            self.save()

    async def attach(self, nc: NATS) -> None:
        log.info(
            "polling Slurm every %g s for cluster %s (state %s)",
            self.settings.interval,
            self.state.cluster,
            self.path or ("jetstream" if self.settings.state == "jetstream" else "-"),
        )

    def save(self) -> None:
        if not self.path:
            return
        try:
            self.state.save(self.path)
        except OSError as exc:
            log.error("cannot write state %s: %s", self.path, exc)

    def entries(self) -> dict[str, bytes]:
        """The state as entries of an active/standby pair (`hpcbus.heldsources`): `SlurmState.entries`."""
        return self.state.entries()

    def restore(self, found: dict[str, bytes]) -> None:
        self.state.restore(found)

    def close(self, unsent: int, kept: bool) -> None:
        if unsent and kept:
            self.save()  # the spill directory holds the rest: the state may say it was sent
        if unsent and not kept:
            log.warning(
                "%d messages not acknowledged by JetStream; state not saved past them, so they are sent "
                "again after a restart",
                unsent,
            )
        log.info("%d messages queued in all, %d unacknowledged", self.sent, unsent)
