"""Line protocol -> Sonar envelopes of every kind: one front door that routes each line to its assembler.

Why one object: `hpcbus translate --to sonar` and the Sonar bridge read one mixed stream (a file, or several
subscriptions); they should not need to know which line belongs to which envelope kind. Sysinfo and
errors-only envelopes need no assembling and come out at once.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from hpcbus.schemas.lineprotocol import Line
from hpcbus.schemas.problems import InvalidInput, Problem
from hpcbus.schemas.sonar import decode_envelope
from hpcbus.schemas.sonar.types import ErrorsEnvelope, SysinfoEnvelope
from hpcbus.schemas.translate.cluster import ClusterAssembler
from hpcbus.schemas.translate.common import Assembled
from hpcbus.schemas.translate.jobs import JobsAssembler
from hpcbus.schemas.translate.lp_to_sample import Assembler

__all__ = ["LpToSonar", "lines_to_envelopes"]

_JOBS = frozenset({"slurm", "job"})
_CLUSTER = frozenset({"cluster", "nodestate", "partition"})


class LpToSonar:
    """Feed lines (`add_lines`), call `flush(now)` now and then and `flush_all()` at the end; each returns the
    envelopes that became ready. Options as for `Assembler` (`grace`, `max_groups`, `max_lines`)."""

    def __init__(self, *, grace: float = 30.0, max_groups: int = 4096, max_lines: int = 200_000):
        self.samples = Assembler(grace=grace, max_groups=max_groups, max_lines=max_lines)
        self.jobs = JobsAssembler(grace=grace)
        self.cluster = ClusterAssembler(grace=grace)

    @property
    def waiting(self) -> bool:
        """Some group is still open: lines of held messages may belong to an envelope not yet emitted."""
        return bool(self.samples.open_groups) or self.jobs.waiting or self.cluster.waiting

    def add_lines(
        self, lines: Iterable[Line], *, cluster: str = "", now: float, problems: list[Problem]
    ) -> list[Assembled]:
        """The envelopes that became ready. A sysinfo or errors event whose envelope cannot be decoded makes
        no envelope (one holding only `meta` is no Sonar envelope at all: neither `data` nor `errors`): its
        Problem is appended to `problems`, which every caller passes (required, so that none is dropped
        unseen): the caller refuses the input with it, or says it."""
        # Metric lines are nearly all of a stream: the sample assembler takes every line in one pass and hands
        # back the events that are not its own, rather than this loop sorting each line first.
        events: list[Line] = []
        out = self.samples.add_lines(lines, cluster=cluster, now=now, others=events)
        jobs: list[Line] = []
        clusters: list[Line] = []
        for line in events:
            if "event" not in line.fields:
                continue
            meas = line.measurement
            if meas in _JOBS:
                jobs.append(line)
            elif meas in _CLUSTER:
                clusters.append(line)
            elif meas in ("sysinfo", "errors") and line.tags.get("function") == "sonar":
                whole = _whole(line, meas)
                if isinstance(whole, Assembled):
                    out.append(whole)
                else:
                    problems.append(whole)
        if jobs:
            out.extend(self.jobs.add_lines(jobs, cluster=cluster, now=now))
        if clusters:
            out.extend(self.cluster.add_lines(clusters, cluster=cluster, now=now))
        return out

    def flush(self, now: float) -> list[Assembled]:
        return [*self.samples.flush(now), *self.jobs.flush(now), *self.cluster.flush(now)]

    def flush_all(self) -> list[Assembled]:
        return [*self.samples.flush_all(), *self.jobs.flush_all(), *self.cluster.flush_all()]


def _whole(line: Line, meas: str) -> Assembled | Problem:
    """The envelope a `sysinfo` or `errors` event carries whole, or why it carries none."""
    payload = str(line.fields["event"])
    try:
        if meas == "sysinfo":
            return Assembled(kind="sysinfo", envelope=msgspec.json.decode(payload, type=SysinfoEnvelope))
        return Assembled(kind="errors", envelope=msgspec.json.decode(payload, type=ErrorsEnvelope))
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        why = str(exc)
        try:  # the validator's words (`node: not a valid Hostname: 'c1_5'; ...`) rather than a regex
            decode_envelope(payload, expect="sysinfo" if meas == "sysinfo" else None)
        except InvalidInput as invalid:
            why = "; ".join(f"{p.path}: {p.reason}" if p.path else p.reason for p in invalid.problems[:3])
        return Problem(f"{meas} envelope not decodable: {why}", kind="lp event", path=f"event {meas}")


def lines_to_envelopes(
    lines: Iterable[Line], *, cluster: str = "", problems: list[Problem]
) -> list[Assembled]:
    """Every envelope in a finite batch of lines (partial ones included, flagged); `problems`: as for
    `LpToSonar.add_lines`."""
    translator = LpToSonar()
    out = translator.add_lines(lines, cluster=cluster, now=0.0, problems=problems)
    out.extend(translator.flush_all())
    return out
