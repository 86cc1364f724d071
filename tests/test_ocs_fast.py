"""The OCS ingest path gives, byte for byte, what it gave before it was made fast (issue 14).

The digests below were computed by the code before the speed-up (the key-by-key era of `Pipeline.process`)
over the same inputs: payloads with their subjects and message ids, every problem with its `PATH:LINE`, and
the record, job and event counts. The hpcbus version inside the envelopes' `meta` is replaced by a
placeholder first, so a release does not change them. The inputs cover the corpus (both formats), the
benchmark's records (serial, array and PE jobs, chunks that split a PE job), odd JSONL shapes that take the
general reader, bad lines, and a time no timestamp can hold.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from pathlib import Path
from typing import Any

import pytest
from msgspec import UNSET

from bench.ocs_ingest import check_output, ingest_output, output_digest, sample_lines
from hpcbus.producers.ocs import pipeline
from hpcbus.schemas import ccbackend
from hpcbus.schemas.lineprotocol import format_line
from hpcbus.schemas.ocs import AccountingRecord, accounting, mapping, parse_line, parse_usual
from hpcbus.schemas.ocs.typed import decode_usual
from hpcbus.schemas.ocs.updates import JobUpdate
from hpcbus.schemas.problems import InvalidInput
from tests.corpus import CORPUS
from tests.test_ocs_typed import ODD

GE = CORPUS / "gridengine"

BAD = [
    "{not json",
    '{"job_number": 7, "slots": "x"}',
    "a:b:c",
    '{"job_number": 77, "start_time": 1730532912874519, "end_time": 100000000000000000000}',
    "",
    "# a comment",
    '{"job_number": 78, "owner": "u", "hostname": "h", "type": "acct"}',
]


def _input() -> list[str]:
    jsonl = (GE / "ocs-9.0_accounting_sample_from-go-clusterscheduler-test.jsonl").read_text().splitlines()
    colon = (GE / "sge-colon_accounting_samples_from-apel-tests.txt").read_text().splitlines()
    lines = [*jsonl, *colon, *sample_lines(3000), *ODD, *BAD, *sample_lines(40)]
    return lines


@pytest.mark.parametrize(
    ("chunk_bytes", "max_payload", "start_jobs", "expected"),
    [
        (4 << 20, 512 * 1024, True, "314f1a3229299148d37234dcac173d83a99ba424d5d258d13147d7454940aadc"),
        (50_000, 20_000, True, "3f8cbf3637646feb6593b62f094953beb3146f85860d4a0b47ebf5d11e2bbd6d"),
        (7_000, 1_000, False, "a18a383d116670a9d3cc3be8c39e46b89d23ad3490e9b70a10b30d5b31b2f5e1"),
    ],
)
def test_output_is_what_it_was(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    chunk_bytes: int,
    max_payload: int,
    start_jobs: bool,
    expected: str,
) -> None:
    monkeypatch.chdir(tmp_path)  # problems name the file as given: the same text in every run
    path = Path("accounting")
    path.write_text("\n".join(_input()) + "\n")
    for reference in (False, True):  # the fast path, and the general one `make bench` compares it with
        options = {"max_chunk_bytes": chunk_bytes, "max_payload": max_payload, "start_jobs": start_jobs}
        assert output_digest(path, reference=reference, **options) == expected


def test_digest_sees_a_changed_byte(tmp_path: Path) -> None:
    """The digest is not blind: one changed byte of one record changes it."""
    lines = sample_lines(50)
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("\n".join(lines) + "\n")
    b.write_text("\n".join([*lines[:-1], lines[-1].replace('"owner":"', '"owner":"x')]) + "\n")
    assert output_digest(a) != output_digest(b)
    assert hashlib.sha256(a.read_bytes()).digest() != hashlib.sha256(b.read_bytes()).digest()


def test_positional_build_follows_the_record_fields() -> None:
    """`_from_usual` passes the record's fields by position: its order is the record's."""
    order = accounting._FIELD_ORDER
    assert order == AccountingRecord.__struct_fields__[: len(order)]


def test_bench_compares_with_the_reference_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`check_output` (what `make bench` asserts) passes on odd input and fails when the fast path errs."""
    monkeypatch.chdir(tmp_path)
    path = Path("accounting")
    path.write_text("\n".join(_input()) + "\n")
    check_output(path)
    real = mapping.map_jobs

    def one_event_lost(*args: Any, **kwargs: Any) -> mapping.MappedJobs:
        mapped = real(*args, **kwargs)
        return mapped._replace(event_text=mapped.event_text.partition("\n")[2])

    monkeypatch.setattr(pipeline, "map_jobs", one_event_lost)
    with pytest.raises(AssertionError, match="differs"):
        check_output(path)


@pytest.mark.parametrize("cluster", ["bench", "a b,c=d", ""])
def test_event_text_is_format_line(cluster: str) -> None:
    """`job_event_text` writes what `format_line` writes for the same events, escapes included."""
    record = AccountingRecord(
        job_number=5,
        owner='us"er\\',
        hostname="n1",
        hosts=("n1", "n2"),
        job_name='a "b" \\c\nd\re \u2028 \x01',
        start_time=100,
        end_time=200,
        slots=2,
    )
    update = JobUpdate(record, ended=True, final_now=True)
    events = mapping.job_events(update, cluster)
    assert len(events) == 2
    lines = mapping.job_event_lines(events, cluster)
    assert mapping.job_event_text(events, cluster) == "".join(format_line(x) + "\n" for x in lines)
    times = [mapping.event_time(p) for p in events]
    for p, t in zip(events, times, strict=True):  # a start and a stop event, each on its own
        assert ccbackend.job_event_text([p], [t], cluster=cluster, origin="o") == (
            format_line(ccbackend.job_event_line(p, t, cluster=cluster, origin="o")) + "\n"
        )
    assert ccbackend.job_event_text([], []) == ""


def test_timestamp_is_strftime() -> None:
    for seconds in [0, 59, 60, 3599, 86_399, 86_400, 951_782_400, 1_730_600_123, 253_402_300_799]:
        assert mapping.timestamp(seconds) == time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(seconds))


def _byte_lines() -> list[bytes]:
    base = sample_lines(1)[0]
    odd = [*ODD, *BAD, base + "\r", base.replace("run-", "läuft-"), " " + base, base + " "]
    return [x.encode() for x in odd] + [base.replace("run-", "r\xe4n-").encode("latin-1"), b"{", b"{}"]


@pytest.mark.parametrize("data", _byte_lines())
def test_parse_usual_is_parse_line(data: bytes) -> None:
    """Reading the usual record from the bytes gives what `parse_line` gives for the decoded line."""
    try:
        got: object = parse_usual(data)
    except InvalidInput as exc:
        got = [(p.path, p.reason) for p in exc.problems]
    if got is None:
        return  # the pipeline reads it by `parse_line` itself
    try:
        expected: object = parse_line(data.decode().removesuffix("\r"))
    except InvalidInput as exc:
        expected = [(p.path, p.reason) for p in exc.problems]
    assert got == expected


def test_not_utf8_is_read_as_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A line that is not UTF-8 takes the general way, with replacement characters, as before."""
    monkeypatch.chdir(tmp_path)
    lines = [x.encode() for x in sample_lines(20)]
    lines[3] = lines[3].replace(b"run-", b"r\xe4n-")
    Path("accounting").write_bytes(b"\n".join(lines) + b"\n")
    check_output("accounting")
    (batch,) = ingest_output("accounting")
    assert batch.records == 20 and not batch.problems
    assert "r\ufffdn-".encode() in batch.messages[0].payload


def test_rusage_doubles_take_the_lenient_typed_decode() -> None:
    """Counts written as doubles are still read by the typed decode (rounded), not left to the slow reader."""
    line = (
        sample_lines(1)[0]
        .replace('"ru_minflt":150001', '"ru_minflt":150001.6')
        .replace('"ru_nswap":0', '"ru_nswap":2.0')
    )
    usual = decode_usual(line)
    assert usual is not None and usual.usage is not UNSET
    assert (usual.usage.rusage.ru_minflt, usual.usage.rusage.ru_nswap) == (150002, 2)
    assert parse_line(line) == accounting._parse_jsonl_keys(line)


_DOUBLE_THEN_NOT_UTF8 = (
    b'{"job_number":9,"usage":{"rusage":{"ru_nswap":2.5}},"owner":"r\xe4n","hostname":"h"}'
)
"""A count the strict decode refuses (a double), then a byte the lenient one, reading further, cannot decode."""


def test_double_count_then_not_utf8_is_no_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Such a line is read as any line that is not UTF-8 (with a replacement character): no exception
    escapes the typed decode; with a bad value besides, it is a bad line with its place; the good lines
    around either are published."""
    assert decode_usual(_DOUBLE_THEN_NOT_UTF8) is None
    assert parse_usual(_DOUBLE_THEN_NOT_UTF8) is None
    p = pipeline.Pipeline("c", hostname="h")
    record = p.read_line(_DOUBLE_THEN_NOT_UTF8)
    assert record == parse_line(_DOUBLE_THEN_NOT_UTF8.decode("utf-8", "replace"))
    assert record is not None and record.owner == "r\ufffdn" and record.ru_nswap == 2
    bad = _DOUBLE_THEN_NOT_UTF8.replace(b'"hostname":"h"', b'"hostname":"h","slots":"x"')
    with pytest.raises(InvalidInput, match="slots"):
        p.read_line(bad)

    monkeypatch.chdir(tmp_path)
    good = [x.encode() for x in sample_lines(4)]
    Path("accounting").write_bytes(
        b"\n".join([good[0], _DOUBLE_THEN_NOT_UTF8, good[1], bad, *good[2:]]) + b"\n"
    )
    check_output("accounting")
    (batch,) = ingest_output("accounting")
    assert batch.records == 5 and batch.jobs == 5
    assert [(x.place, x.line, x.path) for x in batch.problems] == [("accounting", 4, "slots")]
    assert all(f'\\"job_id\\":{n},'.encode() in batch.messages[0].payload for n in (100001, 100004, 9))


def test_read_line_tries_the_typed_decode_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """A JSONL line of another shape goes from `parse_usual` straight to the key-by-key reader."""
    calls: list[object] = []

    def counted(line: str | bytes) -> object:
        calls.append(line)
        return decode_usual(line)

    monkeypatch.setattr(accounting, "decode_usual", counted)
    # the compiled reader decodes alone
    monkeypatch.setattr(pipeline.Pipeline, "usual", staticmethod(accounting.parse_usual_pure))
    p = pipeline.Pipeline("c", hostname="h")
    for line in [*ODD, " " + ODD[0], sample_lines(1)[0]]:
        calls.clear()
        with contextlib.suppress(InvalidInput):
            p.read_line(line.encode())
        assert len(calls) == 1, line
