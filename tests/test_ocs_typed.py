"""The typed OCS decode (schemas/ocs/typed.py) gives exactly the record the key-by-key reader gives, and
leaves every record it cannot read exactly to that reader (which names the bad keys)."""

from __future__ import annotations

import json

import pytest

from bench.ocs_ingest import sample_lines
from hpcbus.schemas.ocs import accounting
from hpcbus.schemas.ocs.accounting import parse_jsonl_line
from hpcbus.schemas.ocs.typed import decode_usual
from hpcbus.schemas.problems import InvalidInput
from tests.corpus import CORPUS

JSONL_FILE = CORPUS / "gridengine/ocs-9.0_accounting_sample_from-go-clusterscheduler-test.jsonl"

BASE = json.loads(sample_lines(1)[0])


def _variant(**changes: object) -> str:
    record = dict(BASE, **changes)
    return json.dumps({k: v for k, v in record.items() if v is not _DROP})


_DROP = object()

ODD = [
    _variant(pe_task_id="NONE"),
    _variant(pe_task_id="1.c0001", pe_taskid="NONE"),
    _variant(pe_taskid=_DROP),
    _variant(time=1_730_532_912_874_519, type="acct"),
    _variant(project="NONE", department="none", category=""),
    _variant(usage={"rusage": {"ru_maxrss": 12.6, "ru_utime": 3}, "eusage": {"maxrss": 1.5e8, "ioops": 7}}),
    _variant(usage={"rusage": {}, "usage": {"cpu": 1.0}}),  # 9.0.0-9.0.5 name eusage `usage`
    _variant(usage={"rusage": {"ru_utime": 1.0}, "custom": {"x": 1}}),
    _variant(usage=_DROP),
    _variant(usage=_DROP, ru_utime=2.5, cpu=1.0),  # the flat development layout
    _variant(unknown_key="kept in extra"),
    _variant(owner=None),
    _variant(slots=4.0),
    _variant(job_number=0),
    _variant(start_time=-5),
    _variant(job_number=_DROP),
    _variant(type="new_job"),
    _variant(usage={"rusage": {"ru_utime": "x"}}),
    _variant(exit_status=True),
]


def _lines() -> list[str]:
    corpus = [line for line in JSONL_FILE.read_text().splitlines() if line.strip()]
    return corpus + sample_lines(200) + ODD


@pytest.mark.parametrize("line", _lines())
def test_typed_equals_key_by_key(line: str) -> None:
    try:
        expected: object = accounting._parse_jsonl_keys(line)
    except InvalidInput as exc:
        expected = [(p.path, p.reason) for p in exc.problems]
    try:
        got: object = parse_jsonl_line(line)
    except InvalidInput as exc:
        got = [(p.path, p.reason) for p in exc.problems]
    assert got == expected


def test_typed_takes_the_usual_records() -> None:
    """The fast way is the one taken for what OCS writes (else it would only cost time)."""
    corpus = [line for line in JSONL_FILE.read_text().splitlines() if line.strip()]
    assert all(decode_usual(line) is not None for line in corpus + sample_lines(200))
    assert decode_usual(_variant(unknown_key=1)) is None and decode_usual(_variant(slots=4.0)) is None
