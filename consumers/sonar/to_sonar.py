"""Line protocol -> Sonar: lines on `<cluster>.metrics` and `<cluster>.events.>` are reassembled (`LpToSonar`)
into envelopes published on `<cluster>.sonar.<sample|sysinfo|job|cluster>`.

**When an input message is acknowledged.** A message is acknowledged only once every envelope its lines went
into has been published (and written to the directory tree, if any). The assembler publishes an envelope the
moment it is complete, and any group at the latest `grace` seconds after it opened (partial). So when a
message's lines were added at time `t`, every group they went into opened at or before `t`, and
`flush(now)` with `now >= t + grace` has emitted all of them. The sink therefore keeps each message's reply
subject with its `t` (not its payload: memory stays small), and after a flush at `now` whose envelopes are all
published it acknowledges every message with `t <= now - grace`. Messages whose lines were all skipped
(marked as translated, or all bad) are acknowledged in the same step, without waiting.

Why this and not "acknowledge once the lines are in the assembler": the assembler lives in memory; a crash
would lose every envelope still waiting, and nothing would bring its lines back. Held back this way, a
killed worker's waiting input is redelivered by JetStream and the next worker rebuilds the envelopes. Why
not track each message's own groups (which would acknowledge complete samples sooner): it needs the
assembler's internals and only shortens the wait, not the bound. The bound: unacknowledged messages =
message rate x (`grace` + about a second), never more, because every group is flushed within `grace`; the
command sets JetStream's `max_ack_pending` and `ack_wait` (> 2 x grace) for that, and the sink sends
"in progress" (`+WPI`) for any message that waits longer (publishing stalled).

Re-publishing is harmless: an envelope's `Nats-Msg-Id` is a hash of its subject and bytes, and translation
is deterministic, so JetStream drops the copy of a rebuilt complete envelope within its duplicate window,
and the directory tree is only written when JetStream had not seen the envelope. A jobs or cluster envelope
larger than the server's `max_payload` is published in parts (`envelope_messages`), each a valid envelope
with its own line in the tree; a sample too large for one message is dead-lettered, never cut.

On SIGTERM, what is ready is published and acknowledged; messages whose envelopes still wait are returned
(`-NAK`: redelivered at once, to another worker or the next start) unless `on_stop = "flush"`.

Several workers sharing one durable would split a sample's skeleton and its lines between them, and both
would publish partial envelopes: run one LP -> Sonar worker per cluster (the command's durable is per
direction, so the stateless Sonar -> LP side can still be scaled out).
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import NamedTuple

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from hpcbus.consumers.sonar.directory import FILE_TYPE, DirectoryWriter, relative_path
from hpcbus.consumers.sonar.settings import SonarSettings
from hpcbus.counters import Counters
from hpcbus.outlet import (
    ORIGIN_HEADER,
    TRANSLATED,
    Outlet,
    PublishFailed,
    log,
    own_output,
)
from hpcbus.permanent import Permanent, outcome
from hpcbus.retry import Stopping, describe
from hpcbus.runner import Reject, SinkBase, dead_letter
from hpcbus.schemas import subjects
from hpcbus.schemas.hostnames import rename_hosts
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.sonar import encode_envelope, validate_envelope
from hpcbus.schemas.translate import Assembled, LpToSonar, envelope_messages, msg_id
from hpcbus.schemas.translate.lp_read import read_payload


class ToSonarCounters(Counters):
    """The standard counters and the assembly's. This sink acknowledges its input itself, so it counts
    `delivered` itself (messages acknowledged once their envelopes were out, the runtime's meaning: not
    those with refused input, which are `deadlettered`) and `rejected` (lines); the runtime counts the
    rest (`received`, `retried` through `still_working`, `pending` with `holding`)."""

    received_lines: int = 0
    skipped_messages: int = 0
    """Messages a translator published (marked `Hpcbus-Origin`): not translated again."""
    envelopes: int = 0
    """Envelopes published (complete, partial and follow-up)."""
    partial_envelopes: int = 0
    followup_envelopes: int = 0
    duplicate_envelopes: int = 0
    """Publishes JetStream dropped as already stored (an envelope rebuilt after a redelivery)."""
    invalid_envelopes: int = 0
    """Assembled envelopes that failed Sonar validation: dead-lettered, not published."""
    envelope_parts: int = 0
    """Messages of envelopes larger than one message, published in parts (jobs, cluster)."""
    too_large_envelopes: int = 0
    """Envelopes with a sample or a record larger than one message: dead-lettered with the reason (the
    other records of a jobs or cluster envelope are published)."""
    undeliverable_envelopes: int = 0
    """Envelopes JetStream refuses for good (`hpcbus.permanent.outcome`: no stream for the subject, a
    permissions violation): dead-lettered with the reason."""
    unroutable_envelopes: int = 0
    """Errors-only envelopes of unknown kind: there is no `<cluster>.sonar.<kind>` for them."""
    files_written: int = 0
    open_samples: int = 0
    """Gauge: sample envelopes being assembled."""
    returned_messages: int = 0
    """Messages given back to JetStream (`-NAK`) at shutdown."""


class _Held(NamedTuple):
    t: float
    """When its lines went into the assembler (the sink's clock)."""
    reply: str
    """Its JetStream reply subject ("" in core mode)."""
    refused: bool = False
    """Some of its input was refused (dead-lettered): acknowledged, not counted `delivered`."""


class ToSonarSink(SinkBase):
    """The runner's sink for `<cluster>.metrics` and `<cluster>.events.>` (see the module docstring).

    It acknowledges messages itself, when their envelopes are out, so `deliver` always returns False (the
    runner must not acknowledge a batch whose envelopes may still be waiting), and it dead-letters its bad
    input itself (`hpcbus.runner.dead_letter`, in `step`: before the message is acknowledged). `tick`
    flushes the grace window while no messages arrive; `close` does the shutdown described above.
    """

    holds_input = True
    """It acknowledges its input itself (see the class docstring)."""

    def __init__(
        self,
        nc: NATS,
        outlet: Outlet,
        name: str,
        settings: SonarSettings,
        directory: DirectoryWriter | None,
        *,
        acks: bool,
        ack_wait: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.nc = nc
        self.outlet = outlet
        self.cluster = outlet.cluster
        self.name = name
        self.settings = settings
        self.directory = directory
        self.acks = acks
        self.ack_wait = ack_wait
        self.clock = clock
        self.translator = LpToSonar(
            grace=settings.grace, max_groups=settings.max_groups, max_lines=settings.max_lines
        )
        self.counters = ToSonarCounters()
        self.tick_seconds = min(1.0, max(0.05, settings.grace / 4))
        self._held: collections.deque[_Held] = collections.deque()
        self._free: list[_Held] = []
        """Messages that put nothing into the assembler: acknowledged at the next step."""
        self._ready: collections.deque[Assembled] = collections.deque()
        self._files: list[tuple[str, bytes]] = []
        self._bad: list[Reject] = []
        self._lock = asyncio.Lock()
        self._last_wpi = clock()
        self._refused_files = 0
        """Envelopes whose file could never be written, in this episode (one WARNING per episode)."""

    # -- runner interface -------------------------------------------------------------------------------
    def take(self, msg: Msg) -> int:
        c = self.counters
        if own_output(msg):
            c.skipped_messages += 1
            self._free.append(_Held(0.0, msg.reply))
            return 0
        # `parse_payload`'s lines and problems; the compiled reading where it is built (`lp_read`)
        parsed = read_payload(
            msg.data, now=int(time.time()), place=msg.subject, max_future=self.settings.max_future
        )
        errors = parsed.errors
        refused = bool(errors)
        if errors:
            self._bad.append(Reject(msg, errors))
            c.rejected += len(errors)
        lines = parsed.lines
        c.received_lines += len(lines)
        if not lines:
            self._free.append(_Held(0.0, msg.reply, refused))
            return 0
        now = self.clock()
        try:
            self._ready.extend(self.translator.add_lines(lines, cluster=self.cluster, now=now))
        except Exception as exc:  # an assembler bug must cost one message, never the worker
            log.exception("could not assemble the lines of a message from %s", msg.subject)
            self._bad.append(Reject(msg, [Problem(f"not assemblable: {exc}", msg.subject, kind="lp")]))
            refused = True
        self._held.append(_Held(now, msg.reply, refused))
        return len(lines)

    def cut(self) -> None:
        """Nothing to seal: the assembler's groups outlive any batch."""

    async def deliver(self, batch: object, stopping: Stopping) -> None:
        """Publish what is ready and acknowledge what is safe (see the class docstring); a failure raises
        and the runtime calls it again (what was published left `_ready`)."""
        await self.step(stopping)

    def holding(self) -> int:
        """Input messages not yet acknowledged because their envelopes may still be waiting."""
        return len(self._held) + len(self._free)

    def gauges(self) -> None:
        self.counters.open_samples = self.translator.samples.open_groups

    # -- the grace window ---------------------------------------------------------------------------------
    async def tick(self, stopping: Stopping) -> None:
        """Flush expired groups and acknowledge while no message arrives (the runner only calls `deliver`
        when it has messages in hand)."""
        await self.step(stopping)

    async def step(self, stopping: Stopping, *, everything: bool = False) -> bool:
        """Flush (`everything`: all groups, else the expired ones), publish, write files, report bad input,
        then acknowledge every message whose envelopes are out. False when stopping came before the bad
        input was dead-lettered; a failure to publish or write raises (the runtime retries)."""
        async with self._lock:
            now = self.clock()
            self._ready.extend(self.translator.flush_all() if everything else self.translator.flush(now))
            while self._ready:
                await self._publish(self._ready[0], stopping)
                self._ready.popleft()
            if not await self._write_files(stopping):
                return False
            # Everything emitted up to flush(now) is out: each group that held lines added by `now - grace`.
            safe = float("inf") if everything else now - self.settings.grace
            if not await dead_letter(self.outlet, self._bad, self.counters, stopping):
                return False
            for free in self._free:
                await self._acknowledge(free)
            self._free.clear()
            held = self._held
            while held and held[0].t <= safe:
                await self._acknowledge(held.popleft())
            await self._keep_alive()
            return True

    async def _acknowledge(self, held: _Held) -> None:
        """`+ACK`, counted `delivered` unless its input was refused (then it is counted `deadlettered`)."""
        await self._reply(held.reply, b"+ACK")
        self.counters.delivered += not held.refused

    async def close(self, stopping: Stopping) -> None:
        """Shutdown: publish and acknowledge what is ready; return (or, `on_stop = "flush"`, publish partial)
        what still waits: also when publishing fails now (said, not retried: the next worker rebuilds it)."""
        flush = self.settings.on_stop == "flush" or not self.acks
        try:
            ok = await self.step(stopping, everything=flush)
        except Exception as exc:
            log.warning("%s: stopping while publishing fails (%s)", self.name, describe(exc))
            ok = False
        await self._return_all(ok)

    async def _return_all(self, ok: bool) -> None:
        """`close`'s end: acknowledge what no open group needs (when `ok`), return the rest (`-NAK`)."""
        async with self._lock:
            waiting = list(self._held)
            if ok and not self.translator.waiting:
                # No group is open: every held message's lines are in envelopes already published (and
                # written). Returning them would rebuild those envelopes after a restart, and once the
                # stream's duplicate window has passed they would be published and written a second time.
                for held in waiting:
                    await self._acknowledge(held)
                waiting = []
            if not ok:
                waiting += self._free
                self._free.clear()
            self._held.clear()
            returned = 0
            for held in waiting:
                if held.reply:
                    await self._reply(held.reply, b"-NAK")
                    returned += 1
            self.counters.returned_messages += returned
            if returned:
                log.info(
                    "%s: returned %d messages whose envelopes were still waiting; the next worker rebuilds them",
                    self.name,
                    returned,
                )

    # -- internals ----------------------------------------------------------------------------------------
    async def _publish(self, result: Assembled, stopping: Stopping) -> None:
        c = self.counters
        h = self.settings
        env = rename_hosts(result.envelope, h.hostname_form, h.hostname_domain)  # the node's name, one form
        kind = result.kind
        if kind not in subjects.SONAR_KINDS:
            c.unroutable_envelopes += 1
            problem = Problem(
                "an errors-only envelope of unknown kind has no <cluster>.sonar.<kind> subject; not published",
                kind="sonar envelope",
                severity="warning",
            )
            await self.outlet.report_problems([problem], "warning")
            return
        subject = subjects.sonar(self.cluster, kind, prefix=self.outlet.prefix)
        try:
            payload = encode_envelope(env)
            problems = [p.located(subject) for p in validate_envelope(env)]
        except Exception as exc:  # never let one envelope block everything behind it
            log.exception("%s: cannot encode a %s envelope", self.name, kind)
            c.invalid_envelopes += 1
            await self.outlet.report_problems(
                [Problem(f"not encodable: {exc}", subject, kind=f"sonar {kind}")]
            )
            return
        if problems:
            c.invalid_envelopes += 1
            problems += result.problems
            await self.outlet.report_problems(problems)
            await self._deadletter(subject, payload, problems, stopping)
            return
        if result.problems:
            errors = [p for p in result.problems if p.severity == "error"]
            warnings = [p for p in result.problems if p.severity != "error"]
            if errors:
                await self.outlet.report_problems([p.located(subject) for p in errors])
            if warnings:
                await self.outlet.report_problems([p.located(subject) for p in warnings], "warning")
        # A jobs or cluster envelope larger than a message goes in parts (same meta and attributes, records
        # cut); a sample or a single record too large for one is dead-lettered with the reason, never cut.
        messages, too_large = envelope_messages(subject, payload, self.outlet.message_limit(), env=env)
        if too_large:
            c.too_large_envelopes += 1
            await self.outlet.report_problems(too_large)
            await self._deadletter(subject, payload, too_large, stopping)
        for message in messages:
            headers = {"Nats-Msg-Id": message.msg_id, ORIGIN_HEADER: TRANSLATED}
            try:
                duplicate = await self.outlet.publish(subject, message.payload, headers)
            except Exception as exc:  # the runtime's table decides: retried, or never publishable
                found = outcome(exc)
                if not isinstance(found, Permanent):
                    raise
                c.undeliverable_envelopes += 1
                problem = Problem(f"can never be published: {found.reason}", subject, kind="undeliverable")
                await self.outlet.report_problems([problem])
                await self._deadletter(subject, payload, [problem], stopping)
                return
            c.duplicate_envelopes += duplicate
            if self.directory is not None and not duplicate:
                self._files.append((relative_path(env, kind), message.payload))
        if not messages:
            return
        c.envelopes += 1
        c.envelope_parts += len(messages) if len(messages) > 1 else 0
        c.partial_envelopes += not result.complete
        c.followup_envelopes += result.followup

    async def _write_files(self, stopping: Stopping) -> bool:
        """Append the published envelopes to the tree. An envelope whose file no retry can write (see
        `hpcbus.permanent.permanent`) is dead-lettered with the reason (its input cannot be: the envelope
        gathers several messages, all acknowledged for the envelope on the bus), so the files behind it
        are written."""
        if self.directory is None or not self._files:
            return True
        before = self.directory.written
        refused: list[tuple[tuple[str, bytes], str]] = []
        try:
            await asyncio.to_thread(self.directory.append, self._files, refused)
        finally:
            self.counters.files_written += self.directory.written - before
        for i, ((rel, payload), reason) in enumerate(refused):
            kind = next((k for k, word in FILE_TYPE.items() if f"/0+{word}-" in f"/{rel}"), "sample")
            subject = subjects.sonar(self.cluster, kind, prefix=self.outlet.prefix)
            problem = Problem(f"file can never be written: {reason}", subject, kind=f"sonar {kind}")
            if not self._refused_files:
                log.warning("%s: %s; dead-lettered, and so is every such envelope", self.name, problem)
            try:
                await self._deadletter(subject, payload, [problem], stopping)
            except PublishFailed:  # stopping first: the files wait for the next step, the inputs unacked
                self._files[:0] = [item for item, _ in refused[i:]]
                return False
            self._refused_files += 1
        if not refused and self._refused_files:
            log.info(
                "%s: writing files again; %d envelopes dead-lettered meanwhile",
                self.name,
                self._refused_files,
            )
            self._refused_files = 0
        return True

    async def _deadletter(
        self, subject: str, payload: bytes, problems: list[Problem], stopping: Stopping
    ) -> None:
        """Dead-letter an envelope; `PublishFailed` when the stop deadline came first: its inputs then stay
        unacknowledged (the envelope is neither published, written nor dead-lettered, so acking them would
        lose it)."""
        outcome = await self.outlet.deadletter_outcome(
            subject, payload, problems, "dlq:" + msg_id(subject, payload), stopping
        )
        if outcome == "stopping":
            raise PublishFailed(f"dead-lettering a {subject} envelope: stopping first")
        self.counters.deadlettered += outcome == "stored"

    async def _keep_alive(self) -> None:
        """`+WPI` for messages held longer than a third of `ack_wait` (only when publishing stalls: normally
        every message is acknowledged within `grace` + a second, well inside `ack_wait`)."""
        if not self.acks:
            return
        now = self.clock()
        third = self.ack_wait / 3
        if now - self._last_wpi < third:
            return
        self._last_wpi = now
        for held in self._held:
            if now - held.t < third:
                break
            await self._reply(held.reply, b"+WPI")

    async def _reply(self, reply: str, what: bytes) -> None:
        """The JetStream acknowledgement protocol by hand: the sink keeps only reply subjects, not messages."""
        if not reply or not self.acks:
            return
        try:
            await self.nc.publish(reply, what)
        except Exception as exc:  # connection down: JetStream redelivers, the ids drop the copies
            log.debug("%s to %s failed: %s", what.decode(), reply, exc)
