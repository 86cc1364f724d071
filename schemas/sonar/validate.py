"""Decoding, validating, encoding and splitting Sonar JSON envelopes: the public API of `schemas.sonar`.

Strictness is the point: the spec lets a back-end reject "the entire top-level object" for a malformed value,
and hpcbus does, so consumers downstream can trust every field. An envelope with any problem is rejected
whole, with *all* its problems (`InvalidInput.problems`), each naming the field by its JSON path, e.g.
`data.attributes.jobs[3].processes[0].pid`. Good envelopes beside a bad one are never lost.

Two exceptions, because a jobs envelope is a list of independent records from many users: a record of
`slurm_jobs` whose `nodes` is not a host list is refused alone (`PartlyInvalid` carries the rest of the
envelope, valid, and the refused records' problems: the entry stores the rest and reports or dead-letters the
record, as a bad line beside good ones), and a `job_name` with control characters or over 1024 characters
is made safe (`schemas.names.safe_text`), never refused: `sbatch -J $'\\x1b[31mx'` is any user's to type.

How the work is split, for speed (a bench compares this with bare msgspec decoding):

1. One cached `msgspec.json.Decoder` decodes into `types.AnyEnvelope`. Types, unknown and missing keys,
   integer bounds, non-empty strings, Hostname and the `data.type` dispatch are all checked by msgspec in C
   during that single pass (see `schemas.sonar.types`).
2. The few rules left (`schemas.sonar.rules`: `data` XOR `errors`, format version 0, job 0 needs an epoch,
   NodeRange syntax, the Timestamp pattern) run on the decoded structs, touching only the fields they need.
3. Only if msgspec refused the envelope is it decoded again as plain JSON and walked by
   `schemas.sonar.diagnose`, which lists every problem rather than msgspec's first.

Classifying errors-only envelopes: `{"meta":..., "errors":[...]}` has the same keys whatever probe failed, and
an error object holds only time/detail/cluster/node, so neither the key set nor the errors say which kind it
is. The kind comes from context (Kafka topic, NATS subject, file name `0+sysinfo-host.json`): pass
`expect="sysinfo"` and get a `SysinfoEnvelope`; without `expect` the result is an `ErrorsEnvelope`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import msgspec

from hpcbus.schemas.problems import InvalidInput, Problem
from hpcbus.schemas.sonar import diagnose, rules
from hpcbus.schemas.sonar.framing import Piece, Splitter, scan
from hpcbus.schemas.sonar.types import (
    AnyEnvelope,
    ClusterData,
    ClusterEnvelope,
    Error,
    ErrorsEnvelope,
    JobsData,
    JobsEnvelope,
    SampleData,
    SampleEnvelope,
    SlurmJob,
    SpecJobsData,
    SysinfoData,
    SysinfoEnvelope,
)

__all__ = [
    "KINDS",
    "Envelope",
    "PartlyInvalid",
    "decode_envelope",
    "encode_envelope",
    "iter_envelopes",
    "iter_envelopes_from_lines",
    "kind_of",
    "problem_from_msgspec",
    "validate_envelope",
]

Envelope = SampleEnvelope | SysinfoEnvelope | JobsEnvelope | ClusterEnvelope | ErrorsEnvelope
"""What a decoder returns: one class per kind, plus `ErrorsEnvelope` for errors-only envelopes whose kind
was not given (see the module docstring)."""

KINDS = ("sample", "sysinfo", "job", "cluster")
"""The envelope kinds, named as Sonar's Kafka topics and hpcbus's NATS subjects name them."""

_DECODER = msgspec.json.Decoder(AnyEnvelope)
_PLAIN = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()

_KIND_OF_DATA: dict[type, str] = {
    SampleData: "sample",
    SysinfoData: "sysinfo",
    JobsData: "job",
    SpecJobsData: "job",
    ClusterData: "cluster",
}
_ENVELOPE_OF_KIND: dict[str, type[Envelope]] = {
    "sample": SampleEnvelope,
    "sysinfo": SysinfoEnvelope,
    "job": JobsEnvelope,
    "cluster": ClusterEnvelope,
}
_EXPECT = {"sample": "sample", "sysinfo": "sysinfo", "job": "job", "jobs": "job", "cluster": "cluster"}
_AT = re.compile(r"^(?P<reason>.*) - at `\$(?P<path>.*)`$", re.DOTALL)
_FIELD = re.compile(r"^Object (?P<what>missing required|contains unknown) field `(?P<name>.*)`$")
_BYTE = re.compile(r"\(byte (\d+)\)")


class PartlyInvalid(InvalidInput):
    """Some records of an envelope were refused alone (each problem names one, `slurm_jobs[i]...`);
    `envelope` is the rest, valid: an entry stores it and reports the problems as a partial refusal."""

    def __init__(self, problems: list[Problem], envelope: Envelope) -> None:
        super().__init__(problems)
        self.envelope = envelope


class _Partial(NamedTuple):
    """A valid envelope less the records refused alone, and their problems."""

    envelope: Envelope
    problems: list[Problem]


class _Rejected(NamedTuple):
    """A refused envelope: its problems, and where a JSON syntax error is (1-based line within it, or 0)."""

    problems: list[Problem]
    line: int = 0
    syntax: bool = False


def decode_envelope(raw: bytes | str, expect: str | None = None, *, latest: int | None = None) -> Envelope:
    """Decode and fully validate one envelope, or raise `InvalidInput` listing every problem found.

    `expect` ("sample", "sysinfo", "job"/"jobs", "cluster") is the kind the context promises: a mismatching
    `data.type` is then a problem, and an errors-only envelope gets that kind's class. Problems have `kind`
    ("sonar sample", ..., or "sonar envelope" when unknown), `path` and `reason`; `place` and `line` are left
    for the caller (`Problem.located`). Raises `PartlyInvalid` (an `InvalidInput`) when only some records
    were refused: its `envelope` is the rest, to be stored.

    `latest` (epoch s: the reader's now + max_future, `lineprotocol.parse.latest_of`) applies the time window
    line protocol has: the envelope's times (`data.attributes.time`, `system.boot`, the errors' `time`) must
    lie in [2000-01-01, latest], else the envelope is refused; a job record's submit, start or end time
    outside it refuses that record alone. Without it (envelopes built in Python, files of any age) any
    valid Timestamp is taken, as `parse_payload` without `max_future` takes any timestamp.
    """
    result = _decode(raw, _expected(expect), latest)
    if isinstance(result, _Rejected):
        raise InvalidInput(result.problems)
    if isinstance(result, _Partial):
        raise PartlyInvalid(result.problems, result.envelope)
    return result


def encode_envelope(env: Envelope) -> bytes:
    """Compact JSON, zero values omitted as Sonar omits them. It does not validate: see `validate_envelope`."""
    return _ENCODER.encode(env)


def validate_envelope(env: Envelope) -> list[Problem]:
    """Every problem of an envelope built in Python (eg by a producer), by the same rules as received data.

    It round-trips through the encoder and the decoder rather than re-implementing the checks, because struct
    constructors do not validate and the decoder is the one definition of "valid".
    """
    expect = kind_of(env) or None
    result = _decode(encode_envelope(env), expect)
    return result.problems if isinstance(result, _Rejected | _Partial) else []


def kind_of(env: Envelope) -> str:
    """The envelope's kind: one of `KINDS`, or "" for an `ErrorsEnvelope` (kind unknown)."""
    for kind, cls in _ENVELOPE_OF_KIND.items():
        if isinstance(env, cls):
            return kind
    return ""


def iter_envelopes(
    text: str, expect: str | None = None, *, latest: int | None = None
) -> Iterator[tuple[int, Envelope | InvalidInput]]:
    """Every envelope of a document: one envelope, JSONL, or pretty-printed envelopes back to back.

    Yields `(line, envelope or InvalidInput)` in input order, `line` being the 1-based line where the envelope
    starts; the problems of an `InvalidInput` carry that line too (the exact line for a JSON syntax error). A
    `PartlyInvalid` carries the rest of its envelope.
    A broken envelope never hides the ones after it. `latest`: the time window, as `decode_envelope`'s.
    """
    return iter_envelopes_from_lines(text.split("\n"), expect, latest=latest)


def iter_envelopes_from_lines(
    lines: Iterable[str], expect: str | None = None, *, latest: int | None = None
) -> Iterator[tuple[int, Envelope | InvalidInput]]:
    """`iter_envelopes` for a stream of lines (eg an open file), in constant memory for JSONL.

    A line that is a whole envelope (JSONL) is decoded directly, without scanning it; anything else goes
    through `framing.Splitter`, which buffers only the envelope being read. After a syntax error, reading
    resynchronises at the next line that starts with `{`.
    """
    splitter = Splitter()
    exp = _expected(expect)
    for lineno, raw_line in enumerate(lines, 1):
        line = raw_line[:-1] if raw_line.endswith("\n") else raw_line
        if splitter.idle and line.startswith("{") and line.rstrip().endswith("}"):
            result = _decode(line, exp, latest)
            whole = not (isinstance(result, _Rejected) and result.syntax)
            if whole or scan(line, 0, 0)[1] == len(line.rstrip()):
                for piece in splitter.flush_junk():
                    yield _from_piece(piece, exp, latest)
                yield lineno, _at_line(result, lineno)
                continue
        for piece in splitter.feed(lineno, line):
            yield _from_piece(piece, exp, latest)
    for piece in splitter.finish():
        yield _from_piece(piece, exp, latest)


def problem_from_msgspec(message: str) -> tuple[str, str]:
    """msgspec's "`reason` - at `$.a.b[3].c`" as `(path, reason)` in hpcbus's form: `a.b[3].c`.

    "missing required" / "unknown" field messages name the field in the reason; it moves into the path so
    that every problem's path is the field itself.
    """
    match = _AT.match(message)
    # At the root msgspec gives no location ("Object missing required field `meta`").
    reason, path = (match["reason"], match["path"].removeprefix(".")) if match else (message, "")
    field = _FIELD.match(reason)
    if field:
        path = diagnose.join(path, field["name"])
        reason = "missing required field" if field["what"] == "missing required" else "unknown field"
    return path, reason


# --- internals --------------------------------------------------------------------------------------------


def _expected(expect: str | None) -> str | None:
    if expect is None:
        return None
    try:
        return _EXPECT[expect]
    except KeyError:
        raise ValueError(f"unknown Sonar envelope kind {expect!r}; use one of {', '.join(_EXPECT)}") from None


def _label(kind: str | None) -> str:
    return f"sonar {kind}" if kind else "sonar envelope"


def _decode(
    raw: bytes | str, expect: str | None, latest: int | None = None
) -> Envelope | _Rejected | _Partial:
    try:
        env = _DECODER.decode(raw)
    except msgspec.ValidationError as exc:
        return _invalid(raw, expect, str(exc))
    except (msgspec.DecodeError, UnicodeError) as exc:
        # bytes that are not UTF-8: msgspec 0.22 raised UnicodeError, 0.23 a DecodeError
        bad_utf8 = _not_utf8(raw)
        if bad_utf8 is not None:
            return _Rejected([Problem(bad_utf8, kind=_label(expect))], 0, True)
        return _syntax(raw, expect, str(exc))
    except RecursionError:  # msgspec raises this, not DecodeError, past ~1000 levels of nesting
        return _syntax(raw, expect, _TOO_DEEP)
    data = env.data
    kind = _KIND_OF_DATA[type(data)] if data is not None else expect
    refused: dict[int, list[tuple[str, str]]] = {}
    found = _check(env, kind, expect, refused, latest)
    label = _label(kind)
    if found:
        found += [problem for _, problems in sorted(refused.items()) for problem in problems]
        return _Rejected([Problem(reason, kind=label, path=path) for path, reason in found])
    if refused and isinstance(env.data, JobsData):
        attrs = env.data.attributes
        attrs.slurm_jobs = [job for i, job in enumerate(attrs.slurm_jobs) if i not in refused]
        problems = [
            Problem(f"{reason}; this record is refused, the others are kept", kind=label, path=path)
            for _, record in sorted(refused.items())
            for path, reason in record
        ]
        return _Partial(_build(env, kind), problems)
    return _build(env, kind)


def _build(env: AnyEnvelope, kind: str | None) -> Envelope:
    """The kind's own envelope class around the decoded parts (a constructor call; nothing is copied)."""
    meta, data, errors = env.meta, env.data, env.errors
    if isinstance(data, SampleData):
        return SampleEnvelope(meta=meta, data=data, errors=errors)
    if isinstance(data, SysinfoData):
        return SysinfoEnvelope(meta=meta, data=data, errors=errors)
    if isinstance(data, JobsData):
        return JobsEnvelope(meta=meta, data=data, errors=errors)
    if isinstance(data, ClusterData):
        return ClusterEnvelope(meta=meta, data=data, errors=errors)
    cls = _ENVELOPE_OF_KIND.get(kind or "", ErrorsEnvelope)
    return cls(meta=meta, errors=errors)


def _check(
    env: AnyEnvelope,
    kind: str | None,
    expect: str | None,
    refused: dict[int, list[tuple[str, str]]],
    latest: int | None = None,
) -> list[tuple[str, str]]:
    """The rules msgspec cannot check, on a decoded envelope; only the fields they need are visited. The
    problems that refuse one record alone go to `refused` (by the record's index in `slurm_jobs`).

    Timestamps are checked here rather than by msgspec (see `types.Timestamp`): a set of strings already
    found valid makes the hundreds of repeated submit/start/end times of a jobs envelope cost a lookup each.
    With `latest`, each time must also lie in the window (`rules.time_window`).
    """
    out: list[tuple[str, str]] = []
    if env.meta.format:
        reason = rules.data_format(env.meta.format)
        if reason:
            out.append(("meta.format", reason))
    data = env.data
    if data is not None:
        if expect is not None and kind != expect:
            out.append(("data.type", f"expected a `{expect}` envelope, got data of type `{data.type}`"))
        attrs = data.attributes
        if attrs.time:  # optional: checked when present
            _check_time(attrs.time, "data.attributes.time", latest, out)
        if isinstance(data, SampleData):
            sample = data.attributes
            if sample.system.boot:
                _check_time(sample.system.boot, "data.attributes.system.boot", latest, out, optional=True)
            for i, job in enumerate(sample.jobs):
                if not job.job and not job.epoch:
                    out.append((f"data.attributes.jobs[{i}].job", rules.job_epoch(0, 0) or ""))
            _check_errors(sample.errors, "data.attributes.errors", out, latest)
        elif isinstance(data, JobsData):
            _check_slurm_jobs(data.attributes.slurm_jobs, out, refused, latest)
        elif isinstance(data, ClusterData):
            cluster = data.attributes
            for i, partition in enumerate(cluster.partitions):
                for j, text in enumerate(partition.nodes):
                    reason = rules.node_range(text)
                    if reason:
                        out.append((f"data.attributes.partitions[{i}].nodes[{j}]", reason))
            for i, group in enumerate(cluster.nodes):
                for j, text in enumerate(group.names):
                    reason = rules.node_range(text)
                    if reason:
                        out.append((f"data.attributes.nodes[{i}].names[{j}]", reason))
    _check_errors(env.errors, "errors", out, latest)
    both = rules.exclusive(data is not None, bool(env.errors))
    if both:
        out.append(both)
    return out


def _check_time(
    text: str, path: str, latest: int | None, out: list[tuple[str, str]], optional: bool = False
) -> None:
    """A present Timestamp (an OptionalTimestamp: `optional`) at `path`: valid, and in the window when
    `latest` is given."""
    reason = rules.timestamp(text, optional) if rules.TIMESTAMP.search(text) is None else None
    if reason is None and latest is not None:
        reason = rules.time_window(text, latest)
    if reason is not None:
        out.append((path, reason))


def _check_errors(errors: list[Error], path: str, out: list[tuple[str, str]], latest: int | None) -> None:
    for i, error in enumerate(errors):
        if error.time:
            _check_time(error.time, f"{path}[{i}].time", latest, out, optional=True)


def _check_slurm_jobs(
    jobs: list[SlurmJob],
    out: list[tuple[str, str]],
    refused: dict[int, list[tuple[str, str]]],
    latest: int | None = None,
) -> None:
    """`nodes` (host lists, `rules.job_nodes`: a bad one refuses its record alone, into `refused`) and
    `job_name` (made safe in place, `rules.safe_job_name`) of every job record, and its submit_time,
    start_time and end_time, each checked only when present.

    None of them is required: the spec requires only job_id, job_step, job_name and job_state in every
    record. A present empty submit_time never gets here (msgspec refuses it: a Timestamp is never empty).
    With `latest`, a time outside the window refuses its record alone (into `refused`), as a bad host list.
    """
    valid_time = rules.TIMESTAMP.search
    seen: set[str] = {""}  # valid strings (in the window); "" stands for an omitted time
    seen_nodes: set[str] = set()  # valid `nodes` entries (a jobs envelope repeats a few)
    for i, job in enumerate(jobs):
        for j, text in enumerate(job.nodes):
            if text not in seen_nodes:
                reason = rules.job_nodes(text)
                if reason:
                    refused.setdefault(i, []).append((f"data.attributes.slurm_jobs[{i}].nodes[{j}]", reason))
                else:
                    seen_nodes.add(text)
        if job.job_name:
            job.job_name = rules.safe_job_name(job.job_name)
        for field, text in (
            ("submit_time", job.submit_time),
            ("start_time", job.start_time),
            ("end_time", job.end_time),
        ):
            if text in seen:
                continue
            path = f"data.attributes.slurm_jobs[{i}].{field}"
            if valid_time(text) is None:
                out.append((path, rules.timestamp(text, optional=field != "submit_time") or ""))
            elif latest is not None and (reason := rules.time_window(text, latest)) is not None:
                refused.setdefault(i, []).append((path, reason))
            else:
                seen.add(text)


_TOO_DEEP = "JSON nested too deeply"


def _not_utf8(raw: bytes | str) -> str | None:
    """The reason "not valid UTF-8 (byte N)" when `raw` is bytes that are not UTF-8, else None."""
    if isinstance(raw, str):
        return None
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not valid UTF-8 (byte {exc.start})"
    return None


def _invalid(raw: bytes | str, expect: str | None, message: str) -> _Rejected:
    """msgspec refused the envelope: list every problem (see `schemas.sonar.diagnose`)."""
    first = problem_from_msgspec(message)
    try:
        value = _PLAIN.decode(raw)
    except (msgspec.DecodeError, UnicodeError) as exc:
        # The typed decoder stopped at `first` before reaching the syntax error further on.
        syntax = _syntax(raw, expect, str(exc))
        return _Rejected([Problem(first[1], kind=_label(expect), path=first[0]), *syntax.problems])
    except RecursionError:  # deeper than the decoder goes: the typed pass stopped at a wrong type first
        return _syntax(raw, expect, _TOO_DEEP)
    tag = diagnose.data_type(value)
    kind = _EXPECT[tag] if tag else expect
    found = diagnose.diagnose(value)
    if kind is not None and expect is not None and kind != expect:
        found.insert(0, ("data.type", f"expected a `{expect}` envelope, got data of type `{tag}`"))
    if not found:  # pragma: no cover - diagnose applies msgspec's own constraints, so it always finds one
        found = [first]
    return _Rejected([Problem(reason, kind=_label(kind), path=path) for path, reason in found])


def _syntax(raw: bytes | str, expect: str | None, message: str) -> _Rejected:
    """A JSON syntax error, with the line it is on when msgspec says which byte."""
    line = 0
    match = _BYTE.search(message)
    if match:
        data = raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw
        line = data.count(b"\n", 0, int(match[1])) + 1
    return _Rejected([Problem(f"invalid JSON: {message}", kind=_label(expect))], line, True)


def _at_line(result: Envelope | _Rejected | _Partial, start: int) -> Envelope | InvalidInput:
    if isinstance(result, _Partial):
        return PartlyInvalid(
            [msgspec.structs.replace(p, line=start) for p in result.problems], result.envelope
        )
    if not isinstance(result, _Rejected):
        return result
    line = start + result.line - 1 if result.line else start
    return InvalidInput([msgspec.structs.replace(p, line=line) for p in result.problems])


def _from_piece(piece: Piece, expect: str | None, latest: int | None) -> tuple[int, Envelope | InvalidInput]:
    if piece.problem:
        return piece.line, InvalidInput([Problem(piece.problem, line=piece.line, kind=_label(expect))])
    return piece.line, _at_line(_decode(piece.text, expect, latest), piece.line)
