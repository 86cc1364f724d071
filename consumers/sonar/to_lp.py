"""Sonar -> line protocol: envelopes on `<cluster>.sonar.<kind>` become lines on `<cluster>.metrics` and
`<cluster>.events.<class>` (docs/mapping.md sections 4-7).

Stateless per message, so the runner's ordinary contract fits: `take` decodes and translates, `deliver`
publishes every payload (JetStream, deterministic `Nats-Msg-Id`, so a redelivered envelope's lines are
dropped as duplicates) and returns True, and only then does the runner acknowledge the batch.

The kind comes from the subject (`decode_envelope(expect=kind)`): an errors-only envelope carries no kind of
its own, and a sysinfo envelope on `.sonar.sample` is a mistake worth rejecting. A bad envelope is reported
on `<cluster>.log.hpcbus` and kept, whole and with its problems, in the dead-letter stream; good envelopes in
the same batch are delivered. A message holding several envelopes (JSONL, or pretty-printed back to back, as
Sonar's files are) is read envelope by envelope, and a bad one never hides the good ones beside it.

Lines go to the subjects of the cluster this worker consumes for, even when the envelope names another
cluster (the lines keep their `cluster` tag): the worker's stream is the one it knows exists.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec
from nats.aio.msg import Msg

from hpcbus.consumers.sonar.directory import DirectoryWriter, relative_path
from hpcbus.counters import Counters
from hpcbus.outlet import ORIGIN_HEADER, TRANSLATED, Outlet, own_output
from hpcbus.permanent import Partial
from hpcbus.retry import Stopping
from hpcbus.runner import BadInput, SinkBase
from hpcbus.schemas import subjects
from hpcbus.schemas.hostnames import rename_hosts
from hpcbus.schemas.lineprotocol.timestamps import DEFAULT_MAX_FUTURE
from hpcbus.schemas.problems import InvalidInput, Problem
from hpcbus.schemas.sonar import PartlyInvalid, decode_envelope, encode_envelope, iter_envelopes
from hpcbus.schemas.translate import MAX_PAYLOAD, Envelope, envelope_payloads, event_budget, msg_id
from hpcbus.settings import HostnameSettings

log = logging.getLogger("hpcbus.sonar")

LINE_SHOWN = 120
"""Bytes of a refused line quoted in its reason (measurement and tags: which record it was)."""


class ToLpCounters(Counters):
    """The standard counters (`rejected`: envelopes) and the translation's."""

    skipped_messages: int = 0
    """Messages this or another translator published (marked `Hpcbus-Origin`): not translated again."""
    envelopes: int = 0
    published_messages: int = 0
    published_lines: int = 0
    duplicate_messages: int = 0
    """Publishes JetStream dropped as already stored (a redelivered envelope)."""
    files_written: int = 0


class _Out(msgspec.Struct):
    """The messages of one envelope, and its line for the directory tree."""

    payloads: list[tuple[str, bytes, int]]
    """(subject, payload, number of lines)."""
    file: tuple[str, bytes] | None = None
    msg: Msg | None = None
    """The input message the envelope came in (dead-lettered if its file can never be written)."""
    warnings: list[Problem] = msgspec.field(default_factory=list)
    """cc-backend events that could not be derived (the record lacks what cc-backend requires)."""
    sent: int = 0
    """Payloads published so far (a delivery the runtime calls again goes on from here)."""
    fresh: bool = False
    """JetStream stored at least one of its payloads (not all duplicates: not handled before)."""
    said: bool = False
    """Its warnings are reported."""


class Batch(msgspec.Struct):
    """A sealed batch: the envelopes' messages, then the files of the fresh ones (kept across deliveries,
    `DirectoryWriter.append` removes each once written) and those no retry can write."""

    outs: list[_Out]
    files: list[tuple[str, bytes]] | None = None
    owners: dict[int, Msg] = msgspec.field(default_factory=dict)
    refused: list[tuple[tuple[str, bytes], str]] = msgspec.field(default_factory=list)


def decode_all(
    raw: bytes, kind: str, place: str, latest: int | None = None
) -> tuple[list[Envelope], list[Problem]]:
    """Every envelope of one message and the problems of the bad ones, located at `place` (the subject);
    `latest` (now + max_future) refuses envelope times outside the window line protocol has.

    One envelope per message is the rule (Sonar's Kafka and HTTP sinks send one), so that is tried first;
    only when it fails is the message read as a stream of envelopes."""
    try:
        return [decode_envelope(raw, expect=kind, latest=latest)], []
    except PartlyInvalid as exc:  # records refused alone: the rest is translated, the message dead-lettered
        return [exc.envelope], [p.located(place) for p in exc.problems]
    except InvalidInput as exc:
        first = [p.located(place) for p in exc.problems]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return [], first
    found = list(iter_envelopes(text, expect=kind, latest=latest))
    if len(found) < 2:
        return [], first
    envelopes: list[Envelope] = []
    problems: list[Problem] = []
    for _, item in found:
        if isinstance(item, InvalidInput):
            problems.extend(p.located(place) for p in item.problems)
            if isinstance(item, PartlyInvalid):
                envelopes.append(item.envelope)
        else:
            envelopes.append(item)
    return envelopes, problems


class ToLpSink(SinkBase):
    """The runner's sink for `<cluster>.sonar.>` (see the module docstring)."""

    def __init__(
        self,
        outlet: Outlet,
        name: str,
        directory: DirectoryWriter | None,
        hostnames: HostnameSettings | None = None,
        max_future: int = DEFAULT_MAX_FUTURE,
    ) -> None:
        self.max_future = max_future
        """Seconds an envelope's time may be ahead of this worker's clock (the window of `decode_envelope`)."""
        self.hostnames = hostnames or HostnameSettings()
        """How nodes are named: every envelope is renamed before it is translated and written."""
        self.outlet = outlet
        self.cluster = outlet.cluster
        self.name = name
        self.directory = directory
        self.counters = ToLpCounters()
        self._out: list[_Out] = []

    # -- runner interface -------------------------------------------------------------------------------
    def take(self, msg: Msg) -> int:
        """Translate every envelope of `msg`; `BadInput` names the bad ones (all problems of the message in
        one: the runner reports and dead-letters it once the batch is published)."""
        c = self.counters
        if own_output(msg):
            c.skipped_messages += 1
            return 0
        try:
            subject = subjects.parse(msg.subject, self.outlet.prefix)
            if subject.category != "sonar":
                raise subjects.SubjectError(f"{msg.subject}: not a <cluster>.sonar.<kind> subject")
        except subjects.SubjectError as exc:
            raise BadInput([Problem(str(exc), msg.subject, kind="subject")], 0, 1) from None
        latest = int(time.time()) + self.max_future
        envelopes, problems = decode_all(msg.data, subject.detail, msg.subject, latest)
        rejected = max(1, len({(p.line, p.kind) for p in problems})) if problems else 0
        lines = 0
        for env in envelopes:
            c.envelopes += 1
            refused: list[Problem] = []
            try:
                lines += self._translate(env, subject.detail, msg, refused)
            except Exception as exc:  # a translator bug must cost one envelope, never the worker
                log.exception("could not translate an envelope from %s", msg.subject)
                problems.append(Problem(f"not translatable: {exc}", msg.subject, kind="sonar"))
                rejected += 1
            if refused:  # the server would refuse those lines (and close the connection): never sent
                problems.extend(refused)
                rejected += 1
        if problems:
            raise BadInput(problems, lines, rejected)
        return lines

    def _translate(self, env: Envelope, kind: str, msg: Msg, refused: list[Problem]) -> int:
        """Translate one envelope into `self._out`; returns its line count. A line longer than one message
        (a sample's skeleton, a sysinfo event, the `slurm` event of a record too large to share a part) is
        left out with the reason in `refused`: the rest of the envelope, and its line in the tree, go on."""
        place = msg.subject
        h = self.hostnames
        env = rename_hosts(env, h.hostname_form, h.hostname_domain)
        out = _Out([], msg=msg)
        total = 0
        warnings: list[Problem] = []
        limit = self.outlet.message_limit()  # the server's: a jobs or cluster event must fit it
        groups = envelope_payloads(
            env,
            cluster=self.cluster,
            now=int(time.time()),
            problems=warnings,
            prefix=self.outlet.prefix,
            max_bytes=min(MAX_PAYLOAD, limit),
            max_event_bytes=event_budget(limit),
        )
        out.warnings = [p.located(place) for p in warnings]
        for subject, payloads in groups.items():
            ours = self._ours(subject)
            for payload in payloads:
                if len(payload) > limit:  # one line (payloads are cut between lines) longer than a message
                    start = payload[:LINE_SHOWN].decode("utf-8", "replace")
                    reason = (
                        f"a line of {len(payload)} bytes for {subject} is longer than one NATS message may be "
                        f"({limit}); that line ({start}...) is not published, the rest of the envelope is"
                    )
                    refused.append(Problem(reason, place, kind=f"sonar {kind}"))
                    continue
                n = payload.count(b"\n")
                out.payloads.append((ours, payload, n))
                total += n
        if self.directory is not None:
            out.file = (relative_path(env, kind), encode_envelope(env))
        self._out.append(out)
        return total

    def _ours(self, subject: str) -> str:
        """`subject` moved to this worker's cluster (the category and detail stay)."""
        parsed = subjects.parse(subject, self.outlet.prefix)
        if parsed.cluster == self.cluster:
            return subject
        return str(subjects.Subject(self.cluster, parsed.category, parsed.detail, self.outlet.prefix))

    def cut(self) -> Batch:
        batch, self._out = Batch(self._out), []
        return batch

    async def deliver(self, batch: object, stopping: Stopping) -> None:
        """Publish the lines of every envelope of the batch and write the files; returns when all of it is
        done (the runner then dead-letters the bad envelopes' messages and acknowledges). A failure raises
        (the runtime retries: what was published or written is kept in the batch, and the ids drop what got
        through twice). `Partial` names the messages whose file can never be written; the rest is
        delivered."""
        assert isinstance(batch, Batch)
        c = self.counters
        for out in batch.outs:
            while out.sent < len(out.payloads):
                subject, payload, n = out.payloads[out.sent]
                headers = {"Nats-Msg-Id": msg_id(subject, payload), ORIGIN_HEADER: TRANSLATED}
                duplicate = await self.outlet.publish(subject, payload, headers)
                out.sent += 1
                c.published_messages += 1
                c.published_lines += n
                c.duplicate_messages += duplicate
                out.fresh = out.fresh or not duplicate
            if out.warnings and out.fresh and not out.said:
                out.said = True
                await self.outlet.report_problems(out.warnings, "warning")
        if batch.files is None:
            # An envelope whose every message JetStream already had was handled before (a redelivery):
            # its line is in the file already.
            batch.files = [out.file for out in batch.outs if out.file is not None and out.fresh]
            batch.owners = {id(o.file): o.msg for o in batch.outs if o.file is not None and o.msg is not None}
        if batch.files and self.directory is not None:
            before = self.directory.written
            try:
                await asyncio.to_thread(self.directory.append, batch.files, batch.refused)
            finally:
                c.files_written += self.directory.written - before
        # The messages whose file cannot be written: the runner dead-letters them, each with its own reason
        # and with the other problems found in it (one dead letter per message).
        culprits: dict[int, Msg] = {}
        reasons: dict[int, str] = {}
        for item, reason in batch.refused:
            if (m := batch.owners.get(id(item))) is not None:
                culprits.setdefault(id(m), m)
                reasons[id(m)] = f"{reasons[id(m)]}; {reason}" if id(m) in reasons else reason
        if culprits:  # the rest is delivered
            raise Partial(batch.refused[0][1], list(culprits.values()), reasons=reasons)
