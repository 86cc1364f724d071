"""Reading a NATS payload of line protocol: every good line is kept, every bad line becomes a `Problem`.

cc-metric-store and cc-lib drop the rest of a message after one bad line; hpcbus never does. A payload may
hold blank lines, `#` comments, CRLF line ends and a trailing newline. Syntax comes from
`line_protocol_parser` (C); the ClusterCockpit rules (one kind field, mandatory tags, levels) are checked here.

Accepted with a warning, and rewritten to the canonical form:
- the CC spec's own examples with an unquoted string (`event={"jobId": 69, ...}`, `control=intel.pkg...`);
- cc-lib's `start_job`/`stop_job` measurements (cc-backend reads `job,function=start_job`);
- `host=` instead of `hostname=` (cc-metric-store reads both);
- a node-level metric line is read in its bus form (`model.node_level_tags`): the node itself has no
  `type-id` (a `type-id=0` is dropped), a device below it (`stype`) has the sub-type's name as `type-id`;
  silently, as the metric store would otherwise keep the value below the host (docs/mapping.md section 3).
  Events, logs and controls of `type=node` without a `type-id` get `type-id=0` (the spec recommends it).

Refused (a Problem with the line number, the line is not kept): a measurement, tag or field that
`schemas.names` calls unsafe (a control or escape character, an over-long value, a host, cluster or job tag
that is not a name, such as `hostname=../x`, host tags naming two hosts, a measurement, event class or log
component holding `/`, `.`, `*`, `>` or white space, a `type-id` or `stype` that is no device id such as
`type-id=../../x`, more than `names.FIELDS_MAX` fields), a field key given twice (`value=1,value=2`:
readers disagree on which one wins), and, when the caller gives `max_future`, a timestamp outside
[2000-01-01, now + max_future] after reading its unit by magnitude (`schemas.lineprotocol.timestamps`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import msgspec
from line_protocol_parser import LineFormatError, parse_line

from hpcbus.schemas.lineprotocol.model import CONTROL_METHODS, KINDS, LOG_LEVELS, TYPES, Line, node_level_tags
from hpcbus.schemas.lineprotocol.timestamps import EARLIEST, out_of_window, to_seconds
from hpcbus.schemas.names import (
    DEVICE_ID_MAX,
    TAG_VALUE_MAX,
    fields_problem,
    is_host,
    measurement_problem,
    tag_set_problem,
    tags_problem,
)
from hpcbus.schemas.problems import Problem


class Parsed(msgspec.Struct):
    """The good lines of a payload, in order, and one problem per bad (or repaired) line.

    `texts[i]` is `lines[i]` as it arrived when that text is already what `format_line` means (an ordinary
    metric line with a seconds timestamp), else "": a writer can forward it instead of formatting again.
    """

    lines: list[Line]
    problems: list[Problem]
    texts: list[str] = msgspec.field(default_factory=list)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]


# `head key=unquoted text [timestamp]` — the spec's event/control/log examples.
_UNQUOTED = re.compile(
    r"^(?P<head>(?:[^ \\]|\\.)+) +(?P<key>event|control|log)=(?P<val>[^\"].*?)(?: +(?P<ts>-?\d+))?$"
)
_CCLIB_JOB = {"start_job", "stop_job"}


def _lenient(text: str) -> tuple[dict, str] | None:
    """The spec's unquoted-string form, parsed; None when the line is not of that form."""
    m = _UNQUOTED.match(text)
    if m is None:
        return None
    try:
        head = parse_line(m["head"] + " x=0")
    except LineFormatError:
        return None
    head["fields"] = {m["key"]: m["val"]}
    head["time"] = int(m["ts"]) if m["ts"] else None
    return head, f"unquoted {m['key']} string (as in the ClusterCockpit spec example); read as a string"


def _check(
    d: dict, now: int, latest: int, kind_out: list[str]
) -> tuple[Line | None, str, str, list[tuple[str, str]]]:
    """(line or None, path, reason, warnings). Fills kind_out[0] with the kind for the problem label."""
    fields: dict = d["fields"]
    tags: dict = d["tags"]
    what = "event class" if "event" in fields else "log component" if "log" in fields else "measurement"
    unsafe = tags_problem(d["measurement"], tags, what) or fields_problem(fields)
    if unsafe is not None:
        return None, unsafe[0], unsafe[1], []
    warnings: list[tuple[str, str]] = []
    key = None
    for candidate in KINDS:
        if candidate in fields:
            if key is not None:
                return (
                    None,
                    f"field {candidate}",
                    f"a line carries one kind field, found {key} and {candidate}",
                    [],
                )
            key = candidate
    if key is None:
        return None, "fields", f"no value/event/log/control field (found {', '.join(fields)})", []
    kind = KINDS[key]
    kind_out[0] = kind
    value = fields[key]
    if len(fields) > 1:
        extra = ", ".join(k for k in fields if k != key)
        warnings.append((f"field {extra}", "extra fields are ignored by ClusterCockpit; kept"))
    if "host" in tags and "hostname" not in tags:
        tags["hostname"] = tags.pop("host")
        warnings.append(("tag host", "renamed to hostname"))
    measurement: str = d["measurement"]
    if kind == "metric":
        vt = type(value)
        if vt is not float and vt is not int:
            return (
                None,
                "field value",
                f"a metric value must be a number, got {type(value).__name__}",
                warnings,
            )
        level = tags.get("type")
        if not tags.get("hostname"):
            if level is None:  # both said at once: a fix of one must not reveal the other in a second run
                return (
                    None,
                    "tags hostname, type",
                    "a metric needs a hostname tag and a type tag (node, socket, ..., hwthread, accelerator)",
                    warnings,
                )
            return None, "tag hostname", "a metric needs a hostname tag", warnings
        if level is None:
            return (
                None,
                "tag type",
                "a metric needs a type tag (node, socket, ..., hwthread, accelerator)",
                warnings,
            )
    else:
        if type(value) is not str:
            return None, f"field {key}", f"an {kind} field must be a string", warnings
        level = tags.get("type")
        if kind == "event" and measurement in _CCLIB_JOB:
            tags["function"] = measurement
            measurement = "job"
            warnings.append(("measurement", f"cc-lib form {d['measurement']}; rewritten as job,function=..."))
        elif kind == "control":
            method = tags.get("method")
            if method not in CONTROL_METHODS:
                return None, "tag method", f"a control needs method=GET or PUT, got {method!r}", warnings
        elif kind == "log" and tags.get("loglevel") not in LOG_LEVELS:
            warnings.append(
                ("tag loglevel", f"should be one of debug, info, warn, error; got {tags.get('loglevel')!r}")
            )
    if level is not None:
        if level not in TYPES:
            return (
                None,
                "tag type",
                f"unknown type {level!r} (node, socket, die, memoryDomain, llc, core, hwthread, accelerator)",
                warnings,
            )
        if level == "node" and kind == "metric":
            node_level_tags(tags)
        elif "type-id" not in tags:
            if level != "node":
                return None, "tag type-id", f"type={level} needs a type-id", warnings
            tags["type-id"] = "0"
    ts = d["time"]
    if ts is None:
        ts = now
    elif ts < 0:
        return None, "timestamp", f"negative timestamp {ts}", warnings
    else:
        seconds = to_seconds(ts)
        if latest != _UNBOUNDED and not EARLIEST <= seconds <= latest:
            return None, "timestamp", out_of_window(ts, seconds, latest), warnings
        ts = seconds
    return Line(measurement, tags, fields, ts), "", "", warnings


_UNBOUNDED = 2**64
"""`latest` when the caller gave no `max_future`: no window (tests, benchmarks, files of any age)."""


def parse_payload(
    payload: bytes | str, *, now: int, place: str = "", max_future: int | None = None
) -> Parsed:
    """All lines of one message or file. `now` (epoch s) stands in for missing timestamps.

    With `max_future` (seconds; `timestamps.DEFAULT_MAX_FUTURE` is what the workers use), `now` must be the
    reader's clock: a timestamp before 2000-01-01 or later than `now + max_future` (read by magnitude as
    s/ms/us/ns) is a Problem. Without it, any non-negative timestamp is taken.
    """
    latest = latest_of(now, max_future)
    if isinstance(payload, bytes):
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError:
            return _parse_undecodable(payload, now, place, latest)
    else:
        text = payload
    return _parse_text(text, now, place, 0, latest)


def latest_of(now: int, max_future: int | None) -> int:
    """The latest timestamp (seconds) a line may carry: `now + max_future`, or no bound without one."""
    return _UNBOUNDED if max_future is None else now + max_future


def seconds_window(latest: int) -> tuple[int, int]:
    """`[earliest, end)`: the seconds timestamps a canonical line keeps as it came (its `Parsed.texts`
    entry is its text), for `latest` from `latest_of`; other timestamps are read by magnitude and
    formatted again, or refused."""
    if latest == _UNBOUNDED:
        return 0, _SECONDS_LIMIT
    return EARLIEST, min(latest + 1, _SECONDS_LIMIT)


def parse_numbered(
    raw: bytes, number: int, *, now: int, place: str, latest: int, plain: bool = False
) -> Parsed:
    """Line `number` (1-based) of a payload, alone: what `parse_payload` of the whole payload makes of that
    line (each line is read on its own; a payload's names found valid are only remembered for speed), given
    whether the whole payload is `_plain_ascii` (then a CRLF line keeps its text: `Parsed.texts`). For the
    lines the compiled scan (`schemas.lineprotocol.scan`) leaves to the pure path."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Parsed([], [Problem(f"not UTF-8 ({exc.reason} at byte {exc.start})", place, number, "lp")], [])
    return _parse_text(text, now, place, number - 1, latest, plain or None)


CompiledRead = Callable[[bytes, int, int], tuple[list[Any], int, bool]]
"""A C reader's call (`_scan.scan`, `_place.read`): (payload, earliest, end) -> (per non-empty line, what it
took or its line number; how many line numbers; whether the payload is `_plain_ascii`)."""


def read_with_rest(
    read: CompiledRead,
    payload: bytes,
    keep: Callable[[Line, str], Any],
    *,
    now: int,
    place: str,
    max_future: int | None,
) -> tuple[list[Any], list[Problem]]:
    """What a C reader took of `payload`, in order, with each line it left (its line number) read by the pure
    path alone (`parse_numbered`) in its place: `keep(line, text)` of each line that keeps; and the problems of
    those lines. The one merge of the compiled readers (`scan.scan_compiled`, `translate.lp_read`)."""
    latest = latest_of(now, max_future)
    earliest, end = seconds_window(latest)
    found, rest, plain = read(payload, earliest, end)
    if not rest:
        return found, []
    raw = payload.split(b"\n")
    items: list[Any] = []
    problems: list[Problem] = []
    for item in found:
        if type(item) is not int:
            items.append(item)
            continue
        part = parse_numbered(raw[item - 1], item, now=now, place=place, latest=latest, plain=plain)
        problems.extend(part.problems)
        items.extend(map(keep, part.lines, part.texts))
    return items, problems


def _parse_undecodable(payload: bytes, now: int, place: str, latest: int) -> Parsed:
    """Bytes that are not all UTF-8: decode line by line so only the bad lines are lost."""
    out = Parsed([], [], [])
    for number, raw in enumerate(payload.split(b"\n"), 1):
        part = parse_numbered(raw, number, now=now, place=place, latest=latest)
        out.lines.extend(part.lines)
        out.problems.extend(part.problems)
        out.texts.extend(part.texts)
    return out


_NUMBER_TYPES = (float, int)
_SKIP_FIRST = frozenset(" \t\r#")
_SECONDS_LIMIT = 5_000_000_000
_NS_FROM = 5_000_000_000_000_000  # `to_seconds` reads from here on as ns
_NS = 1_000_000_000
_INT64_END = 2**63


def _parse_text(
    text: str, now: int, place: str, offset: int, latest: int, plain: bool | None = None
) -> Parsed:
    lines: list[Line] = []
    problems: list[Problem] = []
    texts: list[str] = []
    append = lines.append
    append_text = texts.append
    types = TYPES
    # names of this payload already found valid (a node's lines repeat one host, cluster and job)
    hosts: set[str] = set()
    clusters: set[str] = set()
    jobs: set[str] = set()
    measurements: set[str] = set()
    ids: set[str] = set()  # `type-id` and `stype` values
    tag_max = TAG_VALUE_MAX
    if plain is None:
        plain = _plain_ascii(text)
    # The fast path takes seconds and nanoseconds inside the window; ms, us and the rest go the slow way.
    s_lo, s_hi = seconds_window(latest)
    if latest == _UNBOUNDED:
        ns_lo, ns_hi = _NS_FROM, _INT64_END
    else:
        ns_lo, ns_hi = max(EARLIEST * _NS, _NS_FROM), min((latest + 1) * _NS, _INT64_END)
    for number, raw in enumerate(text.split("\n"), offset + 1):
        if not raw or raw[0] in _SKIP_FIRST:
            raw = raw.strip()
            if not raw or raw[0] == "#":
                continue
        try:
            d = parse_line(raw)
        except LineFormatError as exc:
            alt = _lenient(raw.strip())
            if alt is None:
                problems.append(Problem(f"syntax: {exc}", place, number, "lp", "line"))
                continue
            _slow(alt[0], alt[1], "", now, latest, place, number, lines, problems, texts)
            continue
        # Fast path: the ordinary metric line (one numeric `value`, hostname, known level, timestamp in the
        # window). The parser keeps one of two equal field keys, so a second `value=` (`value=1,value=2`)
        # sends the line to the slow path, which looks for repeated keys (an unescaped `,value=` can only be
        # a field there, or an odd tag key `value`, which the slow path then takes). Names: a printable
        # line (`plain`: the whole payload is) shorter than a tag's limit holds no control character and no
        # over-long tag; its hostname is checked once per payload, other name tags by `_names_ok` (the
        # slow path says what is wrong).
        fields = d["fields"]
        if len(fields) == 1 and len(raw) <= tag_max and (plain or raw.isprintable()):
            value = fields.get("value")
            if value is not None and type(value) in _NUMBER_TYPES:
                tags = d["tags"]
                level = tags.get("type")
                # a node-level line arrives in its bus form (kept as text) or is put in it (formatted)
                as_sent = (
                    not node_level_tags(tags) if level == "node" else level in types and "type-id" in tags
                )
                host = tags.get("hostname")
                measurement = d["measurement"]
                if (
                    (as_sent or level == "node")
                    and host
                    and (host in hosts or _host_ok(host, hosts))
                    and (measurement in measurements or _measurement_ok(measurement, measurements))
                    and (
                        len(tags) == 2  # hostname and type: nothing else to check
                        or (len(tags) == 3 and _device_id_ok(tags.get("type-id", "/"), ids))
                        or (  # a cluster's device line, the most common shape of all
                            len(tags) == 4
                            and tags.get("cluster") in clusters
                            and _device_id_ok(tags.get("type-id", "/"), ids)
                        )
                        or _names_ok(tags, clusters, jobs, ids)
                    )
                ):
                    ts = d["time"]
                    if ts is not None and ",value=" not in raw:
                        if s_lo <= ts < s_hi:
                            append(Line(measurement, tags, fields, ts))
                            append_text(
                                "" if not as_sent else raw if raw[-1] not in _SKIP_FIRST else raw.rstrip()
                            )
                            continue
                        if ns_lo <= ts < ns_hi:
                            append(Line(measurement, tags, fields, ts // _NS))
                            append_text("")
                            continue
        _slow(d, "", raw, now, latest, place, number, lines, problems, texts)
    return Parsed(lines, problems, texts)


_NOT_CONTROL = bytes(range(0x20, 0x7F))


def _plain_ascii(text: str) -> bool:
    """True when `text` is ASCII without control characters other than line ends (`\n`, CRLF's `\r`): then
    every line of it is printable, which the fast path would otherwise ask line by line (4x the cost)."""
    if not text.isascii():
        return False
    if text.encode("ascii").translate(None, _NOT_CONTROL).translate(None, b"\r\n"):
        return False
    return "\r" not in text or text.count("\r") == text.count("\r\n")


def _host_ok(host: str, hosts: set[str]) -> bool:
    if is_host(host):
        hosts.add(host)
        return True
    return False


def _measurement_ok(measurement: str, measurements: set[str]) -> bool:
    if measurement_problem(measurement) is None:
        measurements.add(measurement)
        return True
    return False


def _device_id_ok(value: str, ids: set[str]) -> bool:
    """A `type-id` known valid: seen valid in this payload, or a number (an hwthread's, a socket's: most
    lines; a run of ASCII digits is always a device id, so the fast path need not learn each of 128 CPUs'
    ids in every payload through `tag_set_problem`)."""
    return value in ids or (value.isdigit() and value.isascii() and len(value) <= DEVICE_ID_MAX)


def _names_ok(tags: dict[str, str], clusters: set[str], jobs: set[str], ids: set[str]) -> bool:
    """The fast path's check of the name tags beside a valid `hostname`, with the payload's cluster names, job
    ids and device ids (`type-id`, `stype`) already found valid (False: let the slow path explain). Written
    out for speed: it runs for every line with more than the three mandatory tags. The host tags other than
    `hostname` are `schemas.names.HOST_TAGS`', the device tags `DEVICE_TAGS` (tests/test_names.py holds the
    lists together)."""
    cluster = tags.get("cluster")
    job = tags.get("job")
    type_id = tags.get("type-id")
    stype = tags.get("stype")
    if (
        (cluster is None or cluster in clusters)
        and (job is None or job in jobs)
        and (type_id is None or _device_id_ok(type_id, ids))
        and (stype is None or stype in ids)
        and "host" not in tags
        and "node" not in tags
        and "nodename" not in tags
    ):
        return True
    if tag_set_problem(tags) is not None:
        return False
    if cluster is not None:
        clusters.add(cluster)
    if job is not None:
        jobs.add(job)
    if type_id is not None:
        ids.add(type_id)
    if stype is not None:
        ids.add(stype)
    return True


def _slow(
    d: dict,
    warn_syntax: str,
    raw: str,
    now: int,
    latest: int,
    place: str,
    number: int,
    lines: list[Line],
    problems: list[Problem],
    texts: list[str],
) -> None:
    """Every line the fast path did not take: full checks, repairs and their warnings. `raw` is the text
    the parser read ("" for a repaired line), for what its dict cannot show (a repeated field key)."""
    kind_out = ["lp"]
    repeated = _repeated_field(raw, d) if raw else None
    if repeated is not None:
        kind = "lp metric" if "value" in d["fields"] else "lp"
        problems.append(
            Problem(
                f"field key {repeated} given twice (readers disagree on which value wins)",
                place,
                number,
                kind,
                f"field {repeated}",
            )
        )
        return
    line, path, reason, warnings = _check(d, now, latest, kind_out)
    kind = "lp " + kind_out[0] if kind_out[0] != "lp" else "lp"
    if warn_syntax:
        problems.append(Problem(warn_syntax, place, number, kind, "line", "warning"))
    for wpath, wreason in warnings:
        problems.append(Problem(wreason, place, number, kind, wpath, "warning"))
    if line is None:
        problems.append(Problem(reason, place, number, kind, path))
    else:
        lines.append(line)
        texts.append("")


# The field set of a line: after the measurement and tags (no unescaped space there), `key=value` pairs,
# string values quoted with backslash escapes.
_HEAD = re.compile(r"(?:[^ \\]|\\.)+ +")
_FIELD = re.compile(r'((?:[^=\\ ,]|\\.)+)=(?:"[^"\\]*(?:\\.[^"\\]*)*"|[^ ,]*)(,?)')


def _repeated_field(raw: str, d: dict) -> str | None:
    """The first field key that `raw` gives more than once, else None. The parser keeps only one of them, so
    only a line with more `=` than its parsed tags and fields can repeat one: the scan runs for those."""
    if raw.count("=") <= len(d["tags"]) + len(d["fields"]):
        return None
    text = raw.strip()
    m = _HEAD.match(text)
    if m is None:
        return None
    pos, seen = m.end(), set()
    while (f := _FIELD.match(text, pos)) is not None:
        key = f[1]
        if key in seen:
            return key.replace("\\", "")
        seen.add(key)
        pos = f.end()
        if not f[2]:
            break
    return None
