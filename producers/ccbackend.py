"""cc-backend's own subjects: the job events and node states of a poll, also in the form cc-backend 1.5 reads.

cc-backend (internal/api/nats.go) does not read the hpcbus tree: it subscribes, with core NATS, to the two
subjects of its `api-subjects` configuration (`subject-job-event`, e.g. `cc.job.event`; `subject-node-state`,
e.g. `cc.node.state`), and decodes every line with cc-lib's influx decoder, which reads the timestamp in
**nanoseconds** (seconds would be 1970 to it) and drops the rest of a message after one line it cannot decode.
So the producers that announce jobs (`produce slurm`, `produce ocs`) copy each `job,function=start_job|stop_job`
line (and the Slurm producer its `nodestate` line, `{cluster, nodes[{hostname, states}]}`) to the configured
subject: one line per message, timestamp in ns, only the tags cc-backend reads (`function`). The hpcbus tree
keeps the seconds form every other ClusterCockpit consumer reads.

These subjects are outside the telemetry stream (one cc-backend subject serves every cluster, and two streams
may not share a subject), so the outbox publishes them with core NATS and a round trip to the server
(`hpcbus.outbox`, `core_subjects`): in order, kept while NATS is away, never dropped silently.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from hpcbus.schemas.lineprotocol import Line, format_line, to_seconds
from hpcbus.schemas.message import Message
from hpcbus.schemas.translate import msg_id
from hpcbus.settings import CcBackendSettings

__all__ = ["JOB_FUNCTIONS", "CcBackendRelay", "cc_line"]

JOB_FUNCTIONS: Final = frozenset({"start_job", "stop_job"})
NS: Final = 1_000_000_000


def cc_line(line: Line) -> Line | None:
    """`line` as cc-backend reads it on its own subjects (timestamp in ns), or None when it is neither a job
    event nor a node state."""
    event = line.fields.get("event")
    if not isinstance(event, str):
        return None
    time = to_seconds(line.time) * NS
    if line.measurement == "job" and line.tags.get("function") in JOB_FUNCTIONS:
        return Line("job", {"function": line.tags["function"]}, {"event": event}, time)
    if line.measurement == "nodestate":
        return Line("nodestate", {}, {"event": event}, time)
    return None


class CcBackendRelay:
    """Which lines go to which cc-backend subject (`[ccbackend]`); empty subjects are off."""

    def __init__(self, settings: CcBackendSettings, *, node_states: bool = True) -> None:
        self.job_subject = settings.cc_job_subject
        self.node_state_subject = settings.cc_node_state_subject if node_states else ""

    @property
    def subjects(self) -> list[str]:
        """The subjects in use: the outbox publishes them with core NATS."""
        return [s for s in (self.job_subject, self.node_state_subject) if s]

    def lines(self, lines: Iterable[Line]) -> list[tuple[str, Line]]:
        """(subject, cc-backend line) for each job event and node state in `lines`, in order."""
        if not (self.job_subject or self.node_state_subject):
            return []
        out: list[tuple[str, Line]] = []
        for line in lines:
            cc = cc_line(line)
            if cc is None:
                continue
            subject = self.job_subject if cc.measurement == "job" else self.node_state_subject
            if subject:
                out.append((subject, cc))
        return out

    @staticmethod
    def messages(pairs: Iterable[tuple[str, Line]]) -> list[Message]:
        """One message per line (a line cc-backend cannot decode must not cost the others)."""
        out = []
        for subject, line in pairs:
            payload = (format_line(line) + "\n").encode()
            out.append(Message(subject, payload, msg_id(subject, payload)))
        return out
