"""The real Sonar corpus (../shared/corpus/sonar, see its PROVENANCE.md) against `schemas.sonar`.

Each file's envelopes must be accepted, or rejected for exactly the documented reason; every envelope must
re-encode to the same JSON tree (only zero/empty values may disappear, as Sonar itself omits them); and no
key that appears anywhere in the corpus may be unknown to the structs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hpcbus.schemas.problems import InvalidInput
from hpcbus.schemas.sonar import decode_envelope, encode_envelope, iter_envelopes, iter_envelopes_from_lines
from hpcbus.schemas.sonar.diagnose import diagnose
from hpcbus.schemas.sonar.types import (
    AnyEnvelope,
    ClusterEnvelope,
    ErrorsEnvelope,
    JobsEnvelope,
    SampleEnvelope,
    SpecJobsData,
    SysinfoEnvelope,
)
from tests.corpus import CORPUS

SONAR = CORPUS / "sonar"
GOLDEN_JOBS = CORPUS / "slurm" / "sonar_sacct_output_expected-sonar-json.json"


def rejected(*problems: tuple[str, str]) -> frozenset[tuple[str, str]]:
    """An envelope rejected with exactly these (path, reason fragment) problems."""
    return frozenset(problems)


NOT_ENVELOPE = rejected(("", "not a Sonar JSON envelope"))

# Per file, per envelope in order: the class it decodes to, or the exact set of problems. The reasons
# follow PROVENANCE.md and the spec; see the comments for the decisions the spec forces.
EXPECTED: dict[str, list[Any]] = {
    "jobanalyzer__cluster1_cluster_v0.14.jsonl": [ClusterEnvelope, ClusterEnvelope],
    "jobanalyzer__cluster1_jobs_v0.14_trimmed.jsonl": [
        JobsEnvelope
    ],  # "nodes":["None assigned"] is a []string
    "jobanalyzer__cluster1_sample_v0.19.jsonl": [SampleEnvelope],
    "jobanalyzer__cluster1_sysinfo_v0.19.jsonl": [SysinfoEnvelope],
    "jobanalyzer__n1_sample_gpu_v0.14.jsonl": [SampleEnvelope, SampleEnvelope],
    "jobanalyzer__n1_sysinfo_gpu_v0.14.jsonl": [SysinfoEnvelope, SysinfoEnvelope],
    # Hand-edited: "start_time":"" and "end_time":"" are OptionalTimestamps ("time the job started, if
    # started"), explicit zeros are plain uint64 zeros: odd but valid, so accepted (re-encoding omits them).
    "slurmmonitor__ex3_job_v0.16.json": [JobsEnvelope],
    "slurmmonitor__fox_cluster_v0.18.json": [ClusterEnvelope],
    "slurmmonitor__fox_sample_slurmnode_v0.18.json": [SampleEnvelope],
    "sonar__fox_cluster_v0.16.json": [ClusterEnvelope],
    "sonar__fox_jobs_v0.18.1_trimmed.json": [JobsEnvelope],
    "sonar__newfmt_cluster.json": [ClusterEnvelope, ClusterEnvelope],
    # Envelope 1's made-up meta.format=37 is accepted and kept, as Sonar's own reader does.
    "sonar__newfmt_samples.json": [SampleEnvelope, SampleEnvelope],
    # "type":"jobs" (the spec's spelling) is accepted beside "job"; the errors-only envelope has no kind.
    "sonar__newfmt_slurmjobs.json": [JobsEnvelope, ErrorsEnvelope],
    "sonar__newfmt_sysinfo.json": [
        # Sonar 0.13.0 predates `architecture`, which the spec makes required: real data wins, accepted.
        SysinfoEnvelope,
        # The deliberately wrong keys (PROVENANCE: "pass only because the Go test is non-strict").
        rejected(
            ("data.attributes.os", "unknown field"),
            ("data.attributes.os-version", "unknown field"),
            # os_name/os_release are absent here; optional since issue 10 (no "missing required field").
        ),
        # An error object with only `detail` (Sonar's own fixture): accepted, its kind unknown from the keys.
        ErrorsEnvelope,
    ],
    # Reference only: the old formats are not envelopes.
    "sonar__oldfmt_samples.csv": [NOT_ENVELOPE],
    "sonar__oldfmt_slurmjobs.csv": [NOT_ENVELOPE],
    "sonar__oldfmt_sysinfo.json": [NOT_ENVELOPE, NOT_ENVELOPE],
}


def corpus_files() -> list[Path]:
    return sorted(p for p in SONAR.iterdir() if p.name != "PROVENANCE.md")


def json_objects(path: Path) -> list[tuple[int, str, Any]]:
    """(start line, text, value) of each top-level JSON value, found independently of `schemas.sonar`
    with `raw_decode`, as PROVENANCE.md suggests."""
    text = path.read_text(encoding="utf-8")
    decoder = json.JSONDecoder()
    out: list[tuple[int, str, Any]] = []
    pos = 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return out
        value, end = decoder.raw_decode(text, pos)
        out.append((text.count("\n", 0, pos) + 1, text[pos:end], value))
        pos = end


def envelope_texts() -> list[Any]:
    """Every JSON envelope of the corpus (not the old formats), as pytest params."""
    params = []
    for path in [*corpus_files(), GOLDEN_JOBS]:
        if "oldfmt" in path.name:
            continue
        for line, text, _ in json_objects(path):
            params.append(pytest.param(text, id=f"{path.name}:{line}"))
    return params


def test_every_corpus_file_has_an_expectation() -> None:
    assert sorted(EXPECTED) == [p.name for p in corpus_files()]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_file_accepted_or_rejected_as_documented(name: str) -> None:
    results = list(iter_envelopes((SONAR / name).read_text(encoding="utf-8")))
    assert len(results) == len(EXPECTED[name]), [line for line, _ in results]
    for (line, result), want in zip(results, EXPECTED[name], strict=True):
        if isinstance(want, frozenset):
            assert isinstance(result, InvalidInput), f"line {line}: accepted, expected {sorted(want)}"
            got = [(p.path, p.reason) for p in result.problems]
            assert len(got) == len(want), f"line {line}: {got}"
            for path, fragment in want:
                assert any(p == path and fragment in r for p, r in got), f"line {line}: {path} not in {got}"
            assert all(p.line == line for p in result.problems)
        else:
            assert not isinstance(result, InvalidInput), f"line {line}: {result}"
            assert type(result) is want


@pytest.mark.parametrize("path", [*corpus_files(), GOLDEN_JOBS], ids=lambda p: p.name)
def test_start_lines_and_streaming_agree_with_raw_decode(path: Path) -> None:
    """The splitter finds the same envelopes as `raw_decode`, and reading a file line by line gives the
    same results as reading it whole."""
    text = path.read_text(encoding="utf-8")
    whole = list(iter_envelopes(text))
    with path.open(encoding="utf-8") as f:
        streamed = list(iter_envelopes_from_lines(f))
    assert [(line, str(r)) for line, r in whole] == [(line, str(r)) for line, r in streamed]
    if path.suffix != ".csv":
        assert [line for line, _ in whole] == [line for line, _, _ in json_objects(path)]


def test_golden_sacct_jobs_envelope_is_accepted_whole() -> None:
    env = decode_envelope(GOLDEN_JOBS.read_bytes())
    assert isinstance(env, JobsEnvelope) and env.data is not None
    assert env.data.type == "job"
    assert len(env.data.attributes.slurm_jobs) == 301


def test_jobs_spelling_is_preserved() -> None:
    results = list(iter_envelopes((SONAR / "sonar__newfmt_slurmjobs.json").read_text(encoding="utf-8")))
    env = results[0][1]
    assert isinstance(env, JobsEnvelope) and isinstance(env.data, SpecJobsData)
    assert env.data.type == "jobs"
    assert b'"type":"jobs"' in encode_envelope(env)


def test_errors_only_envelope_takes_its_kind_from_context() -> None:
    text = (SONAR / "sonar__newfmt_slurmjobs.json").read_text(encoding="utf-8")
    (_, first), (_, second) = iter_envelopes(text, expect="job")
    assert isinstance(first, JobsEnvelope) and isinstance(second, JobsEnvelope)
    assert second.data is None and second.errors[0].detail == "No can do"


def test_every_corpus_key_is_a_known_field() -> None:
    """No field in the corpus is silently dropped: apart from the two wrong keys of newfmt_sysinfo
    record 2, no key anywhere is unknown to the structs (checked on rejected envelopes too)."""
    unknown = []
    for param in envelope_texts():
        text = param.values[0]
        unknown += [path for path, reason in diagnose(json.loads(text)) if reason.startswith("unknown field")]
    assert sorted(unknown) == ["data.attributes.os", "data.attributes.os-version"]


def is_default(value: Any) -> bool:
    return value in (0, "", False, None, []) and not (isinstance(value, float) and value != 0)


def dropped_defaults(original: Any, back: Any, path: str = "") -> list[str]:
    """Compare two JSON trees; the only difference allowed is a key of `original` that `back` omits because
    its value is a zero/empty default. Numbers compare by value (Sonar writes some floats as integers).
    Returns the paths of the omitted keys."""
    dropped: list[str] = []
    if isinstance(original, dict):
        assert isinstance(back, dict), path
        assert set(back) <= set(original), f"{path}: keys added on re-encoding: {set(back) - set(original)}"
        for key, value in original.items():
            sub = f"{path}.{key}" if path else key
            if key in back:
                dropped += dropped_defaults(value, back[key], sub)
            else:
                assert is_default(value), f"{sub}: {value!r} was dropped but is not a zero/empty default"
                dropped.append(sub)
    elif isinstance(original, list):
        assert isinstance(back, list) and len(back) == len(original), path
        for i, (a, b) in enumerate(zip(original, back, strict=True)):
            dropped += dropped_defaults(a, b, f"{path}[{i}]")
    elif isinstance(original, bool) or isinstance(back, bool):
        assert original is back, path
    elif isinstance(original, int | float):
        assert isinstance(back, int | float) and original == back, f"{path}: {original!r} != {back!r}"
        if isinstance(original, int):
            assert float(back).is_integer(), path
    else:
        assert original == back, path
    return dropped


def fits_structs(text: str) -> bool:
    try:
        msgspec.json.decode(text, type=AnyEnvelope)
    except msgspec.ValidationError:
        return False
    return True


def test_only_the_documented_envelopes_do_not_fit_the_structs() -> None:
    misfits = [param.id for param in envelope_texts() if not fits_structs(param.values[0])]
    assert misfits == ["sonar__newfmt_sysinfo.json:67"]


@pytest.mark.parametrize("text", [p for p in envelope_texts() if fits_structs(p.values[0])])
def test_reencoding_keeps_every_field(text: str) -> None:
    """Decode with the structs, encode, and compare JSON trees. An envelope that only the semantic rules
    reject (format 37) is decoded into the structs directly, so its fields are checked too."""
    try:
        env: Any = decode_envelope(text)
    except InvalidInput:
        env = msgspec.json.decode(text, type=AnyEnvelope)
    original = json.loads(text)
    back = json.loads(encode_envelope(env))
    dropped_defaults(original, back)


def test_reencoding_drops_exactly_the_explicit_zeros_of_the_hand_edited_fixture() -> None:
    (_, text, original), *_ = json_objects(SONAR / "slurmmonitor__ex3_job_v0.16.json")
    back = json.loads(encode_envelope(decode_envelope(text)))
    dropped = dropped_defaults(original, back)
    first = "data.attributes.slurm_jobs[0]"
    assert {f"{first}.start_time", f"{first}.end_time", f"{first}.sacct.ElapsedRaw"} <= set(dropped)
    assert all(
        p.rsplit(".", 1)[1] in {"start_time", "end_time", "ElapsedRaw", "SystemCPU", "UserCPU"}
        for p in dropped
    )


def test_integers_sent_for_floats_keep_their_value() -> None:
    """gpu_util, gpu_memory_util and cpu_avg come as integers from real Sonar; they decode to floats of the
    same value and re-encode equal."""
    text = (SONAR / "jobanalyzer__n1_sample_gpu_v0.14.jsonl").read_text(encoding="utf-8").splitlines()[0]
    env = decode_envelope(text)
    assert isinstance(env, SampleEnvelope) and env.data is not None
    gpus = [g for job in env.data.attributes.jobs for p in job.processes for g in p.gpus]
    assert gpus and all(isinstance(g.gpu_util, float) for g in gpus)
    original = json.loads(text)
    raw_gpus = [
        g
        for job in original["data"]["attributes"]["jobs"]
        for p in job["processes"]
        for g in p.get("gpus", [])
    ]
    assert any(isinstance(g.get("gpu_util"), int) for g in raw_gpus)
    assert [g.gpu_util for g in gpus] == [float(g.get("gpu_util", 0)) for g in raw_gpus]
