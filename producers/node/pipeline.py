"""From readings to NATS messages: the part of `hpcbus produce node` that neither reads /proc nor talks to NATS.

Kept apart from the agent so that `--once`, the benchmark and the tests run exactly the code the daemon runs:

    NodeSample -> Sonar SampleEnvelope (to_sonar) -> translator lines (docs/mapping.md)
               + ClusterCockpit lines (cc_lines) + nodejob (and optionally start_job/stop_job) events (cc_jobs)
               -> route by subject -> one payload per subject (split only above the size limit)
               -> (subject, payload, Nats-Msg-Id)

The Nats-Msg-Id is `schemas.translate.msg_id` of subject and payload: translation is deterministic, so a
message re-sent after a lost ack (or re-built after a restart) carries the same id and JetStream keeps one.
"""

from __future__ import annotations

import logging
import re
from typing import Annotated, Literal

import msgspec

from hpcbus.keys import ALIGN, Align
from hpcbus.producers.node.cc_jobs import JobEvents
from hpcbus.producers.node.cc_lines import DEFAULT_CPU_FIELDS, cc_lines, self_lines
from hpcbus.producers.node.collector import NodeSample
from hpcbus.producers.node.sysinfo import Sysinfo
from hpcbus.producers.node.to_sonar import sample_envelope, sysinfo_envelope
from hpcbus.schemas import subjects
from hpcbus.schemas.lineprotocol import Line
from hpcbus.schemas.message import Message
from hpcbus.schemas.sonar.types import HOSTNAME_PATTERN
from hpcbus.schemas.sonar.validate import encode_envelope
from hpcbus.schemas.translate import (
    batch,
    envelope_texts,
    format_shared,
    msg_id,
    route,
    sample_to_lines,
    split_payloads,
    sysinfo_to_lines,
)
from hpcbus.settings import PublisherSettings

__all__ = ["AgentConfig", "Message", "Pipeline"]

log = logging.getLogger("hpcbus.node")

_HOSTNAME = re.compile(HOSTNAME_PATTERN)

CpuField = Literal[
    "user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal", "guest", "guest_nice", "used"
]
"""The names of `cc_lines.CPU_FIELDS`, as a type the config decoder checks."""


class AgentConfig(PublisherSettings, forbid_unknown_fields=True, kw_only=True):
    """Options of `hpcbus produce node`'s publishing half (the `[node_agent]` table); `hostname_form`,
    `hostname_domain` and the stream limits are those of every publisher (`PublisherSettings`)."""

    interval: Annotated[float, msgspec.Meta(ge=1.0, le=86400.0)] = 30.0
    """Seconds between samples. Also changeable at run time with a control PUT (`interval=<seconds>`)."""
    align: Align = ALIGN
    sysinfo_interval: Annotated[float, msgspec.Meta(ge=0.0)] = 86400.0
    """Seconds between sysinfo envelopes (also sent at start); 0 = only at start."""
    hostname: str = ""
    """Name of the node on the bus (Sonar `node`, tag `hostname`); "" = the kernel's hostname, in
    `hostname_form`."""
    cc_lines: bool = True
    """Also publish ClusterCockpit-style lines for what Sonar has no field for (CPU %, meminfo, network,
    disk rates, RAPL, cpufreq, InfiniBand, Lustre, GPU extras)."""
    cpu_fields: list[CpuField] = msgspec.field(default_factory=lambda: list(DEFAULT_CPU_FIELDS))  # type: ignore[arg-type]
    """Which `cpu_<field>` percentages to write per hwthread and node."""
    cc_job_events: bool = False
    """Also send cc-backend's own `job,function=start_job|stop_job` for the jobs this node sees (on
    `<cluster>.events.job`). Off by default: the batch-system producer (`produce slurm`, `produce ocs`) is
    cc-backend's authority, with every node of a job in one start_job, and cc-backend keeps only the first
    start of a job, so a node's one-node start would shadow it. Turn it on only where no batch-system
    producer runs, and then only single-node jobs are recorded correctly. What the node sees of a job
    (hostname, hwthreads, GPUs) always goes out as `nodejob` events on `<cluster>.events.nodejob`."""
    job_events_at_startup: bool = True
    """With `cc_job_events`: also start_job the jobs already running when the agent starts (cc-backend drops
    repeats). `nodejob` events are sent for them in any case, marked `atStartup`."""
    sonar_subjects: bool = False
    """Also publish the Sonar JSON envelopes on `<cluster>.sonar.sample|sysinfo` for Sonar-native readers
    (doubles the traffic; the line-protocol subjects carry the same information)."""
    control: bool = True
    """Answer GET/PUT requests on `<cluster>.control.get|put` addressed to this host."""
    ensure_stream: bool = True
    """Create the cluster's JetStream stream (or add missing subjects) when connecting."""
    max_payload: Annotated[int, msgspec.Meta(ge=0)] = 0
    """Largest message in bytes; 0 = the server's `max_payload` (minus room for headers)."""
    stop_timeout: Annotated[float, msgspec.Meta(ge=0.0, le=3.0)] = 3.0
    """On SIGTERM, seconds to wait for NATS to acknowledge what is queued before exiting, at most 3 (every
    hpcbus process exits within 5 s of SIGTERM); what is left stays in the spill directory if one is
    configured, otherwise it is reported as lost."""
    once_settle: Annotated[float, msgspec.Meta(ge=0.0, le=60.0)] = 1.0
    """`--once`: seconds between the two readings (rates and CPU percentages need two)."""

    def node_name(self, kernel: str) -> str:
        """The node's name on the bus: `hostname` as it is, else the kernel's `kernel` in `hostname_form`."""
        return self.hostname or self.host_name(kernel)


class Pipeline:
    """Builds lines and messages for one node; holds only the job-event memory (announced start times)."""

    def __init__(self, cluster: str, hostname: str, config: AgentConfig, *, prefix: str = ""):
        subjects.metrics(cluster, prefix=prefix)  # raises SubjectError now rather than at the first publish
        for what, name in (("cluster", cluster), ("hostname", hostname)):
            if not _HOSTNAME.match(name):
                # The lines are still valid line protocol; only Sonar consumers will refuse the envelopes.
                log.warning(
                    "%s %r is not a valid Sonar host name (RFC 1123): Sonar readers will reject it",
                    what,
                    name,
                )
        self.cluster = cluster
        self.prefix = prefix
        """The subject prefix (`[bus] subject_prefix`), in front of every subject; never in the lines."""
        self.hostname = hostname
        self.config = config
        self.jobs = JobEvents(
            cluster, hostname, at_startup=config.job_events_at_startup, cc_events=config.cc_job_events
        )

    def sample_lines(
        self, s: NodeSample, *, queued: int | None = None, dropped: int | None = None
    ) -> tuple[list[Line], bytes | None]:
        """All lines of one reading (skeleton event, Sonar metric lines, CC lines, job events) and, with
        `sonar_subjects`, the Sonar JSON of the envelope. `queued`/`dropped` (the agent's backlog) go into
        the self-telemetry lines."""
        env = sample_envelope(s, self.cluster, node=self.hostname)
        lines = sample_to_lines(env, cluster=self.cluster)
        lines.extend(self._own_lines(s, queued, dropped))
        return lines, encode_envelope(env) if self.config.sonar_subjects else None

    def sample_messages(
        self, s: NodeSample, max_bytes: int, *, queued: int | None = None, dropped: int | None = None
    ) -> list[Message]:
        """`messages(*sample_lines(s, ...))` byte for byte, which is what the agent publishes every interval,
        but with the Sonar metric lines written as text by `envelope_texts` instead of as one `Line` each:
        for a busy node they are most of the lines, and building and formatting them was a third of a
        sample's CPU time. The node's own lines (ClusterCockpit, self-telemetry, job events) are appended
        to their subjects' text in the order `sample_lines` gives them."""
        env = sample_envelope(s, self.cluster, node=self.hostname)
        texts = envelope_texts(env, cluster=self.cluster, prefix=self.prefix)
        for subject, group in route(
            self._own_lines(s, queued, dropped), self.cluster, prefix=self.prefix
        ).items():
            texts.setdefault(subject, []).extend(format_shared(group))
        sonar = ("sample", encode_envelope(env)) if self.config.sonar_subjects else None
        return self._messages(
            {subject: split_payloads("".join(t).encode(), max_bytes) for subject, t in texts.items()}, sonar
        )

    def _own_lines(self, s: NodeSample, queued: int | None, dropped: int | None) -> list[Line]:
        """The lines of a reading that are not the Sonar envelope's: ClusterCockpit and self-telemetry lines
        (with `cc_lines`), then job events."""
        lines: list[Line] = []
        if self.config.cc_lines:
            host = self.hostname
            lines.extend(cc_lines(s, self.cluster, node=host, cpu_fields=self.config.cpu_fields))
            lines.extend(self_lines(s, self.cluster, node=host, queued=queued, dropped=dropped))
        lines.extend(self.jobs.lines(s.job_events, s.jobs))
        return lines

    def sysinfo_lines(self, info: Sysinfo) -> tuple[list[Line], bytes | None]:
        env = sysinfo_envelope(info, self.cluster, node=self.hostname)
        return sysinfo_to_lines(env, cluster=self.cluster), (
            encode_envelope(env) if self.config.sonar_subjects else None
        )

    def messages(
        self, lines: list[Line], max_bytes: int, *, sonar: tuple[str, bytes] | None = None
    ) -> list[Message]:
        """Lines grouped by subject, one payload per subject unless it exceeds `max_bytes`, each with its id.
        `sonar` = (kind, envelope JSON) adds the raw envelope on `<cluster>.sonar.<kind>`."""
        routed = route(lines, self.cluster, prefix=self.prefix)
        return self._messages(
            {subject: list(batch(group, max_bytes)) for subject, group in routed.items()}, sonar
        )

    def _messages(self, payloads: dict[str, list[bytes]], sonar: tuple[str, bytes] | None) -> list[Message]:
        out = [Message(subject, p, msg_id(subject, p)) for subject, group in payloads.items() for p in group]
        if sonar is not None:
            subject = subjects.sonar(self.cluster, sonar[0], prefix=self.prefix)
            out.append(Message(subject, sonar[1], msg_id(subject, sonar[1])))
        return out
