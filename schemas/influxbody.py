"""The InfluxDB write body of the bus' line-protocol messages: the pure twin of `_influxdb.c`, beside it.

Per message (a `Part`): the good lines get the subject's `cluster` tag, stable field types and the cardinality
policy (`schemas.influxdb`). Node-level metric lines (`type=node`, on the bus without a `type-id` or with
their `stype` as one) are written with `type-id=0`, so their InfluxDB series, dashboards and retention
queries stay what they always were.

Log and event lines (`log=`: hpcbus' own reports and anyone's; `event=`: job starts and stops, Sonar
envelopes, node states) are written with nanosecond timestamps: reports or events of one second share their
tags and second, and InfluxDB keeps one point per series and timestamp, so 3,828 reports once became 853
points, and two jobs that start in the same second would be one. Each such line keeps its second and gets a
distinct offset inside it from its message's stream sequence and its place in the message (`log_time_ns`):
no tag is added (series cardinality stays as it is), and a redelivered line lands on the same nanosecond, so
it is merged, not doubled. Metrics (`value=`) are measurements of a series at a time: seconds, as sent.

Two paths, one body: where the C extensions are built, `Bodies.read` keeps `scan`'s items (a canonical line
stays its text) and `Bodies.body` has the compiled splice (`SPLICE`, `_influxdb.c`) write the usual and the
node-level metric line itself, handing every other item to the Python rules (`_placer`), which are the
reference and the whole pure path (`HPCBUS_PURE=1`, `compiled=False`); the process lines to aggregate are
folded by the compiled `FOLD` where it is sure of all of them, else by `aggregate_processes`:
tests/test_compiled_influxdb.py holds the bodies equal. Why here, not in the sink: the C and the Python
it mirrors are read and changed together, and neither does I/O (`consumers.influx.sink` writes the body).

Job summaries (issue 34): `consume jobs` writes each summary's `job_summary` point into its own InfluxDB and
publishes the summary as a `jobsummary` event; a second InfluxDB filled by its own worker group (docs/
scaling.md, "Two InfluxDBs") would have the event only. So each `jobsummary` event that came on its own
subject, `<cluster>.events.jobsummary` (which only the jobs worker may publish on: docs/security.md), is
also written as its `job_summary` point (`schemas.jobsummary.event_point`: the same encoder, so the same
point; in the copy `consume jobs` writes too, an identical point that InfluxDB merges). Derived when a
message is read (`Bodies.read`), so that an event that is no summary is refused with its reason and the
message dead-lettered like any bad line; a `jobsummary` line on another events or log subject is refused
too, since it cannot be the jobs worker's (the subject is compared whole: `<c>.events.x.events.jobsummary`
is another cluster's to the parser), and so is a `job_summary` line on any of them (the point is made here
and nowhere else: a log line stores every field it has). Only such messages whose bytes hold either name
are looked through; a metric message (`<cluster>.metrics`, `.telemetry`) is not searched at all: the byte search alone
cost 12 % of reading a 565 kB agent message, and an event line there (stored as an event, as ever) gets no
point.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Final

import msgspec

from hpcbus.schemas.influxdb import (
    AGGS,
    FOLD,
    SPLICE,
    FieldTypes,
    aggregate_processes,
    stable_types,
    tag_splice,
)
from hpcbus.schemas.jobsummary import MEASUREMENT as JOBSUMMARY
from hpcbus.schemas.jobsummary import MEASUREMENTS as _SUMMARY_MEASUREMENTS
from hpcbus.schemas.jobsummary import POINT as JOB_SUMMARY_POINT
from hpcbus.schemas.jobsummary import event_point
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
from hpcbus.schemas.subjects import TELEMETRY, Subject

_MARKS: Final = tuple(m.encode() for m in _SUMMARY_MEASUREMENTS)
"""What a payload holding a line of either must contain (`Bodies.read` looks through no other)."""
_METRICS: Final = frozenset({"metrics", TELEMETRY})
"""Subject categories of metric messages: never looked through for summaries (`Bodies.read`)."""


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
    summaries: list[str] = msgspec.field(default_factory=list)
    """The `job_summary` points of its `jobsummary` events (formatted, nanosecond timestamps)."""


class Body(msgspec.Struct):
    """What `Bodies.body` makes of some parts."""

    lines: list[str]
    """The metric lines, timestamps in seconds."""
    logs: list[str]
    """The log and event lines and the `job_summary` points of the summaries among them, nanosecond
    timestamps (written in requests of their own)."""
    unwritable: list[str]
    """Why each line that `format_line` refused was left out (cannot happen for parsed input: the caller
    counts and says each, never silent)."""


def log_time_ns(second: int, seq: int, index: int) -> int:
    """The nanosecond timestamp of the `index`-th log line of the message with stream sequence `seq`: inside
    `second`, distinct for up to a million messages and a thousand log lines per message in one second."""
    return second * 1_000_000_000 + (seq % 1_000_000) * 1_000 + index % 1_000


class Bodies:
    """Reads messages into `Part`s and writes their InfluxDB body, keeping what one writer learns across
    batches: the field types (`types`) and how each measurement's canonical line is spliced."""

    def __init__(self, *, compiled: bool = True) -> None:
        """`compiled`: the usual line by the compiled splice where it is built (`SPLICE`); False runs the pure
        path (tests compare the two in one process; `HPCBUS_PURE=1` switches it off for every component)."""
        self.types = FieldTypes()
        """The type each metric's `value` is written with (the registry's, else the one InfluxDB said it holds)."""
        self.splice = SPLICE if compiled else None
        """The compiled splice (`read` keeps `scan`'s items for it), or None: the pure path."""
        self._by_cluster: dict[str, dict[str, tuple[type, str, str]]] = {}
        """cluster -> `_splices`: how a canonical line of each measurement is forwarded."""
        self._node_sections: dict[str, str] = {}
        """A node-level line's tag-set text -> it with `type-id=0` ("": format such lines): `_node_section`."""
        self._unwritable: list[str] = []

    def read(
        self, data: bytes, source: Subject, *, now: int, place: str, max_future: int, summaries: bool = False
    ) -> tuple[Part, int, list[Problem]]:
        """One message's payload as a `Part` of its subject's cluster (for the compiled splice: `scan`'s
        items, canonical lines kept as text), the count of its good lines and the problems of the rest.
        `summaries`: it came on the jobs worker's subject, exactly `<cluster>.events.jobsummary` of the
        reader's cluster (the caller compares the whole subject: `<cluster>.events.x.events.jobsummary`
        parses as the same category and detail of another cluster), so its `jobsummary` events get their
        `job_summary` points (`Part.summaries`); on another events or log subject such a line is refused, and
        a `job_summary` line on any. Metric messages are not looked through."""
        cluster, category = source.cluster, source.category
        if self.splice is not None:
            scanned = scan(data, now=now, place=place, max_future=max_future)
            part, problems = Part(cluster, [], [], items=scanned.items), scanned.problems
        else:
            parsed = parse_payload(data, now=now, place=place, max_future=max_future)
            part, problems = Part(cluster, parsed.lines, parsed.texts), parsed.problems
        if category not in _METRICS and (_MARKS[0] in data or _MARKS[1] in data):
            problems = problems + _summary_points(part, place, summaries)
        return part, len(part.lines) if part.items is None else len(part.items), problems

    def forget(self) -> None:
        """A measurement is written in another type from now on (`types`): its spliced lines are made anew."""
        self._by_cluster.clear()

    def body(self, parts: list[Part], aggregate: bool) -> Body:
        """The lines to write: forwarded as they came where they are canonical, else formatted. A part the
        compiled path kept (`Part.items`) goes through the compiled splice, which takes the usual line itself
        and hands every other item to `_placer`'s Python way, in its place: the same body, byte for byte.
        `aggregate`: process lines folded per job (`aggregate_processes`), else kept one series each."""
        out: list[str] = []
        logs: list[str] = []
        unwritable: list[str] = []
        self._unwritable = unwritable
        processes: list[Line | tuple[str, str]] = []
        clusters: dict[str, str] = {}
        """The `tag` of each part the splice kept process lines of -> its cluster."""
        for part in parts:
            logs += part.summaries
            place = self._placer(part, logs, out, processes, aggregate)
            if part.items is None:
                for line, text in zip(part.lines, part.texts, strict=True):
                    place(line, text)
                continue
            tag = self._tag(part.cluster)
            if self.splice is None or tag is None:
                for item in part.items:
                    _place_item(place, item)
                continue
            clusters[tag] = part.cluster
            other = functools.partial(_place_item, place)
            self.splice(part.items, tag, self.types, aggregate, out, other, processes)
        compiled = processes and self.splice is not None and FOLD is not None
        folded = FOLD(processes, self.types, AGGS) if compiled else None  # type: ignore[misc]
        if folded is not None:  # the compiled fold, sure of every process line of the batch
            out += folded
            return Body(out, logs, unwritable)
        lines = [
            as_process(line_of(item[0]), clusters[item[1]]) if type(item) is tuple else item
            for item in processes
        ]
        for line in aggregate_processes(lines):  # type: ignore[arg-type]
            self._format_into(out, line)
        return Body(out, logs, unwritable)

    def _placer(
        self,
        part: Part,
        logs_out: list[str],
        out: list[str],
        processes: list[Line | tuple[str, str]],
        aggregate: bool,
    ) -> Callable[[Line, str], None]:
        """The pure path's way with one good line of `part` (its `Line` and its text, "" when it has none):
        into `out` (seconds), `logs_out` (log and event lines, ns) or `processes` (to aggregate)."""
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
                self._format_into(logs_out, msgspec.structs.replace(line, time=at))
                return
            if aggregate and tags.get("stype") == "process":
                processes.append(as_process(line, part.cluster))
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
        except FormatError as exc:  # cannot happen for parsed input; said by the caller, never silent
            self._unwritable.append(str(exc))


def as_process(line: Line, cluster: str) -> Line:
    """A process line as `aggregate_processes` gets it: `type-id=0` where it is node-level (InfluxDB's series
    of old), the cluster of its subject (in place, returned). The splice's `(text, tag)` of one too, where the
    compiled fold leaves the batch's process lines to the Python way."""
    tags = line.tags
    if tags.get("type") == "node":
        tags["type-id"] = INFLUX_NODE_ID
    tags["cluster"] = cluster
    return line


def _summary_points(part: Part, place: str, own_subject: bool) -> list[Problem]:
    """Each `jobsummary` event of `part` (a message from `place`) as its `job_summary` point, into
    `part.summaries`. Taken out of `part` (not stored at all) with a problem saying why: a `job_summary`
    line of any kind (that point is made here, from the jobs worker's events, and from nowhere else), a
    `jobsummary` line that did not come on its own subject (`own_subject`), and there one that is no event
    summarising this cluster's job."""
    problems: list[Problem] = []

    def keep(item: str | Line) -> bool:
        measurement = _measurement(item)
        if measurement not in _SUMMARY_MEASUREMENTS:
            return True
        kind, path = f"{measurement} line", "measurement"
        if measurement == JOB_SUMMARY_POINT:
            reason = (
                f"{JOB_SUMMARY_POINT} points are written from the jobs worker's {JOBSUMMARY} events only, "
                f"not sent (on {place})"
            )
        elif not own_subject:
            reason = (
                f"a {JOBSUMMARY} event comes on <cluster>.events.{JOBSUMMARY} only (the jobs worker's), "
                f"not on {place}"
            )
        elif isinstance(item, str) or "event" not in item.fields:
            reason = f"a {JOBSUMMARY} line is an event (a string field `event`: the summary's JSON)"
        else:
            try:
                part.summaries.append(format_line(event_point(item, part.cluster)))
                return True
            except ValueError as exc:  # a FormatError too
                reason, kind, path = str(exc), f"{JOBSUMMARY} event", "field event"
        problems.append(Problem(reason, place, 0, kind, path))
        return False

    if part.items is not None:
        part.items = [item for item in part.items if keep(item)]
    else:
        kept = [i for i, line in enumerate(part.lines) if keep(line)]
        if len(kept) < len(part.lines):
            part.lines = [part.lines[i] for i in kept]
            part.texts = [part.texts[i] for i in kept]
    return problems


def _measurement(item: str | Line) -> str:
    """The measurement of a `scan` item: a `Line`'s, or the first name of a canonical text (never escaped
    where it is one of `_SUMMARY_MEASUREMENTS`, the only names this is compared with)."""
    if isinstance(item, str):
        return item.split(",", 1)[0].split(" ", 1)[0]
    return item.measurement


def _place_item(place: Callable[[Line, str], None], item: str | Line) -> None:
    """`place` for an item `scan` kept: a canonical text is read back into its `Line` (`line_of`: what the
    pure path built for it), so the pure path's rules decide it."""
    if type(item) is str:
        place(line_of(item), item)
    else:
        place(item, "")  # type: ignore[arg-type]
