"""Line protocol -> Sonar: lines on `<cluster>.metrics` and `<cluster>.events.>` are reassembled (`LpToSonar`)
into envelopes published on `<cluster>.sonar.<sample|sysinfo|job|cluster>`.

**When an input message is acknowledged.** A message is acknowledged only once every envelope its lines went
into has been published (and written to the directory tree, if any). The assembler publishes an envelope the
moment it is complete, and any group at the latest `grace` seconds after it opened (partial). So when a
message's lines were added at time `t`, every group they went into opened at or before `t`, and
`flush(now)` with `now >= t + grace` has emitted all of them. The sink therefore keeps each message's key
(`hpcbus.runner.held_key`) with its `t`, and after a flush at `now` whose envelopes are all published it
settles every message with `t <= now - grace` as delivered (`settle`); messages whose lines were all skipped
(marked as translated, or all bad) are settled in the same step, without waiting. The sink never
acknowledges: the runner holds each delivered batch's messages (without their payloads: memory stays small)
until they are settled, then acknowledges them, keeps them alive (`+WPI`) while publishing stalls, and stores
first the envelopes the sink rejected (`hpcbus.runner.Settled.dead`: invalid, too large, never publishable,
never writable), so a message is acknowledged only after every dead letter settled with it is stored. Bad
input lines are refused in `take` (`BadInput`), like every sink's: the runner dead-letters the message.

Why this and not "acknowledge once the lines are in the assembler": the assembler lives in memory; a crash
would lose every envelope still waiting, and nothing would bring its lines back. Held back this way, a
killed worker's waiting input is redelivered by JetStream and the next worker rebuilds the envelopes. Why
not track each message's own groups (which would acknowledge complete samples sooner): it needs the
assembler's internals and only shortens the wait, not the bound. The bound: unacknowledged messages =
message rate x (`grace` + about a second), never more, because every group is flushed within `grace`; the
command sets JetStream's `max_ack_pending` and `ack_wait` (> 2 x grace) for that.

Re-publishing is harmless: an envelope's `Nats-Msg-Id` is a hash of its subject and bytes, and translation
is deterministic, so JetStream drops the copy of a rebuilt complete envelope within its duplicate window,
and the directory tree is only written when JetStream had not seen the envelope. A jobs or cluster envelope
larger than the server's `max_payload` is published in parts (`envelope_messages`), each a valid envelope
with its own line in the tree; a sample too large for one message is dead-lettered, never cut.

**Host names Sonar refuses.** Line protocol carries host names Sonar's `Hostname` does not allow (`c1_5`, a
single label of 253 characters: `hpcbus.schemas.names.sonar_host_problem`, applied to the name in the
configured `hostname_form`). Their lines are refused in `take`, before the assembler: an envelope naming such
a host could only be refused by the validator, interval after interval. A host name is configuration, not a
passing fault, so it is said once per host and episode: the first message of an episode is dead-lettered
with the reason (one WARNING, from the runner's report of it), the lines of every later one are counted
(`refused_host_lines`, and in `rejected`) and the message acknowledged; the episode ends once the host has
sent nothing for `HOST_EPISODE_END` seconds (said at INFO), or when the worker restarts. The dead-letter
stream thus holds one message per bad host and episode, the evidence of what it sent, not one a sample.

On SIGTERM, what is ready is published and settled; messages whose envelopes still wait are handed back
(`Settled.returned`: the runner sends `-NAK`, redelivered at once to another worker or the next start)
unless `on_stop = "flush"`.

Several workers sharing one durable would split a sample's skeleton and its lines between them, and both
would publish partial envelopes: run one LP -> Sonar worker per cluster (the command's durable is per
direction, so the stateless Sonar -> LP side can still be scaled out).
"""

from __future__ import annotations

import asyncio
import collections
import time
import weakref
from collections.abc import Callable
from typing import ClassVar, NamedTuple

from nats.aio.msg import Msg
from nats.errors import NotJSMessageError

from hpcbus.consumers.sonar.directory import FILE_TYPE, DirectoryWriter, relative_path
from hpcbus.consumers.sonar.settings import SonarSettings
from hpcbus.contract import BadInput, DeadLetter, Settled, SinkBase, held_key
from hpcbus.counters import Counters
from hpcbus.outlet import ORIGIN_HEADER, TRANSLATED, Outlet, log, own_output
from hpcbus.permanent import Permanent, outcome
from hpcbus.retry import Stopping, describe
from hpcbus.schemas import subjects
from hpcbus.schemas.hostnames import host_name, rename_hosts
from hpcbus.schemas.lineprotocol import Line
from hpcbus.schemas.names import shown, sonar_host_problem
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.sonar import encode_envelope, validate_envelope
from hpcbus.schemas.translate import Assembled, LpToSonar, envelope_messages, msg_id
from hpcbus.schemas.translate.lp_read import read_payload


class ToSonarCounters(Counters):
    """The standard counters (counted by the runtime, as every sink's; `rejected`: lines) and the
    assembly's."""

    GAUGES: ClassVar[frozenset[str]] = Counters.GAUGES | {"open_samples"}

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
    refused_hosts: int = 0
    """Episodes of a host whose name Sonar's `Hostname` refuses (`sonar_host_problem`): each said once
    and dead-lettered once (its first message), see the module docstring."""
    refused_host_lines: int = 0
    """Lines of such hosts, not translated (also in `rejected`)."""
    files_written: int = 0
    open_samples: int = 0
    """Gauge: sample envelopes being assembled."""


HOST_EPISODE_END = 3600.0
"""Seconds without a line from a refused host that end its episode: a node sends every few seconds to
minutes, so an hour's silence means it stopped or was renamed; should it come back, it is said again."""
MAX_REFUSED_HOSTS = 4096
"""Refused hosts remembered at most (the longest silent is forgotten first, its episode ended): bounded
memory however many bad names arrive."""
_VERDICTS_MAX = 65_536
"""Host names whose verdict is cached (cleared when full)."""


class _Refused:
    """One refused host's episode."""

    __slots__ = ("first", "last", "lines", "reason", "since")

    def __init__(self, reason: str, now: float, first: int | weakref.ref[Msg]) -> None:
        self.reason = reason
        self.since = now
        self.last = now
        self.lines = 0
        self.first = first
        """The message that began the episode, the one dead-lettered: its stream sequence (JetStream), else
        the message itself, weakly (core NATS: the runner hands the same object again)."""

    def began_with(self, msg: Msg) -> bool:
        """Whether `msg` is the episode's first message, taken again: the runner takes each message of a batch
        that failed as a whole (too large, permanent) once more, after discarding the batch's dead letters,
        so the first message must be refused again or it would be acknowledged with no dead letter."""
        first = self.first
        return first == _stream_sequence(msg) if isinstance(first, int) else first() is msg


def _first_key(msg: Msg) -> int | weakref.ref[Msg]:
    """How an episode knows its first message again (`_Refused.first`)."""
    seq = _stream_sequence(msg)
    return weakref.ref(msg) if seq is None else seq


def _stream_sequence(msg: Msg) -> int | None:
    """The message's stream sequence, the same in every delivery of it; None outside JetStream."""
    if not msg.reply:
        return None
    try:
        return msg.metadata.sequence.stream
    except (NotJSMessageError, ValueError, IndexError):
        return None


class _Held(NamedTuple):
    t: float
    """When its lines went into the assembler (the sink's clock)."""
    key: str
    """`hpcbus.runner.held_key`: how the runner knows the message."""


class ToSonarSink(SinkBase):
    """The runner's sink for `<cluster>.metrics` and `<cluster>.events.>` (see the module docstring).

    It holds its input (`holds_input`): the runner keeps each delivered batch's messages until `settle`
    hands them back, delivered once their envelopes are out, or returned at the stop. `tick` flushes the
    grace window while no messages arrive; `close` does the shutdown described above.
    """

    holds_input = True
    what = "publish"

    def __init__(
        self,
        outlet: Outlet,
        name: str,
        settings: SonarSettings,
        directory: DirectoryWriter | None,
        *,
        acks: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`acks`: JetStream input, which can be handed back at the stop (False: core NATS, where the stop
        publishes every group partial instead)."""
        self.outlet = outlet
        self.cluster = outlet.cluster
        self.name = name
        self.settings = settings
        self.directory = directory
        self.acks = acks
        self.clock = clock
        self.translator = LpToSonar(
            grace=settings.grace, max_groups=settings.max_groups, max_lines=settings.max_lines
        )
        self.counters = ToSonarCounters()
        self.tick_seconds = min(1.0, max(0.05, settings.grace / 4))
        self._held: collections.deque[_Held] = collections.deque()
        self._free: list[str] = []
        """Messages that put nothing into the assembler: settled at the next step."""
        self._ready: collections.deque[Assembled] = collections.deque()
        self._files: list[tuple[str, bytes]] = []
        self._settled = Settled()
        """What the next `settle` hands the runner."""
        self._lock = asyncio.Lock()
        self._refused_files = 0
        """Envelopes whose file could never be written, in this episode (one WARNING per episode)."""
        self._sent = 0
        """Messages of the envelope at the head of `_ready` published so far (a retried step goes on)."""
        self._verdicts: dict[str, str | None] = {}
        """Host tag -> why Sonar refuses it in the configured form (None: it does not)."""
        self._refused: dict[str, _Refused] = {}
        """Refused hosts in their episode, the longest silent first (see the module docstring)."""

    # -- runner interface -------------------------------------------------------------------------------
    def take(self, msg: Msg) -> int:
        """Add the message's lines to the assembler; `BadInput` names its bad lines (the runner dead-letters
        the message; it is acknowledged when its envelopes are out, like the others)."""
        c = self.counters
        key = held_key(msg)
        if own_output(msg):
            c.skipped_messages += 1
            self._free.append(key)
            return 0
        # `parse_payload`'s lines and problems; the compiled reading where it is built (`lp_read`)
        parsed = read_payload(
            msg.data, now=int(time.time()), place=msg.subject, max_future=self.settings.max_future
        )
        problems = list(parsed.errors)
        count = len(problems)
        lines = parsed.lines
        c.received_lines += len(lines)
        now = self.clock()
        if lines:
            lines, refused = self._sonar_hosts(lines, msg, now, problems)
            count += refused
        if not lines:
            self._free.append(key)
        else:
            assembled = len(problems)
            try:
                self._ready.extend(
                    self.translator.add_lines(lines, cluster=self.cluster, now=now, problems=problems)
                )
            except Exception as exc:  # an assembler bug must cost one message, never the worker
                log.exception("could not assemble the lines of a message from %s", msg.subject)
                problems.append(Problem(f"not assemblable: {exc}", msg.subject, kind="lp"))
            # lines that made no envelope (an undecodable sysinfo): refused with the message
            problems[assembled:] = [p.located(msg.subject) for p in problems[assembled:]]
            count += len(problems) - assembled
            self._held.append(_Held(now, key))
        if problems:
            raise BadInput(problems, len(lines), count)
        return len(lines)

    def _sonar_hosts(
        self, lines: list[Line], msg: Msg, now: float, problems: list[Problem]
    ) -> tuple[list[Line], int]:
        """`lines` without those of hosts Sonar's `Hostname` refuses (see the module docstring), and how many
        of the refused ones the runner is to count: those of a host whose episode this message begins (a
        Problem in `problems` says why, so the runner warns once and dead-letters this message); the lines
        of a host already in its episode are counted here (`rejected`, `refused_host_lines`), unsaid.

        One pass over the hosts of the message (a node's message names one), and one over its lines only
        when some host is refused."""
        verdicts = self._verdicts
        refusing: dict[str, str] = {}
        for host in {line.tags.get("hostname") for line in lines}:
            if host is None:
                continue
            reason = verdicts.get(host, "")
            if reason == "":  # not seen yet ("" is never a reason)
                if len(verdicts) >= _VERDICTS_MAX:
                    verdicts.clear()
                h = self.settings
                reason = verdicts[host] = sonar_host_problem(
                    host_name(host, h.hostname_form, h.hostname_domain)
                )
            if reason is not None:
                refusing[host] = reason
        if not refusing:
            return lines, 0
        kept: list[Line] = []
        dropped: dict[str, int] = dict.fromkeys(refusing, 0)
        for line in lines:
            host = line.tags.get("hostname")
            if host in dropped:
                dropped[host] += 1
            else:
                kept.append(line)
        c = self.counters
        told = 0
        for host, n in dropped.items():
            c.refused_host_lines += n
            episode = self._refused.pop(host, None)
            again = episode is not None and episode.began_with(msg)
            if episode is None or again:
                if episode is None:
                    episode = _Refused(refusing[host], now, _first_key(msg))
                    c.refused_hosts += 1
                told += n
                problems.append(
                    Problem(
                        f"{refusing[host]}: its lines are not translated to Sonar envelopes ({n} in this "
                        "message); said and dead-lettered once while the host keeps sending, its later lines "
                        "counted in refused_host_lines (rename the node, or set hostname_form)",
                        msg.subject,
                        kind="sonar host",
                        path="tag hostname",
                    )
                )
            else:
                c.rejected += n
            episode.last = now
            episode.lines += 0 if again else n
            self._refused[host] = episode  # moved to the end: the longest silent stay first
        self._end_episodes(now)
        return kept, told

    def _end_episodes(self, now: float) -> None:
        """End the episodes of refused hosts silent for `HOST_EPISODE_END` seconds (and the longest silent
        beyond `MAX_REFUSED_HOSTS`), each said at INFO with what it cost."""
        refused = self._refused
        while refused:
            host, episode = next(iter(refused.items()))
            if now - episode.last < HOST_EPISODE_END and len(refused) <= MAX_REFUSED_HOSTS:
                break
            del refused[host]
            log.info(
                "%s: host %s sent nothing for %.0f s; its refusal ends after %d lines in %.0f s (%s)",
                self.name,
                shown(host),
                now - episode.last,
                episode.lines,
                episode.last - episode.since,
                episode.reason,
            )

    def cut(self) -> None:
        """Nothing to seal: the assembler's groups outlive any batch."""

    async def deliver(self, batch: object, stopping: Stopping) -> None:
        """Publish what is ready and settle what is safe (see the module docstring); a failure raises and
        the runtime calls it again (what was published left `_ready`)."""
        await self.step(stopping)

    def settle(self) -> Settled:
        settled, self._settled = self._settled, Settled()
        return settled

    def gauges(self) -> None:
        self.counters.open_samples = self.translator.samples.open_groups

    # -- the grace window ---------------------------------------------------------------------------------
    async def tick(self, stopping: Stopping) -> None:
        """Flush expired groups and settle while no message arrives (the runner only calls `deliver` when it
        has messages in hand)."""
        await self.step(stopping)

    async def step(self, stopping: Stopping, *, everything: bool = False) -> None:
        """Flush (`everything`: all groups, else the expired ones), publish, write files, then settle every
        message whose envelopes are out; a failure to publish or write raises (the runtime retries)."""
        async with self._lock:
            now = self.clock()
            self._end_episodes(now)
            self._ready.extend(self.translator.flush_all() if everything else self.translator.flush(now))
            while self._ready:
                await self._publish(self._ready[0])
                self._ready.popleft()
                self._sent = 0
            await self._write_files()
            # Everything emitted up to flush(now) is out: each group that held lines added by `now - grace`.
            safe = float("inf") if everything else now - self.settings.grace
            done = self._settled.done
            done += self._free
            self._free.clear()
            held = self._held
            while held and held[0].t <= safe:
                done.append(held.popleft().key)

    async def close(self, stopping: Stopping) -> None:
        """Shutdown: publish and settle what is ready; hand back (or, `on_stop = "flush"`, publish partial)
        what still waits: also when publishing fails now (said, not retried: the next worker rebuilds it)."""
        flush = self.settings.on_stop == "flush" or not self.acks
        try:
            await self.step(stopping, everything=flush)
            ok = True
        except Exception as exc:
            log.warning("%s: stopping while publishing fails (%s)", self.name, describe(exc))
            ok = False
        async with self._lock:
            waiting = [held.key for held in self._held]
            self._held.clear()
            if ok and not self.translator.waiting:
                # No group is open: every held message's lines are in envelopes already published (and
                # written). Returning them would rebuild those envelopes after a restart, and once the
                # stream's duplicate window has passed they would be published and written a second time.
                self._settled.done += waiting
                return
            self._settled.done += self._free  # nothing of theirs waits in the assembler
            self._free.clear()
            self._settled.returned += waiting
            if waiting:
                log.info(
                    "%s: returned %d messages whose envelopes were still waiting; the next worker rebuilds them",
                    self.name,
                    len(waiting),
                )

    # -- internals ----------------------------------------------------------------------------------------
    def _reject(self, subject: str, payload: bytes, problems: list[Problem]) -> None:
        """An envelope dead-lettered by the runner with `problems` before the messages settled with it
        are acknowledged."""
        dead = DeadLetter(subject, payload, problems, "dlq:" + msg_id(subject, payload))
        self._settled.dead.append(dead)

    async def _publish(self, result: Assembled) -> None:
        """Publish one assembled envelope (in parts when it is larger than a message), or reject it with its
        problems (`_reject`); its problems and warnings go to the runner to report (`Settled.reports`).
        Called again for the same envelope after a failure: what was published and said is not again."""
        c = self.counters
        first = self._sent == 0
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
            self._settled.reports.append(problem)
            return
        subject = subjects.sonar(self.cluster, kind, prefix=self.outlet.prefix)
        try:
            payload = encode_envelope(env)
            problems = [p.located(subject) for p in validate_envelope(env)]
        except Exception as exc:  # never let one envelope block everything behind it
            log.exception("%s: cannot encode a %s envelope", self.name, kind)
            c.invalid_envelopes += 1
            self._settled.reports.append(Problem(f"not encodable: {exc}", subject, kind=f"sonar {kind}"))
            return
        if problems:
            c.invalid_envelopes += 1
            self._reject(subject, payload, problems + result.problems)
            return
        # A jobs or cluster envelope larger than a message goes in parts (same meta and attributes, records
        # cut); a sample or a single record too large for one is dead-lettered with the reason, never cut.
        messages, too_large = envelope_messages(subject, payload, self.outlet.message_limit(), env=env)
        if first:
            self._settled.reports += [p.located(subject) for p in result.problems]
            if too_large:
                c.too_large_envelopes += 1
                self._reject(subject, payload, too_large)
        while self._sent < len(messages):
            message = messages[self._sent]
            headers = {"Nats-Msg-Id": message.msg_id, ORIGIN_HEADER: TRANSLATED}
            try:
                duplicate = await self.outlet.publish(subject, message.payload, headers)
            except Exception as exc:  # the runtime's table decides: retried, or never publishable
                found = outcome(exc)
                if not isinstance(found, Permanent):
                    raise
                c.undeliverable_envelopes += 1
                problem = Problem(f"can never be published: {found.reason}", subject, kind="undeliverable")
                self._reject(subject, payload, [problem])
                return
            self._sent += 1
            c.duplicate_envelopes += duplicate
            if self.directory is not None and not duplicate:
                self._files.append((relative_path(env, kind), message.payload))
        if not messages:
            return
        c.envelopes += 1
        c.envelope_parts += len(messages) if len(messages) > 1 else 0
        c.partial_envelopes += not result.complete
        c.followup_envelopes += result.followup

    async def _write_files(self) -> None:
        """Append the published envelopes to the tree (`DirectoryWriter.append` removes each once written,
        so a retried step goes on). An envelope whose file no retry can write (`hpcbus.permanent.outcome`)
        is rejected with the reason (its input cannot be: the envelope gathers several messages, all
        acknowledged for the envelope on the bus), so the files behind it are written."""
        if self.directory is None or not self._files:
            return
        before = self.directory.written
        refused: list[tuple[tuple[str, bytes], str]] = []
        try:
            await asyncio.to_thread(self.directory.append, self._files, refused)
        finally:
            self.counters.files_written += self.directory.written - before
            for (rel, payload), reason in refused:
                kind = next((k for k, word in FILE_TYPE.items() if f"/0+{word}-" in f"/{rel}"), "sample")
                subject = subjects.sonar(self.cluster, kind, prefix=self.outlet.prefix)
                problem = Problem(f"file can never be written: {reason}", subject, kind=f"sonar {kind}")
                if not self._refused_files:
                    log.warning("%s: %s; dead-lettered, and so is every such envelope", self.name, problem)
                self._reject(subject, payload, [problem])
                self._refused_files += 1
        if not refused and self._refused_files:
            log.info(
                "%s: writing files again; %d envelopes dead-lettered meanwhile",
                self.name,
                self._refused_files,
            )
            self._refused_files = 0
