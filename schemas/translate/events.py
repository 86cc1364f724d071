"""Whole envelopes as event lines: the carrier for sysinfo, jobs, cluster and errors-only envelopes.

Why whole envelopes rather than lines per field: these are nested descriptions (GPU cards, Slurm records with
thirty optional fields, partitions with node ranges) that change rarely and are never plotted; as Sonar JSON
inside one event they arrive exactly as sent and any Sonar consumer can read the payload unchanged
(docs/mapping.md principle 4).
"""

from __future__ import annotations

import msgspec

from hpcbus.schemas.lineprotocol import Line
from hpcbus.schemas.sonar.split import split_own
from hpcbus.schemas.sonar.types import Error, ErrorsEnvelope, SysinfoEnvelope
from hpcbus.schemas.sonar.validate import Envelope
from hpcbus.schemas.translate.bus import MAX_PAYLOAD
from hpcbus.schemas.translate.common import epoch_of

__all__ = [
    "MAX_PART_BYTES",
    "envelope_event",
    "errors_tags",
    "event_budget",
    "placed",
    "sonar_event_parts",
    "sysinfo_to_lines",
]

EVENT_ROOM = 2048
"""Bytes of an event line besides its escaped JSON: measurement, tags (a cluster name of up to 255), time."""

MAX_PART_BYTES = (MAX_PAYLOAD - EVENT_ROOM) // 2
"""Largest envelope JSON in one `slurm` or `cluster` event (and one `nodestate` event's JSON) by default,
255 KiB: the line, quotes escaped, fits one message of `MAX_PAYLOAD` (what producers cut at)."""


def event_budget(limit: int) -> int:
    """Envelope JSON that fits one event line of at most `limit` bytes whatever it holds: escaping doubles
    at most (every `"` and `\\` gets a backslash), and the tags take `EVENT_ROOM`; never above
    `MAX_PART_BYTES` (what a default server gets, as every producer cuts)."""
    return max(1024, min(MAX_PART_BYTES, (limit - EVENT_ROOM) // 2))


def envelope_event(measurement: str, envelope: msgspec.Struct, tags: dict[str, str], time: int) -> Line:
    """`<measurement>,<tags>,function=sonar event="<envelope JSON>" <time>`."""
    return Line(
        measurement, {**tags, "function": "sonar"}, {"event": msgspec.json.encode(envelope).decode()}, time
    )


def errors_tags(
    errors: list[Error], cluster: str, *, node_level: bool, now: int = 0
) -> tuple[dict[str, str], int]:
    """Tags and time of an errors-only envelope: its first error's cluster, node and time.

    Sonar may send an error with only its `detail`; then the cluster is the caller's (the subject's) and the
    time `now`, when it was received (the envelope in the event still says exactly what was sent; a time 0
    would be refused by every store as 1970)."""
    tags = {"type": "node", "type-id": "0"} if node_level else {}
    err = errors[0] if errors else None
    if err is not None and err.cluster:
        tags["cluster"] = err.cluster
    elif cluster:
        tags["cluster"] = cluster
    if err is not None and err.node:
        tags["hostname"] = err.node
    return tags, epoch_of(err.time) if err is not None and err.time else now


def placed(time: str, own: str, cluster: str, now: int) -> tuple[dict[str, str], int]:
    """`cluster` tag and time of a data envelope whose `time` and `cluster` are optional (the spec): its own,
    else the caller's cluster (the subject's) and `now`, as for an errors-only envelope; no tag rather than an
    empty one (line protocol cannot write it)."""
    name = own or cluster
    return ({"cluster": name} if name else {}), epoch_of(time) if time else now


def sysinfo_to_lines(env: SysinfoEnvelope, *, cluster: str = "", now: int = 0) -> list[Line]:
    """One `sysinfo,function=sonar` event carrying the whole envelope (docs/mapping.md section 5). A sysinfo
    without `time`, `cluster` or `node` (optional in the spec) still travels whole: at `now`, with the
    caller's cluster and without a `hostname` tag."""
    data = env.data
    if data is None:
        tags, ts = errors_tags(env.errors, cluster, node_level=True, now=now)
        return [envelope_event("sysinfo", env, tags, ts)]
    a = data.attributes
    tags, ts = placed(a.time, a.cluster, cluster, now)
    if a.node:
        tags["hostname"] = a.node
    tags.update({"type": "node", "type-id": "0"})
    return [envelope_event("sysinfo", env, tags, ts)]


def errors_to_lines(env: ErrorsEnvelope, *, cluster: str = "", now: int = 0) -> list[Line]:
    """An errors-only envelope of unknown kind: one `errors,function=sonar` event."""
    tags, ts = errors_tags(env.errors, cluster, node_level=False, now=now)
    return [envelope_event("errors", env, tags, ts)]


def sonar_event_parts(
    env: Envelope, tags: dict[str, str], max_part_bytes: int = MAX_PART_BYTES
) -> list[tuple[dict[str, str], bytes]]:
    """(tags, envelope JSON) of each `function=sonar` event of an envelope with data (`slurm` for jobs,
    `cluster`), `tags` its placement (`placed`): one event, or one per part (`part`/`parts` tags) when it is
    larger than `max_part_bytes`. The one rule for `jobs_to_lines`, `cluster_to_lines` and for writers of
    its text without a `Line` (the OCS producer's `mapping.envelope_text`)."""
    parts = split_own(env, max_part_bytes)
    if len(parts) == 1:
        return [({**tags, "function": "sonar"}, parts[0].payload)]
    # a record larger than `max_part_bytes` travels in a part of its own (it is not refused here)
    n = str(len(parts))
    return [
        ({**tags, "function": "sonar", "part": str(i), "parts": n}, p.payload) for i, p in enumerate(parts, 1)
    ]
