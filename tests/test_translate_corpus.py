"""Every envelope of the real Sonar corpus survives Sonar -> line protocol (text) -> Sonar unchanged.

Compared twice: as decoded structs (must be equal) and as JSON values against the original file, where the
only allowed difference is the documented normalisation (docs/mapping.md section 8): explicit zero / empty
values that Sonar itself would have omitted (they decode to the same struct).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hpcbus.schemas import subjects
from hpcbus.schemas.lineprotocol import format_lines, parse_payload
from hpcbus.schemas.problems import InvalidInput, Problem
from hpcbus.schemas.sonar import encode_envelope, iter_envelopes, kind_of
from hpcbus.schemas.sonar.types import SampleEnvelope
from hpcbus.schemas.translate import (
    LpToSonar,
    batch,
    envelope_to_lines,
    format_shared,
    lines_to_envelopes,
    route,
)
from hpcbus.schemas.translate.lp_read import read_payload
from tests.corpus import CORPUS

SONAR_FILES = sorted(p for p in (CORPUS / "sonar").iterdir() if p.suffix in (".json", ".jsonl"))
SACCT_GOLDEN = CORPUS / "slurm" / "sonar_sacct_output_expected-sonar-json.json"


def _raw_objects(path: Path) -> list[tuple[int, Any]]:
    """(line, JSON value) of each top-level value, however the file is framed."""
    text = path.read_text()
    decoder = json.JSONDecoder()
    out, i = [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        value, end = decoder.raw_decode(text, i)
        out.append((text.count("\n", 0, i) + 1, value))
        i = end


def _valid(path: Path) -> list[tuple[int, Any, Any]]:
    """(line, envelope, original JSON value) of every envelope `schemas.sonar` accepts."""
    raw = dict(_raw_objects(path))
    return [
        (line, env, raw[line])
        for line, env in iter_envelopes(path.read_text())
        if not isinstance(env, InvalidInput)
    ]


def _drop_zeros(value: Any) -> Any:
    """The documented normalisation: an explicit 0, 0.0, "", false, [] or {} equals an omitted field."""
    if isinstance(value, dict):
        return {k: _drop_zeros(v) for k, v in value.items() if v not in (0, "", False, [], {}, None)}
    if isinstance(value, list):
        return [_drop_zeros(v) for v in value]
    return value


def _through_text(env: Any, seed: int, pieces: int = 3) -> list[Any]:
    """Envelope -> lines -> LP text per subject, cut into `pieces` messages, delivered shuffled -> envelopes
    (read as the LP -> Sonar worker reads: the compiled path where it is built, else `HPCBUS_PURE=1`)."""
    messages = []
    for subject, lines in route(envelope_to_lines(env, cluster="corpus.example")).items():
        payloads = list(batch(lines, max_bytes=max(200, len(format_lines(lines)) // pieces)))
        messages += [(subject, p) for p in payloads]
    random.Random(seed).shuffle(messages)
    translator = LpToSonar()
    out = []
    for i, (subject, payload) in enumerate(messages):
        parsed = read_payload(payload, now=0, place=subject)  # what `consume sonar --to sonar` reads with
        assert parsed.problems == [], parsed.problems[:3]
        unmade: list[Problem] = []
        out += translator.add_lines(
            parsed.lines, cluster=subjects.parse(subject).cluster, now=i, problems=unmade
        )
        assert unmade == [], unmade
    out += translator.flush_all()
    return out


CASES = [(p, line) for p in [*SONAR_FILES, SACCT_GOLDEN] for line, _, _ in _valid(p)]


def test_corpus_has_every_kind() -> None:
    kinds = {kind_of(env) for p in [*SONAR_FILES, SACCT_GOLDEN] for _, env, _ in _valid(p)}
    assert kinds == {"sample", "sysinfo", "job", "cluster", ""}  # "" = errors-only of unknown kind
    assert len(CASES) >= 20


@pytest.mark.parametrize(("path", "line"), CASES, ids=[f"{p.name}:{n}" for p, n in CASES])
def test_corpus_round_trip(path: Path, line: int) -> None:
    [(env, original)] = [(e, raw) for n, e, raw in _valid(path) if n == line]
    out = _through_text(env, seed=line)
    assert len(out) == 1, out
    result = out[0]
    assert result.complete and not result.followup and result.problems == []
    assert result.envelope == env
    again = json.loads(encode_envelope(result.envelope))
    assert _drop_zeros(again) == _drop_zeros(original)
    if again != original:  # then the difference is exactly an explicit zero somewhere in the original
        assert _drop_zeros(original) != original


def test_explicit_zeros_are_the_only_difference() -> None:
    """slurm-monitor's hand-edited fixture has `"start_time": ""` and `"ElapsedRaw": 0`: they come back omitted."""
    path = CORPUS / "sonar" / "slurmmonitor__ex3_job_v0.16.json"
    [(_, env, original)] = _valid(path)
    unmade: list[Problem] = []
    lines = parse_payload(format_lines(envelope_to_lines(env)), now=0).lines
    [result] = lines_to_envelopes(lines, problems=unmade)
    assert unmade == []
    again = json.loads(encode_envelope(result.envelope))
    first = original["data"]["attributes"]["slurm_jobs"][0]
    assert first["start_time"] == "" and first["sacct"]["ElapsedRaw"] == 0
    back = again["data"]["attributes"]["slurm_jobs"][0]
    assert "start_time" not in back and "ElapsedRaw" not in back["sacct"]
    assert again != original and _drop_zeros(again) == _drop_zeros(original)


def test_format_37_and_token_survive() -> None:
    """Sonar's fixture with `meta.format: 37` and `meta.token: "abc"` is rejected by validation (unsupported
    format), but the translator carries whatever struct it is given: meta comes back exactly."""
    path = CORPUS / "sonar" / "sonar__newfmt_samples.json"
    first = _raw_objects(path)[0][1]
    env = msgspec.convert(first, SampleEnvelope)
    assert env.meta.format == 37 and env.meta.token == "abc"
    [result] = _through_text(env, seed=5)
    assert result.envelope == env and result.complete


def test_integer_gpu_util_comes_back_equal() -> None:
    """Real Sonar writes process `gpu_util` as an integer; the float field decodes equal."""
    path = CORPUS / "sonar" / "jobanalyzer__n1_sample_gpu_v0.14.jsonl"
    [(_, env, original), *_] = _valid(path)
    utils = [
        g["gpu_util"]
        for j in original["data"]["attributes"]["jobs"]
        for p in j["processes"]
        for g in p.get("gpus", [])
        if "gpu_util" in g
    ]
    assert utils and all(isinstance(u, int) for u in utils)
    [result] = _through_text(env, seed=1)
    assert result.envelope == env


def test_sacct_golden_envelope_splits_into_parts_and_joins() -> None:
    """301 Slurm records (144 KB) with a 20 KiB part limit: several `slurm` events, one envelope back."""
    from hpcbus.schemas.translate import jobs_to_lines

    [(_, env, _)] = _valid(SACCT_GOLDEN)
    lines = jobs_to_lines(env, max_part_bytes=20 * 1024, cc_events=False)
    assert len(lines) > 5 and {line.tags["parts"] for line in lines} == {str(len(lines))}
    text_lines = parse_payload(format_lines(lines), now=0).lines
    random.Random(3).shuffle(text_lines)
    unmade: list[Problem] = []
    [result] = lines_to_envelopes(text_lines, problems=unmade)
    assert result.complete and result.envelope == env and unmade == []


def test_real_sonar_quirks_are_kept() -> None:
    """The quirks docs/mapping.md lists come back as they were (not "fixed")."""
    fox_jobs = CORPUS / "sonar" / "sonar__fox_jobs_v0.18.1_trimmed.json"
    [(_, env, _original)] = _valid(fox_jobs)
    [result] = _through_text(env, seed=2)
    again = json.loads(encode_envelope(result.envelope))
    assert again["data"]["type"] == "job"
    states = [r["job_state"] for r in again["data"]["attributes"]["slurm_jobs"]]
    assert "CANCELLED by 2101037" in states
    assert again["data"]["attributes"]["slurm_jobs"][0]["time_limit"] == 1209602  # seconds + 2
    spec_jobs = CORPUS / "sonar" / "sonar__newfmt_slurmjobs.json"
    [(_, env2, _), *_] = _valid(spec_jobs)
    [result2] = _through_text(env2, seed=2)
    assert json.loads(encode_envelope(result2.envelope))["data"]["type"] == "jobs"
    pending = CORPUS / "sonar" / "jobanalyzer__cluster1_jobs_v0.14_trimmed.jsonl"
    [(_, env3, _)] = _valid(pending)
    [result3] = _through_text(env3, seed=4)
    assert any(r.nodes == ["None assigned"] for r in result3.envelope.data.attributes.slurm_jobs)


def test_sample_quirks_on_the_wire() -> None:
    """Slurm jobs without epoch, a rolled-up process without pid, GPU index 0 omitted, P-state + 1."""
    fox = CORPUS / "sonar" / "slurmmonitor__fox_sample_slurmnode_v0.18.json"
    [(_, env, _)] = _valid(fox)
    lines = envelope_to_lines(env)
    rolled = [ln for ln in lines if ln.measurement == "process_rolledup"]
    assert len(rolled) == 1 and rolled[0].fields["value"] == 99
    assert "pid" not in rolled[0].tags and rolled[0].tags["stype-id"] == "2926899/0"
    slurm_job = [ln for ln in lines if ln.measurement == "job_processes" and ln.tags["job"] == "2940904"]
    assert "epoch" not in slurm_job[0].tags and slurm_job[0].tags["stype-id"] == "2940904"
    other = [ln for ln in lines if ln.measurement == "job_processes" and ln.tags["job"] == "1463093"]
    assert other[0].tags["epoch"] == "190553940" and other[0].tags["stype-id"] == "1463093@190553940"

    gpu_node = CORPUS / "sonar" / "jobanalyzer__n1_sample_gpu_v0.14.jsonl"
    [(_, env, original), *_] = _valid(gpu_node)
    assert "index" not in original["data"]["attributes"]["system"]["gpus"][0]
    lines = envelope_to_lines(env)
    pstates = [ln.fields["value"] for ln in lines if ln.measurement == "acc_pstate"]
    assert pstates == [0.0, 0.0, 0.0, 0.0]  # performance_state 1 = P0
    [result] = _through_text(env, seed=9)
    assert (
        json.loads(encode_envelope(result.envelope))["data"]["attributes"]["system"]["gpus"][0].get("index")
        is None
    )


def test_whole_corpus_as_one_stream() -> None:
    """`hpcbus translate`: every envelope of every file -> one LP text -> read back in small chunks (as a CLI
    reading stdin does, flushing as it goes) -> the same envelopes, each exactly once."""
    from hpcbus.schemas.translate import translate_envelopes

    envelopes = [env for p in [*SONAR_FILES, SACCT_GOLDEN] for _, env, _ in _valid(p)]
    text = "".join(format_shared(translate_envelopes(envelopes, cluster="corpus.example")))
    translator = LpToSonar(grace=5)
    out = []
    chunk: list[str] = []
    unmade: list[Problem] = []
    for i, line in enumerate(text.split("\n")):
        chunk.append(line + "\n")
        if len(chunk) == 100:
            out += translator.add_lines(
                parse_payload("".join(chunk), now=0).lines, now=i / 100, problems=unmade
            )
            out += translator.flush(now=i / 100)
            chunk = []
    out += translator.add_lines(parse_payload("".join(chunk), now=0).lines, now=1e9, problems=unmade)
    out += translator.flush_all()
    assert all(a.complete and not a.problems for a in out) and unmade == []
    got = [a.envelope for a in out]
    assert len(got) == len(envelopes)
    for env in envelopes:
        assert env in got
