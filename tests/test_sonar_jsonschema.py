"""The committed JSON Schema files match the structs, and say what the decoder enforces."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from hpcbus.commands import schemas as schema_files
from schemas.sonar import jsonschema
from schemas.sonar.types import HOSTNAME_PATTERN, OPTIONAL_TIMESTAMP_PATTERN


def test_schema_files_match_the_structs() -> None:
    stale = [str(p) for p in schema_files.stale_files()]
    assert not stale, f"{', '.join(stale)} out of date with schemas/sonar/types.py: run `make schemas`"


def test_check_mode_reports_drift(tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setattr(schema_files, "OUT_DIR", tmp_path)
    assert schema_files.main(["--check"]) == 1
    assert "run `make schemas`" in capsys.readouterr().err
    assert schema_files.main([]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"{k}.schema.json" for k in sorted(jsonschema.ENVELOPES)
    ]
    assert schema_files.main(["--check"]) == 0


def load(kind: str) -> dict[str, Any]:
    return json.loads((schema_files.OUT_DIR / f"{kind}.schema.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("kind", sorted(jsonschema.ENVELOPES))
def test_envelope_schema_shape(kind: str) -> None:
    schema = load(kind)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    envelope = schema["$defs"][schema["$ref"].rsplit("/", 1)[1]]
    assert envelope["required"] == ["meta"]
    assert envelope["additionalProperties"] is False
    assert [branch["required"] for branch in envelope["oneOf"]] == [["data"], ["errors"]]
    error = schema["$defs"]["Error"]
    assert error["required"] == ["detail"]
    assert error["properties"]["time"]["pattern"] == OPTIONAL_TIMESTAMP_PATTERN
    assert error["properties"]["node"]["pattern"] == HOSTNAME_PATTERN
    assert error["properties"]["time"]["description"].startswith(
        "Time when the error was generated. [OptionalTimestamp"
    )


def test_job_schema_accepts_both_spellings_and_documents_fields() -> None:
    defs = load("job")["$defs"]
    assert defs["JobsData"]["properties"]["type"]["enum"] == ["job"]
    assert defs["SpecJobsData"]["properties"]["type"]["enum"] == ["jobs"]
    sacct = defs["SacctData"]["properties"]
    assert "MinCPU" in sacct and "min_cpu" not in sacct
    assert sacct["MinCPU"]["description"].startswith("Minimum (system + user) CPU time")
    slurm_job = defs["SlurmJob"]
    assert slurm_job["required"] == ["job_id", "job_state", "submit_time"]
    assert slurm_job["properties"]["array_job_id"]["minimum"] == 1


def test_sample_schema_has_real_sonar_fields_and_the_epoch_rule() -> None:
    defs = load("sample")["$defs"]
    assert {"boot", "disks", "load1", "load5", "load15", "runnable_entities", "existing_entities"} <= set(
        defs["SampleSystem"]["properties"]
    )
    assert {"in_container", "num_threads", "data_read", "data_written", "data_cancelled"} <= set(
        defs["SampleProcess"]["properties"]
    )
    assert "not" in defs["SampleJob"]


def test_patterns_are_valid_ecmascript_and_python() -> None:
    """No Python-only syntax (`\\d`, `\\Z`, named groups) in patterns a JSON Schema validator will run."""
    for kind in jsonschema.ENVELOPES:
        text = json.dumps(load(kind))
        for pattern in re.findall(r'"pattern": "((?:[^"\\]|\\.)*)"', text):
            source = json.loads(f'"{pattern}"')
            re.compile(source)
            assert not re.search(r"\\[dZAz]|\(\?P", source), source
