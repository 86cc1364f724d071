"""Sonar envelopes cut to fit one message: a jobs or cluster envelope larger than `max_bytes` becomes several
valid envelopes with the same `meta`, data type and attributes (`time`, `cluster`, ...), each holding a run
of consecutive records.

Why here, pure and alone: every publisher of envelopes (the gateway, `hpcbus pub`, `consume sonar` both ways,
and the Slurm and OCS producers through `jobs_to_lines` / `cluster_to_lines`) must cut the same way, so that
the same envelope always gives the same parts, and a retried request the same message ids.

Why only jobs and cluster envelopes: their records (`slurm_jobs`; a cluster's `partitions` and `nodes`) are
independent of each other, and Jobanalyzer reads each envelope on its own. A sample (or sysinfo) is one
reading of one node: Jobanalyzer takes every envelope as a sample, so two halves would be two samples, the
second with a job `0` and broken CPU rates (FACTS.md). It is never cut: one larger than `max_bytes` comes
back as a single part with a problem, and callers refuse it with that reason.

An errors-only envelope (`data` and `errors` are exclusive) has no records: it is never cut either.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from hpcbus.schemas.problems import Problem
from hpcbus.schemas.sonar.types import ClusterNodes, ClusterPartition, SlurmJob
from hpcbus.schemas.sonar.validate import Envelope, encode_envelope, kind_of

__all__ = ["SPLIT_KINDS", "Part", "split_envelope"]

SPLIT_KINDS = frozenset({"job", "cluster"})
"""Envelope kinds whose records may travel in several envelopes."""

_FIELDS = {"job": ("slurm_jobs",), "cluster": ("partitions", "nodes")}


class Part(NamedTuple):
    """One envelope to publish: the envelope, its JSON, and why it cannot be published when it is larger
    than the budget (a single record, or an envelope that cannot be cut)."""

    envelope: Envelope
    payload: bytes
    problem: Problem | None = None


def split_envelope(env: Envelope, max_bytes: int, *, payload: bytes | None = None) -> list[Part]:
    """`env` as envelopes of at most `max_bytes` bytes of JSON each, in record order.

    `payload` is the envelope's JSON as it arrived: an envelope that fits is returned as exactly those bytes
    (its message id stays what it always was). Parts are written by `encode_envelope`, so the same envelope
    gives the same parts. A part that is still larger than `max_bytes` (a single record, a sample, an
    envelope without records to cut by) carries a `problem` naming it; the other parts are good."""
    raw = encode_envelope(env) if payload is None else payload
    if len(raw) <= max_bytes:
        return [Part(env, raw)]
    kind = kind_of(env)
    data = getattr(env, "data", None)
    fields = _FIELDS.get(kind)
    records = _records(data, fields) if fields else []
    if not records:
        return [Part(env, raw, _too_large(env, kind, len(raw), max_bytes))]
    assert fields is not None and data is not None
    attributes = data.attributes
    empty: dict[str, list[Any]] = {f: [] for f in fields}
    skeleton = msgspec.structs.replace(
        env, data=msgspec.structs.replace(data, attributes=msgspec.structs.replace(attributes, **empty))
    )
    # An upper bound of a part's size: the skeleton, each list's `,"name":[]`, each record and its comma.
    base = len(encode_envelope(skeleton)) + sum(len(f) + 6 for f in fields)

    runs: list[list[tuple[str, int, Any, bytes]]] = [[]]
    size = base
    for rec in records:
        need = len(rec[3]) + 1
        if runs[-1] and size + need > max_bytes:
            runs.append([])
            size = base
        runs[-1].append(rec)
        size += need

    parts: list[Part] = []
    for run in runs:
        lists_of: dict[str, list[Any]] = {f: [] for f in fields}
        for field, _, rec, _ in run:
            lists_of[field].append(rec)
        part = msgspec.structs.replace(
            env,
            data=msgspec.structs.replace(data, attributes=msgspec.structs.replace(attributes, **lists_of)),
        )
        encoded = encode_envelope(part)
        problem = None
        if len(encoded) > max_bytes:
            problem = _record_too_large(run, kind, len(encoded), max_bytes)
        parts.append(Part(part, encoded, problem))
    return parts


def _records(data: Any, fields: tuple[str, ...]) -> list[tuple[str, int, Any, bytes]]:
    """(list name, index, record, its JSON) of every record, list by list."""
    if data is None:
        return []
    out = []
    for field in fields:
        for i, rec in enumerate(getattr(data.attributes, field)):
            out.append((field, i, rec, encode_envelope(rec)))
    return out


def _too_large(env: Envelope, kind: str, size: int, max_bytes: int) -> Problem:
    if kind in ("sample", "sysinfo"):
        reason = (
            f"a {kind} envelope of {size} bytes is larger than one NATS message may be ({max_bytes}); a {kind} "
            "is one reading of one node and is never cut in two (Jobanalyzer would read two); raise the "
            "NATS server's max_payload to carry it"
        )
    else:
        reason = (
            f"envelope of {size} bytes is larger than one NATS message may be ({max_bytes}) and has no "
            "records to cut it by"
        )
    return Problem(reason, kind=f"sonar {kind or 'envelope'}")


def _record_too_large(
    run: list[tuple[str, int, Any, bytes]], kind: str, size: int, max_bytes: int
) -> Problem:
    """The problem of a part that does not fit: its one record, named by its index and job id / name."""
    if len(run) != 1:  # not expected: the bound above is generous
        field, i = run[0][0], run[0][1]
        return Problem(
            f"records {i}-{run[-1][1]} make an envelope of {size} bytes, larger than one NATS message may "
            f"be ({max_bytes})",
            kind=f"sonar {kind}",
            path=f"data.attributes.{field}[{i}]",
        )
    field, i, rec, encoded = run[0]
    if isinstance(rec, SlurmJob):
        name = f"job {rec.job_id}" + (f" step {rec.job_step}" if rec.job_step else "")
    elif isinstance(rec, ClusterPartition):
        name = f"partition {rec.name!r}"
    elif isinstance(rec, ClusterNodes):
        name = f"node group {rec.names[0]!r}" + (" ..." if len(rec.names) > 1 else "")
    else:
        name = "record"
    return Problem(
        f"{name}: a record of {len(encoded)} bytes, {size} bytes as an envelope with its meta and "
        f"attributes, is larger than one NATS message may be ({max_bytes}); refused alone, the other "
        "records were kept",
        kind=f"sonar {kind}",
        path=f"data.attributes.{field}[{i}]",
    )
