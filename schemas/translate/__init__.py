"""Sonar JSON envelopes <-> ClusterCockpit line protocol; docs/mapping.md is the specification.

Sonar -> bus: `envelope_to_lines(env)` for any envelope; `envelope_payloads(env)` for its NATS messages. Bus -> Sonar: `LpToSonar` (streaming, bounded memory:
feed lines as they arrive, flush periodically) or `lines_to_envelopes(lines, problems=[...])` for a finite batch. `route`,
`batch` and `msg_id` put lines on NATS subjects in messages with deduplicating ids.
"""

from __future__ import annotations

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
from hpcbus.schemas.translate.events import errors_to_lines, event_budget, sysinfo_to_lines
from hpcbus.schemas.translate.jobs import JobsAssembler, cc_job_events, jobs_to_lines
from hpcbus.schemas.translate.lp_to_sample import Assembler
from hpcbus.schemas.translate.passthrough import LpToSonar, lines_to_envelopes
from hpcbus.schemas.translate.payloads import envelope_payloads, envelope_texts
from hpcbus.schemas.translate.registry import BY_NAME, HIGH_CARDINALITY_TAGS, REGISTRY, Metric
from hpcbus.schemas.translate.sample_to_lp import SampleHeader, sample_to_lines
from hpcbus.schemas.translate.to_lines import envelope_to_lines, translate_envelopes

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
