"""One chunk of accounting lines -> the NATS messages that carry it, with deterministic `Nats-Msg-Id`s.

Why per chunk: a chunk is what the follower read in one go and what is acknowledged as a whole, so one
chunk gives one jobs envelope (docs/mapping.md section 6), one message of stop_job events and one of problem
log lines. The message id is `ocs:<cluster>:<inode>:<start>-<end>:<hash>:<kind>:<n>` (file, byte range and
hash of the chunk's bytes, subject kind, message number): the same chunk read again after a crash (the
follower re-cuts it at the same bytes) gets the same ids, and JetStream drops what it already stored; a
truncated file written anew never reuses an id, even at the same offsets. Unlike `translate.msg_id`
the id does not hash the payload: the envelope carries the poll time, and after a restart a job's record
may be merged from fewer parts, so the same lines would not give the same bytes. Payloads are packed as
`translate.batch` packs them (lines never split, at most `MAX_PAYLOAD` bytes); the cc-backend events are
written as text directly (`mapping.job_event_text`) and cut by `split_payloads` at the same places.

Speed (issue 14): the usual JSONL line is read straight from its bytes by the typed decode
(`schemas.ocs.parse_usual`); `bench/ocs_ingest.py` checks that the output equals the general path's (every
line read key by key, every event a formatted `Line`) and `tests/test_ocs_fast.py` that it equals what
this module published before it was made fast. Issue 24: where the C extension is built (`schemas/ocs/_read.c`)
a chunk of usual lines is read in one call (`parse_usual_lines`), its jobs merged (`JobMerger.add`) and mapped
(`mapping.map_jobs`) by C, each with its Python twin as the reference (tests/test_compiled_ocs.py); the
jobs envelope is written as text directly too (`mapping.envelope_text`: its records encoded once, its JSON
escaped by C) and cut by `split_payloads` where `batch` would cut its `envelope_lines`.

No I/O here, so `--once`, the service and the benchmark share it.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from hpcbus.producers.ocs.follow import Chunk
from hpcbus.schemas import subjects
from hpcbus.schemas.hostnames import HostnameForm, host_name
from hpcbus.schemas.message import Message
from hpcbus.schemas.ocs import KIND, AccountingRecord, is_skippable, parse_jsonl_line, parse_line, parse_usual
from hpcbus.schemas.ocs.accounting import parse_usual_lines
from hpcbus.schemas.ocs.mapping import (
    MappedJobs,
    envelope_text,
    jobs_envelope,
    map_jobs,
    problem_line,
)
from hpcbus.schemas.ocs.updates import JobMerger, JobUpdate
from hpcbus.schemas.problems import InvalidInput, Problem
from hpcbus.schemas.sonar.types import SlurmJob
from hpcbus.schemas.translate import MAX_PAYLOAD, batch
from hpcbus.schemas.translate.bus import split_payloads

__all__ = ["MAX_PAYLOAD", "Batch", "Pipeline"]


class Batch(msgspec.Struct, kw_only=True):
    """What one chunk became."""

    chunk: Chunk
    messages: list[Message]
    problems: list[Problem]
    """Every bad line (and the file's own problems), located `PATH:LINE`; also in a `log` message."""
    records: int
    """Accounting records parsed (before merging)."""
    jobs: int
    """Job records in the envelope."""
    events: int
    """cc-backend event lines."""


class Pipeline:
    """Parses, merges and maps chunks of one cluster's accounting file; keeps the `JobMerger` across them."""

    usual = staticmethod(parse_usual)
    """The reader of one usual JSONL record (`read_line`), compiled where built."""
    usual_lines = staticmethod(parse_usual_lines) if parse_usual_lines is not None else None
    """The reader of a chunk of usual records in one call (`parse`), None where not built; a subclass that
    reads its lines otherwise sets it None (`bench.ocs_ingest`)."""

    def __init__(
        self,
        cluster: str,
        *,
        hostname: str,
        start_jobs: bool = True,
        merger: JobMerger | None = None,
        max_payload: int = MAX_PAYLOAD,
        prefix: str = "",
        hostname_form: HostnameForm = "as-is",
        hostname_domain: str = "",
    ) -> None:
        self.cluster = cluster
        self.form = hostname_form
        """The site's host-name form (docs/mapping.md section 3), for every node name published: the job
        records' `nodes`, start_job `resources` and the `hostname` of the log lines."""
        self.domain = hostname_domain
        self.hostname = host_name(hostname, hostname_form, hostname_domain)
        self.start_jobs = start_jobs
        self.merger = merger if merger is not None else JobMerger()
        self.max_payload = max_payload
        self.subject_slurm = subjects.events(cluster, "slurm", prefix=prefix)
        self.subject_job = subjects.events(cluster, "job", prefix=prefix)
        self.subject_log = subjects.log(cluster, "hpcbus", prefix=prefix)

    def parse(self, chunk: Chunk) -> tuple[list[AccountingRecord], list[int], list[Problem]]:
        """Records with their line numbers, and the problems of the lines that are not records."""
        problems = list(chunk.problems)
        if self.usual_lines is not None:
            usual = self.usual_lines(chunk.lines)  # type: ignore[arg-type]  # RawLine is a NumberedLine
            if usual is not None:  # every line the usual record: the compiled reader took them all
                return usual[0], usual[1], problems
        records: list[AccountingRecord] = []
        numbers: list[int] = []
        read = self.read_line
        for raw in chunk.lines:
            try:
                record = read(raw.text)
            except InvalidInput as exc:
                problems.extend(
                    msgspec.structs.replace(p, place=chunk.place, line=raw.number) for p in exc.problems
                )
                continue
            if record is not None:
                records.append(record)
                numbers.append(raw.number)
        return records, numbers, problems

    def read_line(self, data: bytes) -> AccountingRecord | None:
        """The record of one line (without its newline); None for a line that holds none (blank, comment).
        Raises `InvalidInput` for a bad one. The usual JSONL record is read without decoding it to text; a
        JSONL line `parse_usual` could not read is read key by key, not tried by the typed decode again.
        (`bench.ocs_ingest.PurePipeline` reads with `parse_usual_pure`; `ReferencePipeline` overrides this,
        `map_updates`, `event_payloads` and `envelope_payloads` with the general path.)"""
        record = self.usual(data)
        if record is None:
            text = data.decode("utf-8", "replace")
            if is_skippable(text):
                return None
            text = text.removesuffix("\r")
            if data[:1] == b"{":  # what `parse_usual` tried: `parse_line` would take it to `parse_jsonl_line`
                return parse_jsonl_line(text, typed=False)
            record = parse_line(text)
        return record

    def map_updates(self, updates: list[JobUpdate], now: int) -> MappedJobs:
        """The Sonar records and event lines of the chunk's job updates (`mapping.map_jobs`: compiled where
        the extension is built)."""
        return map_jobs(
            updates, self.cluster, now=now, start_jobs=self.start_jobs, form=self.form, domain=self.domain
        )

    def event_payloads(self, mapped: MappedJobs) -> list[bytes]:
        """The messages of the events' lines, as `batch` would pack their `job_event_line`s, without a `Line`
        per event (`mapped.event_text`)."""
        return split_payloads(mapped.event_text.encode(), self.max_payload)

    def envelope_payloads(self, jobs: list[SlurmJob], now: int) -> list[bytes]:
        """The messages of the chunk's jobs envelope, as `batch` would pack its `envelope_lines`, without a
        `Line` per part (`mapping.envelope_text`: the JSON escaped by C where the extension is built)."""
        text = envelope_text(jobs_envelope(jobs, self.cluster, now), self.cluster)
        return split_payloads(text, self.max_payload)

    def process(self, chunk: Chunk, *, now: int) -> Batch:
        records, numbers, problems = self.parse(chunk)
        updates = self.merger.add(records, numbers)
        mapped = self.map_updates(updates, now)
        for i, exc in mapped.failures:
            update = updates[i]
            r = update.record
            problems.append(
                Problem(
                    str(exc),
                    place=chunk.place,
                    line=update.first_line,
                    kind=KIND,
                    path=f"job {r.job_number}" + (f".{r.task_number}" if r.task_number else ""),
                )
            )
        jobs = mapped.jobs
        groups: list[tuple[str, str, Iterable[bytes]]] = []
        if jobs:
            groups.append((self.subject_slurm, "slurm", self.envelope_payloads(jobs, now)))
        if mapped.events:
            groups.append((self.subject_job, "job", self.event_payloads(mapped)))
        if problems:
            logs = [problem_line(p, cluster=self.cluster, hostname=self.hostname, now=now) for p in problems]
            groups.append((self.subject_log, "log", batch(logs, self.max_payload)))
        prefix = f"ocs:{self.cluster}:{chunk.inode}:{chunk.start.offset}-{chunk.end.offset}:{chunk.digest}"
        messages = []
        for subject, kind, payloads in groups:
            for n, payload in enumerate(payloads):
                messages.append(Message(subject, payload, f"{prefix}:{kind}:{n}"))
        return Batch(
            chunk=chunk,
            messages=messages,
            problems=problems,
            records=len(records),
            jobs=len(jobs),
            events=mapped.events,
        )
