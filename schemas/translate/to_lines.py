"""Sonar -> bus for any envelope: the dispatch by kind to `sample_to_lines`, `sysinfo_to_lines`,
`jobs_to_lines`, `cluster_to_lines` and `errors_to_lines` (docs/mapping.md sections 4-7)."""

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
from hpcbus.schemas.translate.cluster import cluster_to_lines
from hpcbus.schemas.translate.common import Envelope
from hpcbus.schemas.translate.events import MAX_PART_BYTES, errors_to_lines, sysinfo_to_lines
from hpcbus.schemas.translate.jobs import jobs_to_lines
from hpcbus.schemas.translate.sample_to_lp import sample_to_lines


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
