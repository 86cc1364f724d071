"""The InfluxDB sink of the consumer runner: parse, shape, write, and account for every line.

Per message: the good lines get the subject's `cluster` tag, stable field types and the cardinality policy,
and wait for the batch write. Node-level metric lines (`type=node`, on the bus without a `type-id` or with
their `stype` as one) are written with `type-id=0`, so their InfluxDB series, dashboards and retention
queries stay what they always were. Each bad line becomes a `log,loglevel=error` line on `<cluster>.log.hpcbus`
naming subject, line number and reason, and the whole original message goes to the dead-letter stream with
its problems in a header (replaying it re-writes its good lines too, which is harmless: same points).

Log and event lines (`log=`: hpcbus' own reports and anyone's; `event=`: job starts and stops, Sonar
envelopes, node states) are written with nanosecond timestamps: reports or events of one second share their
tags and second, and InfluxDB keeps one point per series and timestamp, so 3,828 reports once became 853
points, and two jobs that start in the same second would be one. Each such line keeps its second and gets a
distinct offset inside it from its message's stream sequence and its place in the message (`log_time_ns`):
no tag is added (series cardinality stays as it is), and a redelivered line lands on the same nanosecond, so
it is merged, not doubled. Metrics (`value=`) are measurements of a series at a time: seconds, as sent.

Two paths, one body: where the C extensions are built, `take` keeps `scan`'s items (a canonical line stays
its text) and `_body` has the compiled splice (`schemas/_influxdb.c`) write the usual and the node-level
metric line itself, handing every other item to the Python rules (`_placer`), which are the reference and
the whole pure path (`HPCBUS_PURE=1`, `compiled=False`); the process lines to aggregate are folded by the
compiled `FOLD` where it is sure of all of them, else by `aggregate_processes`: tests/test_compiled_influxdb.py
holds the bodies equal.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from hpcbus.counters import Counters
from hpcbus.influx.settings import InfluxSettings
from hpcbus.influx.writer import Partial, Writer
from hpcbus.outlet import Outlet
from hpcbus.retry import Stopping
from hpcbus.runner import BadInput, SinkBase
from hpcbus.schemas import subjects
from hpcbus.schemas.influxdb import (
    AGGS,
    FOLD,
    KINDS,
    SPLICE,
    FieldTypes,
    aggregate_processes,
    lines_of,
    one_shard,
    stable_types,
    tag_splice,
    type_conflict,
    values_as,
)
from hpcbus.schemas.lineprotocol import (
    INFLUX_NODE_ID,
    FormatError,
    Line,
    escape_tag,
    format_line,
    parse_payload,
)
from hpcbus.schemas.lineprotocol.format import FLOAT_MIN_NORMAL, plain_value, tag_set
from hpcbus.schemas.lineprotocol.scan import line_of, scan
from hpcbus.schemas.problems import Problem

log = logging.getLogger("hpcbus.influx")


class InfluxCounters(Counters):
    """The standard counters (`rejected`: lines) and the lines this sink takes and writes."""

    received_lines: int = 0
    written_lines: int = 0


class Part(msgspec.Struct):
    """The good lines of one message, with the cluster its subject names: as `parse_payload` read them
    (`lines`, `texts`: the pure path), or as `scan` kept them (`items`: the compiled path)."""

    cluster: str
    lines: list[Line]
    texts: list[str]
    seq: int = 0
    """The message's stream sequence (a worker-local count in core mode): places its log lines in time."""
    items: list[str | Line] | None = None
    """Per good line, its canonical text or its `Line` (`scan.Scanned.items`); None on the pure path."""


def log_time_ns(second: int, seq: int, index: int) -> int:
    """The nanosecond timestamp of the `index`-th log line of the message with stream sequence `seq`: inside
    `second`, distinct for up to a million messages and a thousand log lines per message in one second."""
    return second * 1_000_000_000 + (seq % 1_000_000) * 1_000 + index % 1_000


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
        """`compiled`: the usual line by the compiled splice where it is built (`SPLICE`); False runs the pure
        path (tests compare the two in one process; `HPCBUS_PURE=1` switches it off for every component)."""
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
        self.types = FieldTypes()
        """The type each metric's `value` is written with (the registry's, else the one InfluxDB said it holds)."""
        self._by_cluster: dict[str, dict[str, tuple[type, str, str]]] = {}
        """cluster -> `_splices`: how a canonical line of each measurement is forwarded."""
        self._node_sections: dict[str, str] = {}
        """A node-level line's tag-set text -> it with `type-id=0` ("": format such lines): `_node_section`."""
        self._seq = 0
        """Messages taken: the sequence of a message without JetStream metadata (core mode)."""
        self._splice = SPLICE if compiled else None
        """The compiled splice (`take` keeps `scan`'s items for it), or None: the pure path."""

    # -- runner interface -------------------------------------------------------------------------------
    def take(self, msg: Msg) -> int:
        """Parse and keep the good lines for the batch; `BadInput` names the bad ones (the runner reports
        and dead-letters the message after the batch is written)."""
        batch = self._batch
        batch.msgs.append(msg)
        try:
            cluster = subjects.parse(msg.subject, self.outlet.prefix).cluster
        except subjects.SubjectError as exc:
            raise BadInput([Problem(str(exc), msg.subject, 0, "subject")]) from None
        now = int(time.time())
        max_future = self.settings.max_future
        if self._splice is not None:  # the compiled path: canonical lines stay text for the splice
            scanned = scan(msg.data, now=now, place=msg.subject, max_future=max_future)
            part = Part(cluster, [], [], items=scanned.items)
            kept, problems = len(scanned.items), scanned.problems
        else:
            parsed = parse_payload(msg.data, now=now, place=msg.subject, max_future=max_future)
            part = Part(cluster, parsed.lines, parsed.texts)
            kept, problems = len(parsed.lines), parsed.problems
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
        """The lines to write: forwarded as they came where they are canonical, else formatted. A part the
        compiled path kept (`Part.items`) goes through the compiled splice, which takes the usual line itself
        and hands every other item to `_placer`'s Python way, in its place: the same body, byte for byte."""
        aggregate = self.settings.processes == "aggregate"
        out: list[str] = []
        processes: list[Line | tuple[str, str]] = []
        clusters: dict[str, str] = {}
        """The `tag` of each part the splice kept process lines of -> its cluster."""
        for part in batch.parts:
            place = self._placer(part, batch, out, processes, aggregate)
            if part.items is None:
                for line, text in zip(part.lines, part.texts, strict=True):
                    place(line, text)
                continue
            tag = self._tag(part.cluster)
            if self._splice is None or tag is None:
                for item in part.items:
                    _place_item(place, item)
                continue
            clusters[tag] = part.cluster
            other = functools.partial(_place_item, place)
            self._splice(part.items, tag, self.types, aggregate, out, other, processes)
        compiled = processes and self._splice is not None and FOLD is not None
        folded = FOLD(processes, self.types, AGGS) if compiled else None  # type: ignore[misc]
        if folded is not None:  # the compiled fold, sure of every process line of the batch
            out += folded
            return out
        lines = [
            _as_process(line_of(item[0]), clusters[item[1]]) if type(item) is tuple else item
            for item in processes
        ]
        for line in aggregate_processes(lines):  # type: ignore[arg-type]
            self._format_into(out, line)
        return out

    def _placer(
        self,
        part: Part,
        batch: Batch,
        out: list[str],
        processes: list[Line | tuple[str, str]],
        aggregate: bool,
    ) -> Callable[[Line, str], None]:
        """The pure path's way with one good line of `part` (its `Line` and its text, "" when it has none):
        into `out` (seconds), `batch.logs` (log and event lines, ns) or `processes` (to aggregate)."""
        splices = self._splices(part.cluster)
        logs = 0

        def place(line: Line, text: str) -> None:
            nonlocal logs
            tags = line.tags
            # A canonical metric line (the parser kept its text, so its only field is a numeric `value`) in
            # the type its measurement is written in goes as text, unless it is a process line to aggregate;
            # checked in the order that settles it soonest (this runs per line). `_influxdb.c` does the same.
            if text and not (aggregate and tags.get("stype") == "process"):
                cluster = tags.get("cluster")
                # Without a cluster tag: the cluster spliced in after the measurement. A node-level line
                # gets `type-id=0` written into its text (InfluxDB has it so, the bus not): `_node_text`, ""
                # when anything is unusual (then it is formatted below).
                if cluster is None:
                    if tags.get("type") != "node" or (text := self._node_text(text, line)):
                        want, old, new = self._splice_of(splices, line.measurement, part.cluster, self.types)
                        if type(line.fields["value"]) is want and text.startswith(old):
                            out.append(new + text[len(old) :])
                            return
                # What the node agent sends: the line carries the subject's cluster already, and goes as it
                # came (the same point as `format_line` would write: same tags, value and type; the text may
                # keep its own tag order and number text). A second `cluster` tag or a node-level line is
                # formatted.
                elif cluster == part.cluster and tags.get("type") != "node" and text.count(",cluster=") == 1:
                    want = self._splice_of(splices, line.measurement, part.cluster, self.types)[0]
                    if type(line.fields["value"]) is want:
                        out.append(text)
                        return
            if "log" in line.fields or "event" in line.fields:
                tags["cluster"] = part.cluster
                at = log_time_ns(line.time, part.seq, logs)
                logs += 1
                self._format_into(batch.logs, msgspec.structs.replace(line, time=at))
                return
            if aggregate and tags.get("stype") == "process":
                processes.append(_as_process(line, part.cluster))
                return
            if tags.get("type") == "node":  # the series' `type-id=0` of old (not on the bus)
                tags["type-id"] = INFLUX_NODE_ID
            tags["cluster"] = part.cluster
            self._format_into(out, line)

        return place

    def _tag(self, cluster: str) -> str | None:
        """`,cluster=<cluster>` as the compiled splice writes it after a measurement (escaped); None when
        it is not plain ASCII or cannot be written (the pure path then decides, and says why)."""
        try:
            tag = escape_tag("cluster", cluster)
        except FormatError:
            return None
        return tag if tag.isascii() else None

    def _node_text(self, text: str, line: Line) -> str:
        """A node-level line's text with InfluxDB's `type-id=0` in it (no cluster yet), byte for byte what
        `format_line` writes for the line with that tag once the splice adds `cluster=`; "" when the line is
        to be formatted instead. Its tag set (the text between measurement and the first space) is checked
        once per distinct text (`_node_section`: a node's lines repeat a handful), the value and timestamp
        are written as `format_line` writes them."""
        name = line.measurement
        end = text.find(" ")
        section = text[len(name) : end]
        new = self._node_sections.get(section)
        if new is None:
            new = self._node_section(section, line.tags)
        if not new:
            return ""
        number = line.fields["value"]
        value = plain_value(number)
        if value is None:
            if type(number) is not float or not -FLOAT_MIN_NORMAL < number < FLOAT_MIN_NORMAL:
                return ""
            value = "0.0"  # zero (an idle CPU's share: common) and subnormals, as `format_line` writes them
        return f"{name}{new} value={value} {line.time}"

    def _node_section(self, section: str, tags: dict[str, str]) -> str:
        """`_node_sections`' entry for a tag-set text: the tag set with `type-id=0` as `format_line` writes
        it, when `section` is exactly how `format_line` writes the line's own tags (sorted, escaped: so an
        escaped `\\,` or a value holding `,type=node` can never be misread) and `cluster` will sort first;
        else "". Bounded: forgotten beyond 10,000 distinct texts."""
        if len(self._node_sections) > 10_000:
            self._node_sections.clear()
        new = ""
        try:
            if "cluster" not in tags and min(tags) > "cluster" and section == tag_set(tags):
                new = tag_set({**tags, "type-id": INFLUX_NODE_ID})
        except FormatError:
            pass
        self._node_sections[section] = new
        return new

    def _splices(self, cluster: str) -> dict[str, tuple[type, str, str]]:
        """measurement -> (its value's InfluxDB type, its text prefix, the prefix with `cluster=` spliced
        in), per cluster; measurement names and clusters are few, and odd input never grows it without
        bound (the clusters are forgotten beyond 100, a cluster's measurements beyond 10,000)."""
        found = self._by_cluster.get(cluster)
        if found is None:
            if len(self._by_cluster) > 100:
                self._by_cluster.clear()
            found = self._by_cluster[cluster] = {}
        return found

    @staticmethod
    def _splice_of(
        splices: dict[str, tuple[type, str, str]], measurement: str, cluster: str, types: FieldTypes
    ) -> tuple[type, str, str]:
        """`splices`' entry for `measurement`, made on first use: (its value's type, its text prefix, the
        prefix with `cluster=` spliced in)."""
        found = splices.get(measurement)
        if found is not None:
            return found
        if len(splices) > 10_000:
            splices.clear()
        prefixes = tag_splice(measurement, escape_tag("cluster", cluster))
        # "\n" never starts a line: a measurement that needs escapes is always formatted
        old, new = prefixes if prefixes is not None else ("\n", "")
        splice = splices[measurement] = (types.get(measurement, float), old, new)
        return splice

    def _format_into(self, out: list[str], line: Line) -> None:
        try:
            out.append(format_line(stable_types(line, self.types)))
        except FormatError as exc:  # cannot happen for parsed input; counted, never silent
            self.counters.rejected += 1
            log.error("line not writable: %s", exc)

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
        self._by_cluster.clear()  # its spliced lines are written in their new type from now on
        log.warning("%s", note)
        await self.outlet.log_line("warn", note)


def _as_process(line: Line, cluster: str) -> Line:
    """A process line as `aggregate_processes` gets it: `type-id=0` where it is node-level (InfluxDB's series
    of old), the cluster of its subject (in place, returned). The splice's `(text, tag)` of one too, where the
    compiled fold leaves the batch's process lines to the Python way."""
    tags = line.tags
    if tags.get("type") == "node":
        tags["type-id"] = INFLUX_NODE_ID
    tags["cluster"] = cluster
    return line


def _place_item(place: Callable[[Line, str], None], item: str | Line) -> None:
    """`place` for an item `scan` kept: a canonical text is read back into its `Line` (`line_of`: what the
    pure path built for it), so the pure path's rules decide it."""
    if type(item) is str:
        place(line_of(item), item)
    else:
        place(item, "")  # type: ignore[arg-type]
