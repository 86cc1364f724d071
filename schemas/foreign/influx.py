"""InfluxDB line protocol from any InfluxDB client, normalised into ClusterCockpit lines (docs/gateway.md).

Who sends what, and what becomes of it:

- ClusterCockpit lines (cc-metric-collector's NATS/HTTP sinks, hpcbus itself): read by
  `schemas.lineprotocol.parse_payload` with its rules and repairs; an ordinary metric line is forwarded byte
  for byte when the request's precision is seconds.
- Slurm's `acct_gather_profile/influxdb` plugin: `<Field>,job=<id>,step=<signed>,task=<n|Energy|Network|
  Filesystem>,host=<node> value=<v>` (integers without `i`, steps printed signed: batch -5, extern -4,
  interactive -6). Becomes `slurm_<field>` (Task), `slurm_energy_<field>`, `slurm_fs_<field>`,
  `slurm_net_<field>` with `<field>` in snake case (`CPUUtilization` -> `cpu_utilization`, `RSS` -> `rss`,
  `ReadMB` -> `read_mb`), tags `hostname`, `type=node`, `job`, `step` (`batch`, `extern`,
  `interactive` or the step number) and, for Task lines, `task`; the value a float, as InfluxDB stores it.
  A Task line's figures are one task's, so each task is its own child below the node
  (`stype=task,stype-id=<job>.<step>.<task>`): two tasks or jobs on a node never overwrite each other, nor
  the node. Energy, Filesystem and Network lines are the node's own.
- A `value` line without a `type` tag (cc-metric-store's old form): a node-level metric (`type=node`).
- Node-level lines of every source go on in their bus form (`schemas.lineprotocol.node_level_tags`): no
  `type-id` for the node itself (Telegraf's or the collectors' `type-id=0` is dropped, or the metric store
  would keep the value below the host), the `stype` as `type-id` for a device below it.
- Telegraf and other multi-field lines: one `value` line per numeric field, named
  `<measurement>_<field>`, node level unless the line says otherwise; `host` becomes `hostname`. A string
  or boolean field cannot be a CC value: it is rejected by name, the line's numeric fields are kept. The
  device tag of Telegraf's inputs becomes a ClusterCockpit level (`telegraf_level`): `cpu=cpu0` a hwthread,
  `cpu=cpu-total` the node, an interface, block device or mount point a child below the node, as the node
  agent writes its own (`network` / `networketh0`).

Timestamps are read in the request's precision (InfluxDB's `precision=` parameter, n/u/ms/s/m/h; a missing
timestamp is the receiver's clock), cut to whole seconds (the only precision every ClusterCockpit reader
takes) and must fall in [2000-01-01, now + max_future]. A line naming another cluster in a `cluster` tag is
rejected: a request publishes only to the subjects of the cluster it was authenticated for. A measurement or
tag that `schemas.names` calls unsafe (control characters, a host or cluster tag that is not a name, two host
tags naming two hosts) is refused, also in a foreign line, with `parse_payload`'s reason.

Limits (a Telegraf line's fields each become a measurement, so one 90 kB line of 10,000 fields was 10,000 new
InfluxDB measurements): a line of more than `schemas.names.FIELDS_MAX` (1,000) fields is refused whole, by
`parse_payload`, as at every entry; a request introduces at most `NEW_MEASUREMENTS_MAX` (2,000) distinct
measurements that the metric registry does not declare, and the values of further new ones are refused
(their lines named), while the values of measurements already introduced, or declared, still go. A name made
of a measurement and a field key (`cpu` + `usage_user`) follows the measurement rule of `schemas.names`
(no control character, `/`, `.`, `*`, `>` or white space): a field key holding one refuses its line.

Nothing is dropped silently: every line that is not published is a `Problem` with its line number, and the
good lines of the same request are kept.
"""

from __future__ import annotations

import re

import msgspec
from line_protocol_parser import LineFormatError, parse_line

from hpcbus.schemas import subjects
from hpcbus.schemas.ccbackend import start_job_names_of
from hpcbus.schemas.lineprotocol import (
    KINDS,
    STYPE_DISK,
    STYPE_FILESYSTEM,
    STYPE_NETWORK,
    STYPE_TASK,
    TYPES,
    Line,
    format_line,
    node_level_tags,
    parse_payload,
)
from hpcbus.schemas.lineprotocol.timestamps import DEFAULT_MAX_FUTURE, EARLIEST, out_of_window
from hpcbus.schemas.metrics import BY_NAME
from hpcbus.schemas.names import fields_problem, measurement_problem, shown, tags_problem
from hpcbus.schemas.problems import FORBIDDEN, Problem
from hpcbus.schemas.translate import format_shared

PRECISIONS: dict[str, tuple[int, int]] = {
    "": (1, 1_000_000_000),
    "n": (1, 1_000_000_000),
    "ns": (1, 1_000_000_000),
    "u": (1, 1_000_000),
    "us": (1, 1_000_000),
    "ms": (1, 1_000),
    "s": (1, 1),
    "m": (60, 1),
    "h": (3600, 1),
}
"""InfluxDB precision names (1.x `/write`: n, u, ms, s, m, h; 2.x: ns, us, ms, s; none = ns) -> (multiply,
divide) giving seconds."""

SLURM_STEPS = {"-5": "batch", "-4": "extern", "-6": "interactive", "-3": "pending"}
"""Slurm's special step ids as the profile plugin prints them (signed 32 bit); the unsigned forms are
accepted too."""
SLURM_STEPS.update({str(2**32 + int(k)): v for k, v in list(SLURM_STEPS.items())})

NEW_MEASUREMENTS_MAX = 2000
"""Most distinct measurements one request may introduce that the metric registry does not declare (`normalise`'s
`new`). A Telegraf agent's batch (1,000 lines by default) from a node running every input an HPC node has
(`cpu`, `mem`, `disk`, `diskio`, `net`, `kernel_vmstat`'s ~190 fields, `nstat`'s ~300, `infiniband`,
`nvidia_smi`, `lustre2`, `procstat`) makes about 800 measurements of its fields, a database server's `mysql`
inputs some 1,000 more; cc-metric-collector's and Slurm's profile plugin's few hundred are fewer. Each new
measurement is a new series set in InfluxDB, kept for the retention period: 2,000 bounds what one request
adds, far above what a real writer needs."""

SLURM_GROUPS = {"Energy": "energy_", "Filesystem": "fs_", "Network": "net_"}
"""The plugin's `task=` values that name a node-level group instead of a task, and their name prefix."""

HWTHREAD = "hwthread"
TELEGRAF_DEVICES: dict[str, tuple[str, str, str]] = {
    "cpu": ("cpu", HWTHREAD, "cpu-total"),
    "net": ("interface", STYPE_NETWORK, "all"),
    "diskio": ("name", STYPE_DISK, ""),
    "disk": ("path", STYPE_FILESYSTEM, ""),
}
"""Telegraf input (its measurement) -> (the tag naming its device, the ClusterCockpit level of a device, the
tag's value that means the whole node). Telegraf's `cpu` says `cpu=cpu0` .. `cpu=cpu<n>` and `cpu=cpu-total`,
`net` `interface=<name>` (and `interface=all` for the node's protocol counters), `diskio` `name=<device>`,
`disk` `path=<mount point>` (with `device`, `fstype` and `mode` beside it); `mem` names no device. The metric
store reads only `type`, `type-id`, `stype` and `stype-id`, so without this every CPU, interface and disk of a
node was stored at the host, each overwriting the last (issue 32)."""

_CPU_ID = re.compile(r"cpu([0-9]+)")
_SLURM_TAGS = frozenset({"job", "step", "task"})
_TRAILING_TS = re.compile(r"(?<= )(\d+)(?=[ \t\r]*$)", re.M)
_LONG_TS = re.compile(r"(?<= )(\d{10,})(?=[ \t\r]*$)", re.M)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_NUMBER = (int, float)


class Normalised(msgspec.Struct):
    """One request's lines: what to publish and what was refused."""

    lines: list[Line]
    texts: list[str]
    """`texts[i]` is the line protocol of `lines[i]` (the received text when that already is it)."""
    problems: list[Problem]
    received: int
    """Input lines (blank lines and comments not counted)."""

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def rejected(self) -> int:
        """Input lines not published (each has at least one error)."""
        return len({p.line for p in self.problems if p.severity == "error"})


def snake(name: str) -> str:
    """`CPUUtilization` -> `cpu_utilization`, `ReadMB` -> `read_mb`, `RSS` -> `rss`."""
    return _CAMEL.sub("_", name).lower()


def slurm_measurement(field: str, task: str) -> str:
    """The CC measurement of one Slurm profile field (`RSS`, task `0` -> `slurm_rss`; `Power`, task
    `Energy` -> `slurm_energy_power`)."""
    if task.isdigit():
        return "slurm_" + snake(field)
    return "slurm_" + SLURM_GROUPS.get(task, snake(task) + "_") + snake(field)


def telegraf_level(measurement: str, tags: dict[str, str]) -> None:
    """Put the device tag of a Telegraf line (`TELEGRAF_DEVICES`) into ClusterCockpit's level tags, in place:
    `cpu=cpu0` -> `type=hwthread,type-id=0`; `cpu=cpu-total`, `interface=all` -> the node (the tag dropped);
    `interface=eth0` -> `stype=network,stype-id=eth0` (and `diskio`'s `name`, `disk`'s `path` alike), which
    `node_level_tags` puts below the node as the node agent's devices (`network` / `networketh0`). A line that
    names its level already (`type` or `stype`), or a device value of another form, is left as it is."""
    spec = TELEGRAF_DEVICES.get(measurement)
    if spec is None or "type" in tags or "stype" in tags:
        return
    tag, level, whole = spec
    value = tags.get(tag)
    if value is None:
        return
    if level == HWTHREAD:
        m = _CPU_ID.fullmatch(value)
        if m is not None:
            tags["type"] = HWTHREAD
            tags["type-id"] = str(int(m[1]))
        elif value != whole:
            return
    elif value != whole:
        tags["stype"] = level
        tags["stype-id"] = value
    del tags[tag]


def normalise(
    body: bytes | str,
    *,
    precision: str,
    cluster: str,
    now: int,
    place: str = "",
    max_future: int = DEFAULT_MAX_FUTURE,
    new: set[str] | None = None,
) -> Normalised:
    """Every line of one request body. `precision` is a key of `PRECISIONS` (KeyError otherwise), `cluster`
    the cluster the request was authenticated for, `now` the receiver's clock (epoch s). `new`: the
    measurements the registry does not declare that the request introduced so far (updated; a body read in
    steps passes one set to every step, so `NEW_MEASUREMENTS_MAX` holds for the whole request)."""
    mul, div = PRECISIONS[precision]
    latest = now + max_future
    problems: list[Problem] = []
    blank: set[int] = set()
    text = _decode(body, place, problems, blank)
    # The window is checked here, in the declared precision: parse_payload reads a unit by magnitude, and a
    # time after 2128 in seconds (2200 sent with precision=s, or converted from ns) would be read as ms.
    outside: list[tuple[int, str]] = []  # (offset in text, reason)
    named = precision or "ns"

    def check(m: re.Match[str], seconds: int) -> None:
        if not EARLIEST <= seconds <= latest:
            outside.append((m.start(), out_of_window(int(m[1]), seconds, latest, named)))

    if mul != 1 or div != 1:

        def to_seconds(m: re.Match[str]) -> str:
            seconds = int(m[1]) * mul // div
            check(m, seconds)
            return str(seconds)

        original = text
        text = _TRAILING_TS.sub(to_seconds, text)
    else:
        original = text
        for m in _LONG_TS.finditer(text):  # 10+ digits: from 2001 in seconds, so whatever a future is
            check(m, int(m[1]))
    number = 1
    counted = 0
    for start, reason in outside:  # in text order: count the newlines once
        number += original.count("\n", counted, start)
        counted = start
        problems.append(Problem(reason, place, number, "lp", "timestamp"))
        blank.add(number)
    if ",cluster=" in text:
        for number, raw in enumerate(text.split("\n"), 1):
            if ",cluster=" in raw and (other := _other_cluster(raw, cluster)):
                problems.append(
                    Problem(
                        f"cluster {other!r}: this request may publish for {cluster!r} only",
                        place,
                        number,
                        "lp",
                        "tag cluster",
                        code=FORBIDDEN,
                    )
                )
                blank.add(number)
    if blank:
        rows = text.split("\n")
        for number in blank:
            rows[number - 1] = ""
        text = "\n".join(rows)

    parsed = parse_payload(text, now=now, place=place, max_future=max_future)
    lines, texts = parsed.lines, parsed.texts
    errors = {p.line for p in parsed.problems if p.severity == "error"}
    rows = text.split("\n") if errors else []
    extra_lines: list[Line] = []
    extra_numbers: list[int] = []
    replaced: set[int] = set()
    for number in sorted(errors):
        foreign = _foreign(rows[number - 1], now, latest, place, number)
        if foreign is not None:
            replaced.add(number)
            extra_lines.extend(foreign[0])
            extra_numbers.extend([number] * len(foreign[0]))
            problems.extend(foreign[1])
    problems.extend(p for p in parsed.problems if p.line not in replaced)

    # `parse_payload` keeps every line that has no error, in order: the n-th kept line is the n-th without one
    numbers = [
        n
        for n, raw in enumerate(text.split("\n"), 1)
        if n not in errors and (s := raw.strip()) and not s.startswith("#")
    ]
    if any(line.kind != "metric" for line in lines):
        lines, texts, numbers = _check_non_metrics(lines, texts, numbers, cluster, place, problems)
    if extra_lines:  # a Telegraf line's values share its tag dict: escape the tags once (`format_shared`)
        lines = lines + extra_lines
        texts = texts + [t[:-1] for t in format_shared(extra_lines)]
        numbers = numbers + extra_numbers
    lines, texts = _within_new(lines, texts, numbers, set() if new is None else new, place, problems)
    texts = [t or format_line(line) for t, line in zip(texts, lines, strict=True)]
    problems.sort(key=lambda p: p.line)
    received = sum(1 for raw in text.split("\n") if (s := raw.strip()) and s[0] != "#") + len(blank)
    return Normalised(lines, texts, problems, received)


def _decode(body: bytes | str, place: str, problems: list[Problem], blank: set[int]) -> str:
    """The body as text; lines that are not UTF-8 become empty lines and problems (the others are kept)."""
    if isinstance(body, str):
        return body
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        pass
    rows: list[str] = []
    for number, raw in enumerate(body.split(b"\n"), 1):
        try:
            rows.append(raw.decode("utf-8"))
        except UnicodeDecodeError as exc:
            problems.append(Problem(f"not UTF-8 ({exc.reason} at byte {exc.start})", place, number, "lp"))
            blank.add(number)
            rows.append("")
    return "\n".join(rows)


def _other_cluster(raw: str, cluster: str) -> str:
    """The line's `cluster` tag when it names another cluster, else ""."""
    try:
        value = parse_line(raw.strip())["tags"].get("cluster", "")
    except LineFormatError:
        return ""  # parse_payload reports the syntax
    return value if value and value != cluster else ""


def _check_non_metrics(
    lines: list[Line],
    texts: list[str],
    numbers: list[int],
    cluster: str,
    place: str,
    problems: list[Problem],
) -> tuple[list[Line], list[str], list[int]]:
    """Events and logs need a measurement that is a subject token; controls are request/reply, never stored:
    a request cannot publish them. `numbers[i]` is the line number of `lines[i]`."""
    kept_lines: list[Line] = []
    kept_texts: list[str] = []
    kept_numbers: list[int] = []
    for number, line, line_text in zip(numbers, lines, texts, strict=True):
        kind = line.kind
        reason = ""
        if kind == "control":
            reason = (
                "control lines are request/reply (`<cluster>.control.get|put`); the gateway stores data only"
            )
        elif kind != "metric":
            try:
                (subjects.events if kind == "event" else subjects.log)(cluster, line.measurement)
            except subjects.SubjectError as exc:
                reason = str(exc)
        path = "measurement"
        if not reason and line.measurement == "job" and line.tags.get("function") == "start_job":
            path, reason = _start_job_names(line)
        if reason:
            problems.append(Problem(reason, place, number, f"lp {kind}", path))
            continue
        kept_lines.append(line)
        kept_texts.append(line_text)
        kept_numbers.append(number)
    return kept_lines, kept_texts, kept_numbers


def _within_new(
    lines: list[Line],
    texts: list[str],
    numbers: list[int],
    new: set[str],
    place: str,
    problems: list[Problem],
) -> tuple[list[Line], list[str]]:
    """The lines without the values of measurements beyond the `NEW_MEASUREMENTS_MAX` new ones (not in the
    metric registry, not in `new`, which is updated) a request may introduce, taken in line order; one
    problem per line that lost values to the limit."""
    over: dict[int, list[str]] = {}
    drop: set[int] = set()
    for i in sorted(range(len(lines)), key=numbers.__getitem__):
        name = lines[i].measurement
        if name in new or name in BY_NAME:
            continue
        if len(new) < NEW_MEASUREMENTS_MAX:
            new.add(name)
            continue
        drop.add(i)
        over.setdefault(numbers[i], []).append(name)
    if not drop:
        return lines, texts
    for number, names in over.items():
        reason = (
            f"{len(names)} new measurement{'s' if len(names) > 1 else ''} ({shown(names[0])}"
            f"{', ...' if len(names) > 1 else ''}) beyond the {NEW_MEASUREMENTS_MAX} one request may introduce "
            "(the metric registry's do not count); not published"
        )
        problems.append(Problem(reason, place, number, "lp metric", "measurement"))
    return (
        [line for i, line in enumerate(lines) if i not in drop],
        [t for i, t in enumerate(texts) if i not in drop],
    )


def _start_job_names(line: Line) -> tuple[str, str]:
    """`("event <path>", reason)` when a start_job names an unsafe cluster, host, user or job name (cc-backend
    keys its jobs and metric queries on them), else ("", "")."""
    found = start_job_names_of(str(line.fields["event"]))
    return (f"event {found[0]}", found[1]) if found is not None else ("", "")


def _foreign(
    raw: str, now: int, latest: int, place: str, number: int
) -> tuple[list[Line], list[Problem]] | None:
    """A line ClusterCockpit's rules refused, read as a foreign producer's; None when it is not of a known
    foreign form (the CC problem stands)."""
    try:
        d = parse_line(raw.strip())
    except LineFormatError:
        return None
    tags: dict[str, str] = d["tags"]
    fields: dict[str, object] = d["fields"]
    measurement: str = d["measurement"]
    kinds = [k for k in KINDS if k in fields]
    if kinds and (kinds != ["value"] or len(fields) != 1 or "type" in tags):
        return None
    if tags_problem(measurement, tags) is not None or fields_problem(fields) is not None:
        return None  # parse_payload's problem (the same check) stands
    host = tags.pop("hostname", "") or tags.pop("host", "")
    tags.pop("host", None)
    problems: list[Problem] = []

    def problem(path: str, reason: str) -> None:
        problems.append(Problem(reason, place, number, "lp metric", path))

    ts = d["time"]
    if ts is None:
        ts = now
    elif not EARLIEST <= ts <= latest:
        problem("timestamp", out_of_window(ts, ts, latest) if ts >= 0 else f"negative timestamp {ts}")
        return [], problems
    if kinds:  # one `value` and no type: Slurm's profile plugin, or a node-level metric without its tags
        value = fields["value"]
        if type(value) not in _NUMBER:
            return None
        if not host:
            return None
        if tags.keys() >= _SLURM_TAGS:
            task = tags.pop("task")
            step = tags.pop("step")
            job = tags.pop("job")
            out = {"hostname": host, "type": "node", **tags, "job": job}
            out["step"] = step = SLURM_STEPS.get(step, step)
            if task.isdigit():  # a task's figures (not the node's Energy/Filesystem/Network): one child each
                out["task"] = task
                out["stype"] = STYPE_TASK
                out["stype-id"] = f"{job}.{step}.{task}"
            node_level_tags(out)
            name = slurm_measurement(measurement, task)
            reason = measurement_problem(name)
            if reason is not None:
                problem("tag task", reason)
                return [], problems
            return [Line(name, out, {"value": float(value)}, ts)], []  # type: ignore[arg-type]
        telegraf_level(measurement, tags)
        out = {"hostname": host, "type": "node", **tags}
        if out["type"] == "node":
            node_level_tags(out)
        return [Line(measurement, out, fields, ts)], []  # type: ignore[arg-type]
    if not host:
        problem("tag hostname", "a metric needs a host or hostname tag")
        return [], problems
    telegraf_level(measurement, tags)
    level = tags.setdefault("type", "node")
    if level not in TYPES:
        problem("tag type", f"unknown type {level!r} (node, socket, ..., hwthread, accelerator)")
        return [], problems
    if level == "node":
        node_level_tags(tags)
    elif "type-id" not in tags:
        problem("tag type-id", f"type={level} needs a type-id")
        return [], problems
    tags["hostname"] = host
    lines: list[Line] = []
    refused: list[str] = []
    for key, value in fields.items():
        if type(value) in _NUMBER and -(2**63) <= value < 2**64:  # type: ignore[operator]
            name = f"{measurement}_{key}"
            reason = measurement_problem(name)
            if reason is not None:  # a field key that is no name (`usage.user`, `a/b`): the line is refused
                problem(f"field {key}", reason)
                return [], problems
            lines.append(Line(name, tags, {"value": value}, ts))  # type: ignore[dict-item]
        else:
            refused.append(key)
    for (
        key
    ) in refused:  # a warning while the line's numbers went out (Telegraf's `uptime_format`), else an error
        reason = f"a {type(fields[key]).__name__} cannot be a ClusterCockpit metric value; not published"
        problems.append(
            Problem(reason, place, number, "lp metric", f"field {key}", "warning" if lines else "error")
        )
    return lines, problems
