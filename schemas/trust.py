"""What a compute node may put on the bus, as an allow-list, and the check of every host a payload names.

A node's identity is proved by the entry it came through: the broker lets a node credential publish on
`<cluster>.ingest.<own host>.>` only (`hpcbus consume ingest` reads the host from the subject), and the
gateway binds a node credential to its host names (`[clusters.<c>.credentials.<name>] hosts`). Both entries
ask this module, so a node may say the same things through either door, and nothing else:

* `<c>.metrics`: metric lines (one `value` field) of any measurement the name rules accept, except the
  measurements other roles write (`RESERVED_MEASUREMENTS`: cc-backend's and Sonar's job records, the jobs
  worker's summaries, hpcbus' own log), which InfluxDB would otherwise mix with the real ones;
* `<c>.events.<class>` for the classes of `NODE_EVENTS` only (`nodejob`, the Sonar `sample` skeleton,
  `sysinfo`, `errors`): event lines of that measurement;
* `<c>.log.<component>`: log lines of that measurement (a node's own logs), none of `RESERVED_MEASUREMENTS`
  but hpcbus' own log;
* `<c>.sonar.sample|sysinfo`: Sonar envelopes (`NODE_SONAR_KINDS`).

Everything else (cc-backend's `job` events, Sonar job and cluster records as envelopes or as `slurm` and
`cluster` events, node states, job summaries) comes from the batch-system producers and the workers only.
An allow-list: a class added to the bus later is refused from nodes until it is listed here.

Every host a line names must be the sender's: each host tag (`schemas.names.HOST_TAGS`), and inside an
event's JSON the fields a reader takes for the host (`nodejob`'s `hostname`, a Sonar envelope's
`data.attributes.node` and `errors[].node`, the skeleton's envelope likewise); every cluster it names must be
the cluster it was sent for (a `cluster` tag, the JSON's `cluster`). docs/security.md lists where.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, Literal

import msgspec

from hpcbus.schemas.jobsummary.encode import MEASUREMENT as JOBSUMMARY
from hpcbus.schemas.jobsummary.encode import MEASUREMENTS as JOBS_WORKER_LINES
from hpcbus.schemas.jobsummary.encode import POINT as JOB_SUMMARY_POINT
from hpcbus.schemas.lineprotocol import Line, format_line, parse_payload
from hpcbus.schemas.names import HOST_TAGS, has_control, shown
from hpcbus.schemas.nodejob import MEASUREMENT as NODEJOB
from hpcbus.schemas.problems import FORBIDDEN, Problem
from hpcbus.schemas.translate.bus import line_route

__all__ = [
    "JOBS_WORKER_MEASUREMENTS",
    "NODE_EVENTS",
    "NODE_SONAR_KINDS",
    "RESERVED_MEASUREMENTS",
    "Role",
    "Sender",
    "allowed_lines",
    "check_envelope",
    "check_lines",
    "envelope_claims",
    "event_claims",
    "line_problem",
    "nodejob_host_problem",
    "subject_problem",
    "summary_lines",
]

Role = Literal["node", "master"]
"""Who a credential speaks for: one or more compute nodes (this module's allow-list), or the batch-system
master (job records, cluster records, node states: everything the gateway forwards)."""

NODE_SONAR_KINDS: Final = frozenset({"sample", "sysinfo"})
"""Sonar envelopes a node sends (job and cluster records come from the batch-system producers)."""

NODE_EVENTS: Final = frozenset({NODEJOB, "sample", "sysinfo", "errors"})
"""Event classes a node sends: its job observations (`schemas.nodejob`), and the Sonar translation of its
own envelopes (`sample,function=skeleton`, `sysinfo`, an errors-only envelope's `errors`)."""

HPCBUS_LOG: Final = "hpcbus"
"""The measurement of hpcbus' own log lines (`<c>.log.hpcbus`): the node agent's too."""

RESERVED_MEASUREMENTS: Final = frozenset(
    {"job", "slurm", "cluster", "nodestate", JOBSUMMARY, JOB_SUMMARY_POINT, HPCBUS_LOG} | NODE_EVENTS
)
"""Measurements a node's metric lines may not use, nor its log lines but `hpcbus`: InfluxDB keeps a
measurement's points together whatever subject they came on, so a metric named `slurm` or a log line named
`job_summary` would sit among the Slurm records or the summaries `hpcbus report` reads. (A node's own events
and `hpcbus` log lines go on their own subjects.)"""
_RESERVED_FOR_LOGS: Final = RESERVED_MEASUREMENTS - {HPCBUS_LOG}


JOBS_WORKER_MEASUREMENTS: Final = JOBS_WORKER_LINES
"""The jobs worker's job summaries: the `jobsummary` event (on `<c>.events.jobsummary`, which only the
`worker-jobs` identity may publish on) and the `job_summary` point. `consume influx` writes the point of
every summary event into each InfluxDB copy, and `hpcbus report` and the dashboards take both as the jobs
worker's word, so no one else may send a line of either measurement, the master included."""


def summary_lines(lines: list[Line]) -> list[tuple[int, str, str]]:
    """`(index, path, reason)` of each line that names a measurement only the jobs worker writes
    (`JOBS_WORKER_MEASUREMENTS`), whatever its kind: the gateway refuses them from every credential."""
    return [
        (i, "measurement", f"{line.measurement!r} is written by the jobs worker (hpcbus consume jobs) only")
        for i, line in enumerate(lines)
        if line.measurement in JOBS_WORKER_MEASUREMENTS
    ]


class Sender(msgspec.Struct, frozen=True):
    """Who sent a message, as its entry proved it: the hosts it may speak for and the cluster it sent to."""

    hosts: frozenset[str]
    cluster: str
    name: str
    """How reasons name the credentials: the host (`n001`), or the gateway credential's name."""

    @classmethod
    def node(cls, host: str, cluster: str) -> Sender:
        """One node, named by its host (the ingest subject's)."""
        return cls(frozenset({host}), cluster, host)

    def claim(self, key: str, value: object) -> str:
        """The reason for a payload that names `key=value` where the sender may not."""
        text = (
            value
            if isinstance(value, str) and len(value) <= 40 and not has_control(value)
            else shown(str(value))
        )
        reason = f"claims {key}={text} but was published with the credentials of {self.name}"
        if key == "cluster":
            reason += f" for cluster {self.cluster}"
        return reason


def subject_problem(category: str, detail: str, who: str) -> str | None:
    """Why a node may not send on `<cluster>.<category>.<detail>`, or None when the allow-list has it."""
    if category in ("metrics", "log"):
        return None
    if category == "events" and detail in NODE_EVENTS:
        return None
    if category == "sonar" and detail in NODE_SONAR_KINDS:
        return None
    what = {"events": f"{detail} events", "sonar": f"Sonar {detail} records"}.get(category, f"on {category}")
    allowed = f"events: {', '.join(sorted(NODE_EVENTS))}; sonar: {', '.join(sorted(NODE_SONAR_KINDS))}"
    return f"{who} may not send {what}: a node may send metrics, logs, {allowed} (docs/security.md)"


def line_problem(line: Line, category: str, detail: str, sender: Sender) -> tuple[str, str] | None:
    """`(path, reason)` when `sender` may not send `line` on its subject (`category`, `detail`), else None:
    the line's kind and measurement must be what the subject carries, every host it names the sender's and
    its cluster the subject's."""
    tags = line.tags
    if "hostname" not in tags:
        return "measurement " + line.measurement, (
            f"no hostname tag; a line from the credentials of {sender.name} must name its host"
            if len(sender.hosts) > 1
            else f"no hostname tag; a line from the credentials of {sender.name} must say hostname={sender.name}"
        )
    for key in HOST_TAGS:
        if key in tags and tags[key] not in sender.hosts:
            return f"tag {key}", sender.claim(key, tags[key])
    tag_cluster = tags.get("cluster")
    if tag_cluster is not None and tag_cluster != sender.cluster:
        return "tag cluster", sender.claim("cluster", tag_cluster)
    fields = line.fields
    if category == "metrics":
        if "value" not in fields or len(fields) != 1:
            return (
                "fields",
                f"a line on {category} is a metric: one `value` field, not {', '.join(sorted(fields))}",
            )
        if line.measurement in RESERVED_MEASUREMENTS:
            return "measurement", (
                f"{line.measurement!r} is written by the batch-system producers or the workers, not by a node"
            )
        return None
    kind = {"events": "event", "log": "log"}.get(category, "")
    if kind not in fields or line.measurement != detail:
        return "measurement", (
            f"{category}.{detail} carries {kind or category} lines of measurement {detail}, "
            f"not {line.kind} {line.measurement}"
        )
    if category == "log" and line.measurement in _RESERVED_FOR_LOGS:
        # a log line is stored under its measurement with all its fields: `job_summary` with `log` and
        # summary fields would be read as a summary, `job` or `nodejob` with an `event` as a job event
        return "measurement", (
            f"{line.measurement!r} is written by the batch-system producers or the workers, not by a node "
            f"(a node's own log is `{HPCBUS_LOG}`)"
        )
    if category == "events":
        for path, key, value in event_claims(line, sender.cluster):
            if key == "event":
                return path, str(value)
            return path, sender.claim(key, value)
    return None


def event_claims(line: Line, cluster: str) -> list[tuple[str, str, object]]:
    """Each host or cluster an event's JSON names other than the line says (`(path, key, value)`): its
    `hostname` tag, its `cluster` tag or else `cluster`; `[("event", "event", reason)]` when a node event's
    JSON cannot be read. Readers take the host of a `nodejob` from its JSON (`consume jobs`) and of a Sonar
    envelope from `data.attributes.node`, so the JSON must agree with the tags (themselves checked against
    the sender)."""
    payload = line.fields.get("event")
    reader = _EVENT_READERS.get(line.measurement)
    if reader is None or not isinstance(payload, str):
        return []
    try:
        found = reader(payload)
    except (msgspec.DecodeError, RecursionError) as exc:
        return [("event", "event", f"not a {line.measurement} event: {exc}")]
    own = {"cluster": line.tags.get("cluster", cluster)}
    host = line.tags.get("hostname")
    return [(path, key, value) for path, key, value in found if value != own.get(key, host)]


class _NodeJobHosts(msgspec.Struct):
    hostname: object = None
    cluster: object = None


class _EnvelopeHosts(msgspec.Struct):
    data: dict[str, object] = msgspec.field(default_factory=dict)
    errors: list[object] = msgspec.field(default_factory=list)


class _SkeletonHosts(msgspec.Struct):
    skeleton: _EnvelopeHosts = msgspec.field(default_factory=_EnvelopeHosts)


def _nodejob_claims(payload: str) -> list[tuple[str, str, object]]:
    seen = msgspec.json.decode(payload, type=_NodeJobHosts)
    return [("event.hostname", "hostname", seen.hostname), ("event.cluster", "cluster", seen.cluster)]


def envelope_claims(
    data: dict[str, object], errors: list[object], at: str = ""
) -> list[tuple[str, str, object]]:
    """`(path, key, value)` of each node and cluster a Sonar envelope names (`data.attributes.node`,
    `.cluster`, and each error's), the paths under `at` (`event.skeleton.` for a sample skeleton)."""
    out: list[tuple[str, str, object]] = []
    attributes = data.get("attributes")
    attrs = attributes if isinstance(attributes, dict) else {}
    if data:
        out.append((f"{at}data.attributes.node", "node", attrs.get("node")))
    if "cluster" in attrs:
        out.append((f"{at}data.attributes.cluster", "cluster", attrs["cluster"]))
    for i, error in enumerate(errors):
        if isinstance(error, dict):
            out.extend(
                (f"{at}errors[{i}].{key}", key, error[key]) for key in ("node", "cluster") if key in error
            )
    return out


def _envelope_event_claims(payload: str) -> list[tuple[str, str, object]]:
    env = msgspec.json.decode(payload, type=_EnvelopeHosts)
    return envelope_claims(env.data, env.errors, "event.")


def _skeleton_claims(payload: str) -> list[tuple[str, str, object]]:
    env = msgspec.json.decode(payload, type=_SkeletonHosts).skeleton
    return envelope_claims(env.data, env.errors, "event.skeleton.")


_EVENT_READERS: Final[dict[str, Callable[[str], list[tuple[str, str, object]]]]] = {
    NODEJOB: _nodejob_claims,
    "sample": _skeleton_claims,
    "sysinfo": _envelope_event_claims,
    "errors": _envelope_event_claims,
}
"""Where each node event's JSON names a host or a cluster."""


def nodejob_host_problem(line: Line, cluster: str) -> str | None:
    """Why a `nodejob` line's JSON names another host or cluster than its tags (or than `cluster`, the
    subject's, without a `cluster` tag), or None. `consume jobs` takes the host from the JSON: a node that
    could name another there would put its job on that host."""
    for path, key, value in event_claims(line, cluster):
        if key == "event":
            return str(value)
        said = line.tags.get("cluster", cluster) if key == "cluster" else line.tags.get("hostname")
        return f"{path} names {key} {value!r}, but the line says {said!r}"
    return None


def allowed_lines(lines: list[Line], sender: Sender) -> list[tuple[int, str, str]]:
    """`(index, path, reason)` of each line `sender` may not send, each on the subject it travels on
    (`schemas.translate.bus.line_route`): the gateway's check of a node credential's request."""
    refused: list[tuple[int, str, str]] = []
    for i, line in enumerate(lines):
        category, detail = line_route(line)
        reason = subject_problem(category, detail, sender.name)
        found = ("subject", reason) if reason is not None else line_problem(line, category, detail, sender)
        if found is not None:
            refused.append((i, *found))
    return refused


def check_lines(
    payload: bytes, place: str, sender: Sender, category: str, detail: str, *, now: int, max_future: int
) -> tuple[list[str], list[Problem], bool]:
    """The texts of the lines `sender` may send on the subject (`category`, `detail`), a problem for each line
    it may not (or that is broken), and whether a node-level line was not in its bus form (`type=node,
    type-id=0` from an older agent or a collector, which the metric store would keep below the host): then the
    texts, not the payload, go on."""
    parsed = parse_payload(payload, now=now, place=place, max_future=max_future)
    problems = list(parsed.errors)
    good: list[str] = []
    reformed = False
    for i, line in enumerate(parsed.lines):
        refused = line_problem(line, category, detail, sender)
        if refused is not None:
            path, reason = refused
            problems.append(Problem(reason, place, 0, "ingest", path))
            continue
        text = parsed.texts[i] if i < len(parsed.texts) else ""
        if not text:  # the parser put it in canonical form (for a node-level line: its bus form)
            reformed = reformed or line.tags.get("type") == "node"
            text = format_line(line)
        good.append(text)
    return good, problems, reformed


def check_envelope(payload: bytes, place: str, sender: Sender) -> list[Problem]:
    """Problems of a Sonar envelope from `sender`: it must name one of the sender's hosts as its node, and no
    other cluster (the Sonar translation tags its lines with the envelope's cluster, so an unchecked one would
    put them on another cluster's subjects)."""
    try:
        env = msgspec.json.decode(payload, type=_EnvelopeHosts)
    except (msgspec.DecodeError, RecursionError) as exc:
        return [Problem(f"not a Sonar envelope: {exc}", place, 0, "ingest")]
    problems: list[Problem] = []
    for path, key, value in envelope_claims(env.data, env.errors):
        own = value == sender.cluster if key == "cluster" else value in sender.hosts
        if not own:
            problems.append(Problem(sender.claim(key, value), place, 0, "ingest", path, code=FORBIDDEN))
    return problems
