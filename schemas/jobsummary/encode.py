"""Summaries and state out as bytes: the `jobsummary` event line, the `job_summary` InfluxDB point
(docs/jobs.md sections 4 and 5) and the worker's state file (msgpack of `State`); and back from the event
(`event_point`): the point `consume influx` writes into every InfluxDB copy it fills, the same point
`consume jobs` writes into its own (docs/scaling.md, "Two InfluxDBs")."""

from __future__ import annotations

from typing import Final

import msgspec

from hpcbus.schemas.jobsummary.flags import FLAGS
from hpcbus.schemas.jobsummary.state import State
from hpcbus.schemas.jobsummary.summary import Summary
from hpcbus.schemas.lineprotocol import Line

__all__ = [
    "MEASUREMENT",
    "MEASUREMENTS",
    "POINT",
    "decode_state",
    "encode_state",
    "event_line",
    "event_point",
    "influx_point",
    "summary_time",
]

MEASUREMENT: Final = "jobsummary"
"""The event's measurement (and the last token of its subject, `<cluster>.events.jobsummary`)."""
POINT: Final = "job_summary"
"""The InfluxDB measurement: one point per job."""
MEASUREMENTS: Final = frozenset({MEASUREMENT, POINT})
"""Both: no one but the jobs worker sends a line of either (`schemas.trust`, `schemas.influxbody`)."""

_ENCODER: Final = msgspec.json.Encoder()
_DECODER: Final = msgspec.json.Decoder(Summary)


def summary_time(summary: Summary) -> int:
    """The summary's time (epoch s): the job's end, else its start, else 0."""
    return summary.end or summary.start or 0


def event_line(summary: Summary) -> Line:
    """`jobsummary,cluster=<c>,job=<jobkey> event="<JSON>" <end ns>`."""
    tags = {"cluster": summary.cluster, "job": summary.job}
    return Line(
        MEASUREMENT, tags, {"event": _ENCODER.encode(summary).decode()}, summary_time(summary) * 10**9
    )


_FIELDS: Final = (
    "elapsed",
    "nodes",
    "cores",
    "gpus",
    "samples",
    "cpu_seconds",
    "cpu_eff",
    "mem_peak",
    "mem_avg",
    "mem_requested",
    "mem_eff",
    "gpu_util",
    "gpu_mem_peak",
    "energy",
    "read_bytes",
    "write_bytes",
    "coverage",
)
_FLOATS: Final = frozenset(
    {"elapsed", "cpu_seconds", "cpu_eff", "mem_avg", "mem_eff", "gpu_util", "energy", "coverage"}
)


def influx_point(summary: Summary) -> Line:
    """The `job_summary` point (docs/jobs.md): tags cluster, job, user, account, partition, scheduler; the
    fields the summary knows, each with one fixed type; timestamp = the job's end in ns."""
    tags = {
        "cluster": summary.cluster,
        "job": summary.job,
        "user": summary.user or "",
        "account": summary.account or "",
        "partition": summary.partition or "",
        "scheduler": summary.scheduler,
    }
    fields: dict[str, str | int | float | bool] = {}
    if summary.state:
        fields["state"] = summary.state
    if summary.start:
        fields["start"] = int(summary.start)
    if summary.end:
        fields["end"] = int(summary.end)
    for name in _FIELDS:
        value = getattr(summary, name)
        if value is None:
            continue
        fields[name] = float(value) if name in _FLOATS else int(value)
    fields["flags"] = ",".join(summary.flags)
    for flag in FLAGS:
        fields[f"flag_{flag}"] = flag in summary.flags
    return Line(POINT, tags, fields, summary_time(summary) * 10**9)


def event_point(line: Line, cluster: str) -> Line:
    """The `job_summary` point of a `jobsummary` event line that came on `cluster`'s subject: `influx_point`
    of the summary its JSON holds, so byte for byte the point `consume jobs` wrote from that summary (every
    field is written in its one type, whatever number form the JSON has; the timestamp is the summary's, not
    the line's). `ValueError` with the reason when the JSON is not a summary, or names another cluster or job
    than the line and its subject do (the point would sit under the wrong tags)."""
    payload = line.fields.get("event")
    if not isinstance(payload, str):
        raise ValueError("a jobsummary event has a string field `event` (the summary's JSON)")
    try:
        summary = _DECODER.decode(payload)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise ValueError(f"not a job summary: {exc}") from None
    said = line.tags.get("cluster", cluster)
    if summary.cluster != cluster or said != cluster:
        raise ValueError(
            f"the summary names cluster {summary.cluster!r} and the line {said!r}, "
            f"but it came on cluster {cluster!r}'s subject"
        )
    if line.tags.get("job") != summary.job:
        raise ValueError(
            f"the summary is of job {summary.job!r}, but the line's job tag is {line.tags.get('job')!r}"
        )
    return influx_point(summary)


def encode_state(state: State) -> bytes:
    return msgspec.msgpack.encode(state)


def decode_state(data: bytes) -> State:
    """The saved state; `msgspec.DecodeError` / `ValidationError` when the file is not one."""
    return msgspec.msgpack.decode(data, type=State)
