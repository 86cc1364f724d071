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

import itertools
from typing import Any, NamedTuple

import msgspec

from hpcbus.schemas.problems import Problem
from hpcbus.schemas.sonar.types import ClusterNodes, ClusterPartition, SlurmJob
from hpcbus.schemas.sonar.validate import Envelope, encode_envelope, kind_of

__all__ = ["SPLIT_KINDS", "Part", "split_envelope", "split_own"]

SPLIT_KINDS = frozenset({"job", "cluster"})
"""Envelope kinds whose records may travel in several envelopes."""

_FIELDS = {"job": ("slurm_jobs",), "cluster": ("partitions", "nodes")}

_LINES = msgspec.json.Encoder()
"""Encodes a list of records as JSON lines in one call (`_encoded`); configured as `encode_envelope`'s
encoder (the default), so a record's line is the bytes `encode_envelope(record)` gives."""


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
    return _split(env, raw, max_bytes, None)


def split_own(env: Envelope, max_bytes: int) -> list[Part]:
    """`split_envelope(env, max_bytes)` (the same parts, byte for byte) for an envelope this process built:
    each record is encoded once, and the whole envelope and every part are written around those bytes.

    Why: a producer's envelope (the Slurm and OCS producers', through `jobs_to_lines`) is encoded by us
    anyway, so its JSON need not be written three times (whole, per record to measure it, per part)."""
    data = getattr(env, "data", None)
    fields = _FIELDS.get(kind_of(env))
    if not fields or data is None:
        return split_envelope(env, max_bytes)
    lists = _lists(data, fields)
    raw = _encode_around(env, data, [(f, list(map(msgspec.Raw, enc))) for f, _, enc in lists])
    return _split(env, raw, max_bytes, lists)


_Lists = list[tuple[str, list[Any], list[bytes]]]
"""(list name, its records, their JSON) of each record list of an envelope's attributes."""


def _encode_around(env: Envelope, data: Any, lists: list[tuple[str, list[Any]]]) -> bytes:
    """`encode_envelope` of `env` with `data`'s record lists replaced by `lists` (of records, or of their
    JSON as `msgspec.Raw`, which the encoder copies as it is: the same bytes as encoding the records)."""
    attributes = msgspec.structs.replace(data.attributes, **dict(lists))
    return encode_envelope(
        msgspec.structs.replace(env, data=msgspec.structs.replace(data, attributes=attributes))
    )


def _split(env: Envelope, raw: bytes, max_bytes: int, lists: _Lists | None) -> list[Part]:
    """The parts of `env` whose JSON is `raw`; `lists`: its records with their JSON, when known."""
    if len(raw) <= max_bytes:
        return [Part(env, raw)]
    kind = kind_of(env)
    data = getattr(env, "data", None)
    fields = _FIELDS.get(kind)
    if lists is None:
        lists = _lists(data, fields) if fields and data is not None else []
    if not any(recs for _, recs, _ in lists):
        return [Part(env, raw, _too_large(env, kind, len(raw), max_bytes))]
    assert fields is not None and data is not None
    # An upper bound of a part's size: the skeleton, each list's `,"name":[]`, each record and its comma.
    base = len(_encode_around(env, data, [(f, []) for f in fields])) + sum(len(f) + 6 for f in fields)

    # runs of records, list by list, as (start, end) in that order: each fits when it can
    cuts: list[int] = [0]
    size = base
    at = 0
    for _, _, encoded in lists:
        for need in map(len, encoded):
            need += 1
            if at > cuts[-1] and size + need > max_bytes:
                cuts.append(at)
                size = base
            size += need
            at += 1
    cuts.append(at)

    parts: list[Part] = []
    for start, end in itertools.pairwise(cuts):
        records: list[tuple[str, list[Any]]] = []
        raws: list[tuple[str, list[Any]]] = []
        offset = 0
        for field, recs, encoded in lists:
            lo, hi = max(start - offset, 0), max(min(end - offset, len(recs)), 0)
            records.append((field, recs[lo:hi]))
            raws.append((field, list(map(msgspec.Raw, encoded[lo:hi]))))
            offset += len(recs)
        part = msgspec.structs.replace(
            env,
            data=msgspec.structs.replace(
                data, attributes=msgspec.structs.replace(data.attributes, **dict(records))
            ),
        )
        encoded_part = _encode_around(env, data, raws)
        problem = None
        if len(encoded_part) > max_bytes:
            problem = _record_too_large(_run(lists, start, end), kind, len(encoded_part), max_bytes)
        parts.append(Part(part, encoded_part, problem))
    return parts


def _lists(data: Any, fields: tuple[str, ...]) -> _Lists:
    """Each record list of `data`'s attributes with its records' JSON."""
    out = []
    for field in fields:
        recs = getattr(data.attributes, field)
        out.append((field, recs, _encoded(recs)))
    return out


def _encoded(records: list[Any]) -> list[bytes]:
    """`[encode_envelope(r) for r in records]` in one encoder call: compact JSON holds no raw newline (one in a
    string is written `\\n`), so the JSON lines split at their newlines."""
    if not records:
        return []
    lines = _LINES.encode_lines(records).split(b"\n")[:-1]
    if len(lines) != len(records):  # a newline after all (a record holding raw JSON): one by one
        return [encode_envelope(r) for r in records]
    return lines


def _run(lists: _Lists, start: int, end: int) -> list[tuple[str, int, Any, bytes]]:
    """(list name, index, record, its JSON) of the records `start` to `end` (list by list)."""
    flat = [
        (f, i, rec, enc)
        for f, recs, encs in lists
        for i, (rec, enc) in enumerate(zip(recs, encs, strict=True))
    ]
    return flat[start:end]


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
