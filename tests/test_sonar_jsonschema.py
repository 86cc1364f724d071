"""The committed JSON Schema files match the structs, and say what the decoder enforces."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from hpcbus.commands.dev import schemas as schema_files
from hpcbus.schemas.sonar import jsonschema
from hpcbus.schemas.sonar.types import CLUSTERNAME_PATTERN, HOSTNAME_PATTERN, OPTIONAL_TIMESTAMP_PATTERN


def test_schema_files_match_the_structs() -> None:
    stale = [str(p) for p in schema_files.stale_files()]
    assert not stale, (
        f"{', '.join(stale)} out of date with the structs in schemas/sonar/types/: run `make schemas`"
    )


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
    assert envelope["required"] == []  # issue 10: `meta` is optional (default: the empty object)
    assert envelope["additionalProperties"] is False
    assert [branch["required"] for branch in envelope["oneOf"]] == [["data"], ["errors"]]
    error = schema["$defs"]["Error"]
    assert error["required"] == []  # issue 10: `detail` is optional too
    assert error["properties"]["time"]["pattern"] == OPTIONAL_TIMESTAMP_PATTERN
    assert error["properties"]["node"]["pattern"] == HOSTNAME_PATTERN
    assert error["properties"]["cluster"]["pattern"] == CLUSTERNAME_PATTERN  # Sonar 0.19's Clustername
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
    assert slurm_job["required"] == ["job_id", "job_state"]  # issue 10: submit_time may be absent
    assert "default" not in slurm_job["properties"]["submit_time"]  # absent, not "" (which is refused)
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


# --- Issue 10: SlurmJob records with only the spec's mandatory fields ---------------------------------------
# `jsonschema` is not a dependency, so the committed schema is applied by this small evaluator of the keywords
# the generated files use; it is itself tested against records the schema must refuse.

_TYPES: dict[str, Any] = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "null": type(None),
}


def schema_errors(value: Any, schema: dict[str, Any], root: dict[str, Any], path: str = "") -> list[str]:
    """Why `value` does not satisfy `schema` (draft 2020-12, the keywords in `schemas/json/`); [] if it does."""
    if "$ref" in schema:
        target = root
        for part in schema["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        errs = schema_errors(value, target, root, path)
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        return errs + (schema_errors(value, rest, root, path) if rest else [])
    errs: list[str] = []
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        ok = any(
            isinstance(value, _TYPES[k]) and not (k in ("integer", "number") and isinstance(value, bool))
            for k in kinds
        )
        if not ok:
            return [f"{path}: not {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{path}: not in {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        errs.append(f"{path}: not {schema['const']!r}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", len(value)):
            errs.append(f"{path}: length")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errs.append(f"{path}: pattern")
    number = isinstance(value, int) and not isinstance(value, bool)
    if number and not schema.get("minimum", value) <= value <= schema.get("maximum", value):
        errs.append(f"{path}: range")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errs.append(f"{path}: too few items")
        for i, item in enumerate(value):
            errs += schema_errors(item, schema.get("items", {}), root, f"{path}[{i}]")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        errs += [f"{path}.{name}: missing" for name in schema.get("required", []) if name not in value]
        for key, item in value.items():
            if key in props:
                errs += schema_errors(item, props[key], root, f"{path}.{key}")
            elif schema.get("additionalProperties") is False:
                errs.append(f"{path}.{key}: unknown")
    if "anyOf" in schema:
        branches = [schema_errors(value, s, root, path) for s in schema["anyOf"]]
        if all(branches):
            errs += [f"{path}: no anyOf branch", *(e for b in branches for e in b)]
    if "oneOf" in schema and sum(not schema_errors(value, s, root, path) for s in schema["oneOf"]) != 1:
        errs.append(f"{path}: not exactly one oneOf branch")
    for sub in schema.get("allOf", []):
        errs += schema_errors(value, sub, root, path)
    if "not" in schema and not schema_errors(value, schema["not"], root, path):
        errs.append(f"{path}: matches `not`")
    return errs


def minimal_jobs(records: list[dict[str, Any]], tag: str = "job") -> dict[str, Any]:
    attrs = {"time": "2026-03-03T15:36:57+02:00", "cluster": "fox.educloud.no", "slurm_jobs": records}
    return {"meta": {"producer": "hpcbus", "version": "0.1.0"}, "data": {"type": tag, "attributes": attrs}}


FOUR = [
    {"job_id": 7, "job_step": "", "job_name": "sim", "job_state": "PENDING"},
    {"job_id": 7, "job_step": "batch", "job_name": "batch", "job_state": "RUNNING"},
]
MIXED = [
    {"job_id": 8, "job_name": "a", "job_state": "RUNNING", "start_time": "2026-03-03T15:00:00+02:00"},
    {"job_id": 8, "job_step": "0", "job_name": "a", "job_state": "COMPLETED", "exit_code": 3},
    {"job_id": 9, "job_state": "FAILED", "end_time": "2026-03-03T15:30:00Z", "sacct": {"ElapsedRaw": 5}},
    {
        "job_id": 10,
        "job_name": "b",
        "job_state": "PENDING",
        "submit_time": "2026-03-03T14:00:00+02:00",
        "user_name": "alice",
    },
]


@pytest.mark.parametrize("tag", ["job", "jobs"])
@pytest.mark.parametrize("records", [FOUR, MIXED], ids=["four-fields", "mixed"])
def test_schema_accepts_records_with_only_the_mandatory_fields(records: list[Any], tag: str) -> None:
    schema = load("job")
    assert schema_errors(minimal_jobs(records, tag), schema, schema) == []


@pytest.mark.parametrize(
    ("record", "why"),
    [
        ({"job_step": "", "job_name": "x", "job_state": "PENDING"}, "job_id: missing"),
        ({"job_id": 1, "job_name": "x"}, "job_state: missing"),
        ({"job_id": 1, "job_state": "PENDING", "submit_time": ""}, "submit_time: length"),
        (
            {"job_id": 1, "job_state": "PENDING", "submit_time": "2025-02-30T00:00:00Z"},
            "submit_time: pattern",
        ),
        ({"job_id": 0, "job_state": "PENDING"}, "job_id: range"),
        ({"job_id": 1, "job_state": "PENDING", "submitted": "x"}, "submitted: unknown"),
    ],
)
def test_schema_still_refuses_bad_records(record: dict[str, Any], why: str) -> None:
    schema = load("job")
    errs = schema_errors(minimal_jobs([record]), schema, schema)
    assert any(e.endswith(why) for e in errs), errs
