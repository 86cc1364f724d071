"""`hpcbus produce ocs` as a source of the producer runtime (`hpcbus.sources`).

The accounting file is the buffer: a poll reads the complete lines available (in chunks of at most
`max_chunk_bytes`, one jobs envelope each), and is not repeated while `max_inflight` polls wait for
JetStream's ack, so a long broker outage costs nothing but time. The offset in the state file moves past a
poll's lines only when JetStream has stored all of them (the poll's commit); before that, the chunk
boundaries are written ahead, so a restart cuts the same chunks again and re-sends them with the same
message ids, which the stream's duplicate window drops.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import time

import msgspec
from nats.aio.client import Client as NATS

from hpcbus.producers.ccbackend import CcBackendRelay
from hpcbus.producers.ocs.follow import Follower, FollowState, Position, load_state, save_state
from hpcbus.producers.ocs.pipeline import Batch, Pipeline
from hpcbus.producers.ocs.settings import OcsSettings
from hpcbus.schemas.lineprotocol import parse_payload
from hpcbus.schemas.message import Message
from hpcbus.schemas.ocs.updates import JobMerger
from hpcbus.settings import CcBackendSettings
from hpcbus.sources import Backlog, Poll

log = logging.getLogger("hpcbus.ocs")


class OcsSource:
    name = "ocs"

    def __init__(
        self,
        settings: OcsSettings,
        cluster: str,
        *,
        prefix: str = "",
        cc: CcBackendSettings | None = None,
        keep_state: bool = True,
    ) -> None:
        self.settings = settings
        self.keep_state = keep_state
        """False for `--once`: the state file is read (it starts where the service would) but never
        written."""
        self.cluster = cluster
        self.relay = CcBackendRelay(cc or CcBackendSettings(), node_states=False)
        """cc-backend's job-event subject (OCS has no node states)."""
        self.max_pending = settings.max_inflight
        self.wake = asyncio.Event()
        self.path = settings.state_file if settings.state == "file" else ""
        """The state file (`state = "file"`); "" with none, or with the state in JetStream (`entries`)."""
        state = load_state(self.path) if self.path else None
        if keep_state and settings.state == "file" and not self.path:
            log.warning("no --state-file: after a restart the whole accounting file is published again")
        self.follower = self._follower(state)
        self.committed: Position = self.follower.position  # the saved one, unless the file was replaced
        self.pipeline = Pipeline(
            cluster,
            hostname=socket.gethostname(),
            start_jobs=settings.start_jobs,
            merger=JobMerger(max_jobs=settings.max_jobs),
            prefix=prefix,
            hostname_form=settings.hostname_form,
            hostname_domain=settings.hostname_domain,
        )
        self._pending: collections.deque[list[Position]] = collections.deque()
        """Chunk ends of each poll not yet acknowledged, oldest first."""
        self._next = 0.0
        self.totals = collections.Counter[str]()
        self._last_stats = time.monotonic()

    def _follower(self, state: FollowState | None) -> Follower:
        s = self.settings
        return Follower(s.accounting, state, max_chunk_bytes=s.max_chunk_bytes, from_end=s.from_end)

    # --- as one side of an active/standby pair (`hpcbus.heldsources`) --------------------------------------

    def entries(self) -> dict[str, bytes]:
        """One entry, `follow`: where the next read starts. The pair's runtime writes it together with the
        messages of the lines before it (written ahead: no cuts to remember)."""
        state = FollowState(path=self.settings.accounting, position=self.follower.position)
        return {"follow": msgspec.json.encode(state)}

    def restore(self, found: dict[str, bytes]) -> None:
        """Follow the file from where the last holder's `follow` entry says (none: as a first start does)."""
        state = None
        if "follow" in found:
            try:
                state = msgspec.json.decode(found["follow"], type=FollowState)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("state entry follow unusable (%s); starting as without a state", exc)
        self.follower.close()
        self.follower = self._follower(state)
        self.committed = self.follower.position
        self._pending.clear()

    def due_in(self) -> float:
        return 0.0 if self.follower.behind else self._next - time.monotonic()

    def _read(self) -> list[Batch]:
        now = int(time.time())
        return [self.pipeline.process(chunk, now=now) for chunk in self.follower.read()]

    async def poll(self, backlog: Backlog) -> Poll:
        self._next = time.monotonic() + self.settings.interval
        batches = await asyncio.to_thread(self._read)
        messages = []
        for batch in batches:
            for problem in batch.problems:
                log.error("%s", problem)
            messages.extend(batch.messages)
            messages.extend(self.cc_messages(batch.messages))
            self.totals.update(
                records=batch.records, jobs=batch.jobs, events=batch.events, problems=len(batch.problems)
            )
        self._stats()
        if not batches:
            return Poll()
        self._pending.append([b.chunk.end for b in batches])
        self.save()  # write-ahead: the chunk boundaries, so a crash re-cuts the same chunks
        return Poll(messages, commit=self._commit)

    def cc_messages(self, messages: list[Message]) -> list[Message]:
        """The start_job/stop_job lines of a chunk's messages again, for cc-backend's own subject."""
        if not self.relay.job_subject:
            return []
        now = int(time.time())
        lines = [
            line
            for m in messages
            if m.subject == self.pipeline.subject_job
            for line in parse_payload(m.payload, now=now, place=m.subject).lines
        ]
        return self.relay.messages(self.relay.lines(lines))

    def _commit(self) -> None:
        self.committed = self._pending.popleft()[-1]
        self.save()

    def save(self) -> None:
        if self.path and self.keep_state:
            cuts = [(end.inode, end.offset) for ends in self._pending for end in ends]
            save_state(
                self.path,
                FollowState(path=self.settings.accounting, position=self.committed, cuts=cuts),
            )

    def _stats(self) -> None:
        if time.monotonic() - self._last_stats < self.settings.stats_seconds:
            return
        self._last_stats = time.monotonic()
        log.info(
            "%d records, %d job records, %d cc events, %d bad lines so far; acknowledged up to line %d",
            self.totals["records"],
            self.totals["jobs"],
            self.totals["events"],
            self.totals["problems"],
            self.committed.line,
        )

    async def attach(self, nc: NATS) -> None:
        log.info("following %s for cluster %s", self.settings.accounting, self.cluster)

    def close(self, unsent: int, kept: bool) -> None:
        self.save()
        self.follower.close()
        if unsent:
            log.warning(
                "stopped with %d messages unacknowledged; they are read again at the next start", unsent
            )
        else:
            log.info("stopped at line %d of %s", self.committed.line, self.settings.accounting)
