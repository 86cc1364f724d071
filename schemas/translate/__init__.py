"""Sonar JSON envelopes <-> ClusterCockpit line protocol; docs/mapping.md is the specification.

Sonar -> bus: `envelope_to_lines(env)` for any envelope; `envelope_payloads(env)` for its NATS messages. Bus -> Sonar: `LpToSonar` (streaming, bounded memory:
feed lines as they arrive, flush periodically) or `lines_to_envelopes(lines)` for a finite batch. `route`,
`batch` and `msg_id` put lines on NATS subjects in messages with deduplicating ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from hpcbus.schemas.lineprotocol import Line
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.sonar.types import (
    ClusterEnvelope,
    ErrorsEnvelope,
    JobsEnvelope,
    SampleEnvelope,
    SysinfoEnvelope,
)
from hpcbus.schemas.translate.bus import (
    MAX_PAYLOAD,
    batch,
    format_shared,
    msg_id,
    route,
    split_payloads,
    subject_of,
)
from hpcbus.schemas.translate.cluster import ClusterAssembler, cluster_to_lines
from hpcbus.schemas.translate.common import Assembled, Envelope
from hpcbus.schemas.translate.envelope_messages import envelope_messages
from hpcbus.schemas.translate.events import MAX_PART_BYTES, errors_to_lines, event_budget, sysinfo_to_lines
from hpcbus.schemas.translate.jobs import JobsAssembler, cc_job_events, jobs_to_lines
from hpcbus.schemas.translate.lp_to_sample import Assembler
from hpcbus.schemas.translate.passthrough import LpToSonar, lines_to_envelopes
from hpcbus.schemas.translate.payloads import envelope_payloads, envelope_texts
from hpcbus.schemas.translate.registry import BY_NAME, HIGH_CARDINALITY_TAGS, REGISTRY, Metric
from hpcbus.schemas.translate.sample_to_lp import SampleHeader, sample_to_lines

__all__ = [
    "BY_NAME",
    "HIGH_CARDINALITY_TAGS",
    "MAX_PAYLOAD",
    "REGISTRY",
    "Assembled",
    "Assembler",
    "ClusterAssembler",
    "Envelope",
    "JobsAssembler",
    "LpToSonar",
    "Metric",
    "SampleHeader",
    "batch",
    "cc_job_events",
    "cluster_to_lines",
    "envelope_messages",
    "envelope_payloads",
    "envelope_texts",
    "envelope_to_lines",
    "errors_to_lines",
    "event_budget",
    "format_shared",
    "jobs_to_lines",
    "lines_to_envelopes",
    "msg_id",
    "route",
    "sample_to_lines",
    "split_payloads",
    "subject_of",
    "sysinfo_to_lines",
    "translate_envelopes",
]


def envelope_to_lines(
    env: Envelope,
    *,
    cluster: str = "",
    cc_events: bool = True,
    now: int = 0,
    problems: list[Problem] | None = None,
    max_event_bytes: int = MAX_PART_BYTES,
) -> list[Line]:
    """All lines of one Sonar envelope (docs/mapping.md sections 4-7). `cluster` and `now` (when it was
    received, epoch s) are only used for an envelope that does not say them: an errors-only envelope whose
    errors name no cluster or time, or data without `cluster` or `time` (optional in the spec; a sample
    without either or without `node` travels as its skeleton event alone, see `sample_to_lines`). Nothing
    is made up. `cc_events` adds the cc-backend events derived from jobs and cluster envelopes, and
    `problems` collects the warnings about what could not be derived (cc-backend events, sample metric
    lines); the envelope itself always travels. `max_event_bytes` is the envelope JSON one jobs or cluster
    event may carry (`event_budget` of the message size): larger ones travel in parts."""
    if isinstance(env, SampleEnvelope):
        return sample_to_lines(env, cluster=cluster, now=now, problems=problems)
    if isinstance(env, SysinfoEnvelope):
        return sysinfo_to_lines(env, cluster=cluster, now=now)
    if isinstance(env, JobsEnvelope):
        return jobs_to_lines(
            env,
            cluster=cluster,
            cc_events=cc_events,
            problems=problems,
            now=now,
            max_part_bytes=max_event_bytes,
        )
    if isinstance(env, ClusterEnvelope):
        return cluster_to_lines(
            env, cluster=cluster, cc_events=cc_events, now=now, max_part_bytes=max_event_bytes
        )
    if isinstance(env, ErrorsEnvelope):
        return errors_to_lines(env, cluster=cluster, now=now)
    raise TypeError(f"not a Sonar envelope: {type(env).__name__}")


def translate_envelopes(
    envelopes: Iterable[Envelope], *, cluster: str = "", cc_events: bool = True, now: int = 0
) -> Iterator[Line]:
    """Lines of many envelopes, one envelope at a time (constant memory for `hpcbus translate --to lp`)."""
    for env in envelopes:
        yield from envelope_to_lines(env, cluster=cluster, cc_events=cc_events, now=now)
