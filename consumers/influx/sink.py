"""The InfluxDB sink of the consumer runner: take messages, write their body, account for every line.

The body (the subject's `cluster` tag, stable field types, the cardinality policy, `type-id=0` for node-level
lines, nanosecond timestamps for log and event lines) is made by `schemas.influxbody`, the pure twin of the
compiled splice beside it (`schemas/_influxdb.c`). This sink delivers it: each bad line of a message is
named (`BadInput`: the runner puts a `log,loglevel=error` line naming subject, line number and reason on
`<cluster>.log.hpcbus` and dead-letters the whole original message with its problems in a header; replaying
it re-writes its good lines too, which is harmless: same points), the body is written in chunks of
`batch_lines` through `hpcbus.influx.writer`, a field type conflict is followed (`_after_conflict`), and
what InfluxDB refuses for good is raised to the runner once the rest is stored. Each job summary that comes
on `<cluster>.events.jobsummary` is also written as its `job_summary` point (`schemas.influxbody`), so every
InfluxDB copy a worker group fills has the summaries `hpcbus report` and the dashboards read.
"""

from __future__ import annotations

import logging
import time

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from hpcbus.contract import BadInput, SinkBase
from hpcbus.counters import Counters
from hpcbus.influx.settings import InfluxSettings
from hpcbus.influx.writer import Partial, Writer
from hpcbus.outlet import Outlet
from hpcbus.retry import Stopping
from hpcbus.schemas import subjects
from hpcbus.schemas.influxbody import Bodies, Part
from hpcbus.schemas.influxdb import KINDS, FieldTypes, lines_of, one_shard, type_conflict, values_as
from hpcbus.schemas.problems import Problem

log = logging.getLogger("hpcbus.influx")


class InfluxCounters(Counters):
    """The standard counters (`rejected`: lines) and the lines this sink takes and writes."""

    received_lines: int = 0
    written_lines: int = 0


class Batch(msgspec.Struct):
    parts: list[Part] = msgspec.field(default_factory=list)
    msgs: list[Msg] = msgspec.field(default_factory=list)
    body: list[str] | None = None
    """The write body, built once (a retried batch is not formatted again); seconds."""
    logs: list[str] = msgspec.field(default_factory=list)
    """The log lines, nanosecond timestamps: written after `body`, in requests of their own."""
    written: int = 0
    """Lines of `body`, then of `logs`, InfluxDB has taken."""
    refused: list[Partial] = msgspec.field(default_factory=list)
    """InfluxDB's partial writes that refused points for good (a limit exceeded, a field type it holds
    otherwise): raised once every chunk is written, so the runner dead-letters the messages they came from."""


class InfluxSink(SinkBase):
    def __init__(
        self,
        nc: NATS,
        writer: Writer,
        settings: InfluxSettings,
        report_cluster: str,
        name: str,
        *,
        prefix: str = "",
        compiled: bool = True,
    ) -> None:
        """`compiled`: the usual line by the compiled splice where it is built (`schemas.influxdb.SPLICE`);
        False runs the pure path (tests compare the two in one process; `HPCBUS_PURE=1` switches it off for
        every component)."""
        self.nc = nc
        self.outlet = Outlet(nc, report_cluster, jetstream=True, prefix=prefix)
        self.writer = writer
        self.settings = settings
        self.report_cluster = report_cluster
        self.name = name
        self.counters = InfluxCounters()
        self.what = f"InfluxDB write failed ({settings.url})"
        self.retry_cap = settings.max_retry_wait
        self._batch = Batch()
        self.bodies = Bodies(compiled=compiled)
        """Reads each message and makes the write body (pure: `schemas.influxbody`)."""
        self._seq = 0
        """Messages taken: the sequence of a message without JetStream metadata (core mode)."""
        self._summaries = subjects.jobsummary(report_cluster, prefix=prefix)
        """The jobs worker's subject: the only one whose summaries become `job_summary` points."""

    @property
    def types(self) -> FieldTypes:
        """The type each metric's `value` is written with (`bodies`': the registry's, else the one InfluxDB
        said it holds)."""
        return self.bodies.types

    # -- runner interface -------------------------------------------------------------------------------
    def take(self, msg: Msg) -> int:
        """Parse and keep the good lines for the batch; `BadInput` names the bad ones (the runner reports
        and dead-letters the message after the batch is written)."""
        batch = self._batch
        batch.msgs.append(msg)
        try:
            source = subjects.parse(msg.subject, self.outlet.prefix)
        except subjects.SubjectError as exc:
            raise BadInput([Problem(str(exc), msg.subject, 0, "subject")]) from None
        now = int(time.time())
        max_future = self.settings.max_future
        summaries = msg.subject == self._summaries
        part, kept, problems = self.bodies.read(
            msg.data, source, now=now, place=msg.subject, max_future=max_future, summaries=summaries
        )
        errors = [p for p in problems if p.severity == "error"]
        self._seq += 1
        try:
            part.seq = msg.metadata.sequence.stream
        except Exception:  # not a JetStream delivery (core mode)
            part.seq = self._seq
        batch.parts.append(part)
        self.counters.received_lines += kept + len(errors)
        if errors:
            raise BadInput(errors, kept, len(errors))
        return kept

    def cut(self) -> Batch:
        batch, self._batch = self._batch, Batch()
        return batch

    async def deliver(self, batch: object, stopping: Stopping) -> None:
        """Write the batch; raises what the writer raised (the runner's table, `hpcbus.permanent.outcome`,
        decides: retried, delivered message by message, dead-lettered with the line problems `take` found).
        Progress is kept in the batch: what was written is not written again when the runner calls this
        again."""
        assert isinstance(batch, Batch)
        if batch.body is None:
            batch.body = self._body(batch)
        size = self.settings.batch_lines
        done = 0
        for lines, precision in ((batch.body, "s"), (batch.logs, "ns")):
            while batch.written - done < len(lines):
                start = batch.written - done
                chunk = lines[start : start + size]
                await self._write(chunk, precision, batch.refused)
                batch.written += len(chunk)
            done += len(lines)
        if batch.refused:
            # Every good point is stored; the refused ones never will be. Raised as InfluxDB said it (the
            # first refusal, with the count of all): `hpcbus.permanent.outcome` makes it `Permanent`, the
            # runner delivers the batch's messages one by one and dead-letters those refused again alone,
            # with this reason, so what follows them flows (issue 31: a full `max-values-per-tag` once
            # dropped every later job's points with one ERROR per batch and no dead letter).
            # Said and counted (`rejected`: the refused points) once per message: a batch of several is
            # delivered again message by message, and each refused message says it then.
            first = batch.refused[0]
            dropped = sum(p.dropped for p in batch.refused)
            batch.refused = []
            if len(batch.msgs) == 1:
                self.counters.rejected += dropped
                await self.outlet.log_line("error", f"influx partial write: {first}")
            raise Partial(str(first), dropped)

    def _body(self, batch: Batch) -> list[str]:
        """The batch's body (`schemas.influxbody`); its log lines go to `batch.logs`, and each line that
        could not be written is counted (`rejected`) and said."""
        body = self.bodies.body(batch.parts, self.settings.processes == "aggregate")
        batch.logs += body.logs
        for reason in body.unwritable:  # cannot happen for parsed input; counted, never silent
            self.counters.rejected += 1
            log.error("line not writable: %s", reason)
        return body.lines

    # -- internals ----------------------------------------------------------------------------------------
    async def _write(self, body: list[str], precision: str, refused: list[Partial]) -> None:
        """Write `body`; what the writer raises, other than a partial write, goes to the runner. A partial
        write naming a field type conflict is written again in the type InfluxDB holds (`_after_conflict`:
        not a retry of the same request, bounded); any other partial write leaves its good lines stored
        and its refusal in `refused` (`deliver` raises it once the whole batch is written)."""
        offered: dict[str, set[str]] = {}
        while body:
            try:
                await self.writer.write("\n".join(body) + "\n", precision)
            except Partial as exc:
                again = await self._after_conflict(body, exc, offered, precision, refused)
                if again is None:  # no type conflict named (a limit exceeded...): the rest is stored
                    self.counters.written_lines += max(len(body) - exc.dropped, 0)
                    refused.append(exc)
                    return
                body = again  # the good lines are stored: what is sent again is only merged with them
                continue
            self.counters.written_lines += len(body)
            return

    async def _after_conflict(
        self,
        body: list[str],
        exc: Partial,
        offered: dict[str, set[str]],
        precision: str,
        refused: list[Partial],
    ) -> list[str] | None:
        """What to write again after a partial write whose error names a field type conflict ([]: nothing;
        the lines refused for good are added to `refused`), None when it names none (the caller keeps it).

        InfluxDB holds a field's type per shard and names the first conflict of a write (measurement `m`, the
        type sent, the type it holds): `m`'s lines of `body` are written again in the type it holds when
        hpcbus may write that (`FieldTypes.writable`: float always, integer for a registry-int measurement
        with integral values), and the writer follows that type from now on (`FieldTypes.learn`, both
        directions). A batch that spans a shard of each type gets its `m` lines refused again, now by the
        other shard: they have been offered in both types, each shard stored the variant of its type, they
        are not written a third time, and the writer goes on with the registry's type. Only lines InfluxDB
        refuses in every type we may write are refused (`refused`: their messages are dead-lettered). The rest of `body` is stored, and not written
        again, when the error's count of dropped points is exactly `m`'s lines and the write lies in one
        shard (`one_shard`); else it may hold refused points too and is written again (so that one conflict
        never hides the next: InfluxDB names only the first). Bounded: each call either offers a
        measurement's lines in its one other type (once per measurement) or takes them out of what is
        written again."""
        error = str(exc)
        conflict = type_conflict(error)
        if conflict is None:
            return None
        measurement, sent, stored = conflict
        prefixes = lines_of(measurement)
        ours = [text for text in body if text.startswith(prefixes)]
        if not ours:
            return None
        rest = [text for text in body if not text.startswith(prefixes)]
        tried = offered.setdefault(measurement, {sent})
        kind = self.types.writable(measurement, stored)
        again = values_as(ours, kind) if kind is not None and stored not in tried else None
        if again is not None:
            tried.add(stored)
            if self.types.get(measurement, float) is not kind:
                self.types.learn(error)
                held = (
                    " (written so before): writing it as float"
                    if kind is float
                    else ": writing it as integer"
                )
                await self._follow(f"InfluxDB holds {measurement} as {stored}{held}")
        elif stored in tried:  # offered in both types: each shard stored the variant of its type
            self.counters.written_lines += len(ours)
            again = []
            # which shard is the current one InfluxDB does not say: the registry's type, what a new shard gets
            # from a writer just started (a wrong guess costs the next batch one more write)
            kind = KINDS.get(measurement, float)
            if self.types.get(measurement, float) is not kind:
                self.types[measurement] = kind
                either = f"InfluxDB holds {measurement} as float in one shard, as integer in another"
                await self._follow(f"{either}: writing it as {'integer' if kind is int else 'float'}")
        else:  # refused in the type InfluxDB holds, and not ours to write in it: dropped where it holds it
            dropped = min(exc.dropped, len(ours)) if exc.dropped else len(ours)
            self.counters.written_lines += len(ours) - dropped
            refused.append(Partial(error, dropped))
            again = []
        # the dropped points are `ours`: the rest is stored (InfluxDB answers a write across shards with the
        # first shard's count only: then the rest is written again)
        if exc.dropped == len(ours) and one_shard(body, precision):
            self.counters.written_lines += len(rest)
            return again
        return again + rest

    async def _follow(self, note: str) -> None:
        """A measurement is written in another type from now on (`self.types`): said once, on the log and the
        log subject."""
        self.bodies.forget()  # its spliced lines are written in their new type from now on
        log.warning("%s", note)
        await self.outlet.log_line("warn", note)
