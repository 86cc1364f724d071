"""Ingest rate of the accounting follower, for `bench/` (`make bench`).

What is timed is everything the service does per record except the network: read the file in chunks, parse
each line, merge PE tasks, build the Sonar records, the jobs envelope and the stop_job events, and format the
NATS payloads. The baseline is bare `json.loads` of every line of the same file, the least any JSONL
reader has to do. Both use process CPU time (like `bench.timing.best_of`), excluding writing the file.

    from bench.ocs_ingest import bench_baseline, bench_ingest
    records, seconds = bench_ingest(100_000)

`check_output(path)` asserts that the fast path publishes byte for byte what the general path does
(`ReferencePipeline`); `output_digest` names an ingest's whole output in one hash (tests/test_ocs_fast.py).
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from hpcbus import __version__
from hpcbus.producers.ocs.follow import MAX_CHUNK_BYTES, Follower
from hpcbus.producers.ocs.pipeline import MAX_PAYLOAD, Batch, Pipeline
from hpcbus.schemas.ccbackend import StartJob, StopJob
from hpcbus.schemas.lineprotocol import Line
from hpcbus.schemas.ocs import AccountingRecord, accounting, is_skippable, parse_line
from hpcbus.schemas.ocs.mapping import (
    MappedJobs,
    envelope_lines,
    envelope_text,
    job_event_lines,
    job_events,
    jobs_envelope,
    map_jobs_pure,
    slurm_job,
)
from hpcbus.schemas.ocs.updates import JobMerger, JobUpdate
from hpcbus.schemas.sonar.types import SlurmJob
from hpcbus.schemas.translate import batch
from hpcbus.schemas.translate.bus import split_payloads

__all__ = [
    "PurePipeline",
    "ReferencePipeline",
    "bench_baseline",
    "bench_ingest",
    "check_output",
    "ingest_file",
    "ingest_output",
    "output_digest",
    "sample_lines",
    "write_sample",
]

_BASE_TIME = 1_730_532_912_874_519  # µs, as OCS writes times


def sample_lines(n_records: int) -> list[str]:
    """`n_records` OCS 9.1 JSONL accounting lines of a busy cluster (deterministic, no randomness).

    Mostly serial jobs on 512 hosts, every 10th an array task, every 25th job a 4-host PE job written as
    three PE-task records plus the master record (so 4 of the lines), as without `accounting_summary`.
    """
    lines: list[str] = []
    job = 100_000
    while len(lines) < n_records:
        job += 1
        submit = _BASE_TIME + job * 7_000_000
        start = submit + 5_000_000
        end = start + (job % 3600 + 1) * 1_000_000
        host = f"c{job % 512:04d}"
        common = {
            "job_number": job,
            "task_number": job % 7 + 1 if job % 10 == 0 else 0,
            "start_time": start,
            "end_time": end,
            "owner": f"user{job % 97}",
            "group": "users",
            "account": "sge",
            "qname": "all.q",
            "department": "defaultdepartment",
            "job_name": f"run-{job % 1000}.sh",
            "priority": 0,
            "submission_time": submit,
            "submit_cmd_line": f"qsub -l h_rt=7200 run-{job % 1000}.sh",
            "category": "-U users -l h_rt=7200,h_vmem=4G",
            "failed": 0,
            "exit_status": 0 if job % 13 else 1,
        }
        if job % 25 == 0:
            for task in range(3):
                record = dict(
                    common,
                    hostname=f"c{(job + task + 1) % 512:04d}",
                    slots=4,
                    granted_pe="mpi",
                    pe_taskid=f"1.c{(job + task + 1) % 512:04d}",
                )
                record["usage"] = _usage(job + task, end - start)
                lines.append(json.dumps(record, separators=(",", ":")))
            slots, pe = 16, "mpi"
        else:
            slots, pe = 1, None
        record = dict(common, hostname=host, slots=slots, pe_taskid="NONE")
        if pe:
            record["granted_pe"] = pe
        record["usage"] = _usage(job, end - start)
        lines.append(json.dumps(record, separators=(",", ":")))
    return lines[:n_records]


def _usage(seed: int, wall_us: int) -> dict[str, dict[str, float]]:
    wall = wall_us / 1e6
    return {
        "rusage": {
            "ru_wallclock": int(wall),
            "ru_utime": wall * 0.9,
            "ru_stime": wall * 0.05,
            "ru_maxrss": 100_000 + seed % 5000,
            "ru_ixrss": 0,
            "ru_ismrss": 0,
            "ru_idrss": 0,
            "ru_isrss": 0,
            "ru_minflt": 50_000 + seed,
            "ru_majflt": seed % 7,
            "ru_nswap": 0,
            "ru_inblock": seed % 1000,
            "ru_oublock": seed % 333,
            "ru_msgsnd": 0,
            "ru_msgrcv": 0,
            "ru_nsignals": 0,
            "ru_nvcsw": 1000 + seed % 100,
            "ru_nivcsw": 10 + seed % 10,
        },
        "eusage": {
            "wallclock": wall + 1.5,
            "cpu": wall * 0.95,
            "mem": wall * 0.4,
            "io": 0.001 * (seed % 100),
            "ioops": seed % 10_000,
            "iow": 0.0,
            "maxvmem": 2.0e9 + seed,
            "maxrss": 1.0e8 + seed,
        },
    }


def write_sample(path: str | Path, n_records: int) -> int:
    """Write `sample_lines(n_records)` to `path`; the number of lines written."""
    lines = sample_lines(n_records)
    Path(path).write_text("\n".join(lines) + "\n")
    return len(lines)


def ingest_file(path: str | Path, cluster: str = "bench", *, pure: bool = False) -> int:
    """Follow `path` from its start to its end once, building every payload the service would publish;
    the number of accounting records read. `pure`: by the pure-Python path (`PurePipeline`), as with
    `HPCBUS_PURE=1`, whatever is built."""
    return sum(b.records for b in _batches(path, cluster=cluster, pure=pure))


def _baseline_file(path: Path) -> int:
    records = 0
    with path.open("rb") as fh:
        for line in fh:
            json.loads(line)
            records += 1
    return records


def _timed(n_records: int, ours: bool, pure: bool = False) -> tuple[int, float]:
    with tempfile.TemporaryDirectory(prefix="hpcbus-ocs-bench-") as tmp:
        path = Path(tmp) / "accounting.jsonl"
        write_sample(path, n_records)
        started = time.process_time()
        records = ingest_file(path, pure=pure) if ours else _baseline_file(path)
        return records, time.process_time() - started


def bench_ingest(n_records: int, *, pure: bool = False) -> tuple[int, float]:
    """(records ingested, CPU seconds) for a sample file of `n_records` lines, by the whole follower path
    (compiled where built; `pure`: the pure-Python path)."""
    return _timed(n_records, ours=True, pure=pure)


def bench_baseline(n_records: int) -> tuple[int, float]:
    """(records, CPU seconds) of bare `json.loads` per line on the same sample file."""
    return _timed(n_records, ours=False)


def ingest_output(
    path: str | Path,
    *,
    cluster: str = "bench",
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
    max_payload: int = MAX_PAYLOAD,
    start_jobs: bool = True,
    reference: bool = False,
) -> list[Batch]:
    """Every batch of following `path` once from its start, as the service would publish them (by the
    `ReferencePipeline` with `reference`)."""
    return list(
        _batches(
            path,
            cluster=cluster,
            max_chunk_bytes=max_chunk_bytes,
            max_payload=max_payload,
            start_jobs=start_jobs,
            reference=reference,
        )
    )


def _batches(
    path: str | Path,
    *,
    cluster: str,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
    max_payload: int = MAX_PAYLOAD,
    start_jobs: bool = True,
    reference: bool = False,
    pure: bool = False,
) -> Iterator[Batch]:
    """The batches of following `path` once from its start, one by one (`ingest_file` keeps none of them)."""
    follower = Follower(str(path), max_chunk_bytes=max_chunk_bytes)
    kind = ReferencePipeline if reference else PurePipeline if pure else Pipeline
    pipeline = kind(cluster, hostname="bench", max_payload=max_payload, start_jobs=start_jobs)
    try:
        while True:
            for chunk in follower.read():
                yield pipeline.process(chunk, now=1_730_600_000)
            if not follower.behind:
                break
    finally:
        follower.close()


class _PureMerger(JobMerger):
    """`JobMerger` on its pure-Python path."""

    def add(self, records: Iterable[AccountingRecord], lines: Iterable[int] = ()) -> list[JobUpdate]:
        return self.add_pure(records, lines)


class PurePipeline(Pipeline):
    """`Pipeline` on its pure-Python path (what `HPCBUS_PURE=1` runs), in this process whatever is built: the
    "before" of the compiled path's ratio. Lines read by `parse_usual_pure` one by one, jobs merged by
    `JobMerger.add_pure`, mapped by `map_jobs_pure`, the envelope's JSON escaped by `escape_field_pure`."""

    usual = staticmethod(accounting.parse_usual_pure)
    usual_lines = None

    def __init__(self, cluster: str, **options: Any) -> None:
        super().__init__(cluster, merger=_PureMerger(), **options)

    def map_updates(self, updates: list[JobUpdate], now: int) -> MappedJobs:
        return map_jobs_pure(
            updates, self.cluster, now=now, start_jobs=self.start_jobs, form=self.form, domain=self.domain
        )

    def envelope_payloads(self, jobs: list[SlurmJob], now: int) -> list[bytes]:
        text = envelope_text(jobs_envelope(jobs, self.cluster, now), self.cluster, pure=True)
        return split_payloads(text, self.max_payload)


class ReferencePipeline(Pipeline):
    """The general path the fast one must equal: every line read key by key (`_parse_jsonl_keys`, not the
    typed decode or the compiled reader, after decoding it to text), every job mapped by `slurm_job` and
    `job_events` (not the compiled `map_jobs`), every event and the jobs envelope built as `Line`s and packed
    by `batch` (not `job_event_text`, `envelope_text`). The rest is `Pipeline`'s own."""

    event_lines: list[Line] = []
    """The event lines of the chunk `map_updates` mapped last (for `event_payloads`)."""
    usual_lines = None

    def __init__(self, cluster: str, **options: Any) -> None:
        super().__init__(cluster, merger=_PureMerger(), **options)

    def read_line(self, data: bytes) -> AccountingRecord | None:
        text = data.decode("utf-8", "replace")
        if is_skippable(text):
            return None
        text = text.removesuffix("\r")
        return accounting._parse_jsonl_keys(text) if text.lstrip().startswith("{") else parse_line(text)

    def map_updates(self, updates: list[JobUpdate], now: int) -> MappedJobs:
        jobs: list[SlurmJob] = []
        events: list[StartJob | StopJob] = []
        failures: list[tuple[int, ValueError]] = []
        for i, update in enumerate(updates):
            try:
                jobs.append(slurm_job(update, now=now, form=self.form, domain=self.domain))
            except ValueError as exc:
                failures.append((i, exc))
                continue
            events.extend(
                job_events(
                    update, self.cluster, start_jobs=self.start_jobs, form=self.form, domain=self.domain
                )
            )
        self.event_lines = job_event_lines(events, self.cluster)
        return MappedJobs(jobs, "", len(events), failures)

    def event_payloads(self, mapped: MappedJobs) -> list[bytes]:
        return list(batch(self.event_lines, self.max_payload))

    def envelope_payloads(self, jobs: list[SlurmJob], now: int) -> list[bytes]:
        envelope = jobs_envelope(jobs, self.cluster, now)
        return list(batch(envelope_lines(envelope, self.cluster), self.max_payload))


def check_output(path: str | Path) -> None:
    """Raise AssertionError unless the fast path's output for `path` (compiled where built) is the reference
    path's and the pure path's."""
    fast, reference, pure = (
        [
            (b.messages, [str(p) for p in b.problems], b.records, b.jobs, b.events)
            for b in _batches(path, cluster="bench", reference=kind == "reference", pure=kind == "pure")
        ]
        for kind in ("fast", "reference", "pure")
    )
    assert fast == reference, "OCS ingest: the fast path's output differs from the reference path's"
    assert fast == pure, "OCS ingest: the compiled path's output differs from the pure path's"


def output_digest(path: str | Path, **options: Any) -> str:
    """SHA-256 of everything `ingest_output` gives (subjects, payloads, message ids, problems with their
    `PATH:LINE`, counts), the hpcbus version in envelopes replaced by a placeholder and the file's inode
    in message ids by `I`, so a digest stored in a test survives releases (give `path` relative: problems
    name it)."""
    h = hashlib.sha256()
    version = f'"version":"{__version__}"'.encode()
    for b in ingest_output(path, **options):
        inode = f":{b.chunk.inode}:"
        h.update(f"batch {b.records} {b.jobs} {b.events} {len(b.messages)}\n".encode())
        for m in b.messages:
            h.update(m.subject.encode() + b"\n" + m.msg_id.replace(inode, ":I:", 1).encode() + b"\n")
            h.update(m.payload.replace(version, b'"version":"V"') + b"\n")
        for p in b.problems:
            h.update(str(p).encode() + b"\n")
    return h.hexdigest()
