"""The written contract (docs/mapping.md) and the code agree; subjects, batching and message ids."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from hpcbus.schemas import subjects
from hpcbus.schemas.lineprotocol import format_line, parse_payload
from hpcbus.schemas.metrics.tables import render_doc
from hpcbus.schemas.sonar import iter_envelopes
from hpcbus.schemas.sonar import types as sonar_types
from hpcbus.schemas.translate import (
    BY_NAME,
    HIGH_CARDINALITY_TAGS,
    REGISTRY,
    batch,
    envelope_to_lines,
    msg_id,
    route,
)
from hpcbus.schemas.translate.registry import IDENTITY_FIELDS
from tests.corpus import CORPUS
from tests.metricstore import MetricStore

DOC = Path(__file__).resolve().parents[1] / "docs" / "mapping.md"


def test_doc_table_is_generated_from_the_registry() -> None:
    doc = DOC.read_text()
    assert render_doc(doc) == doc, "run: python -m hpcbus.schemas.metrics < docs/mapping.md"
    for metric in REGISTRY:
        assert f"`{metric.name}`" in doc


def test_worked_examples_in_the_doc_are_real_output() -> None:
    """Every complete (not abridged with `…`) example line of docs/mapping.md is what the code writes for the
    corpus envelope it names."""
    from hpcbus.schemas.translate.bus import format_shared

    produced: set[str] = set()
    for path in sorted((CORPUS / "sonar").glob("*.json*")):
        for _, env in iter_envelopes(path.read_text()):
            if not isinstance(env, Exception):
                produced.update(t.rstrip("\n") for t in format_shared(envelope_to_lines(env)))
    blocks = DOC.read_text().split("```")[1::2]
    examples = [
        ln for block in blocks for ln in block.strip().splitlines() if " value=" in ln or " event=" in ln
    ]
    examples = [ln for ln in examples if "<" not in ln]  # templates such as `<cluster>`
    complete = [ln for ln in examples if "…" not in ln]
    assert len(complete) >= 20
    missing = [ln for ln in complete if ln not in produced]
    assert missing == []
    for ln in examples:  # abridged ones: at least the head (measurement and tags) is real
        head = ln.split(" ", 1)[0]
        assert any(p.startswith(head + " ") for p in produced), head


@pytest.mark.parametrize(
    "cls",
    [
        sonar_types.SampleSystem,
        sonar_types.SampleGpu,
        sonar_types.SampleDisk,
        sonar_types.SampleJob,
        sonar_types.SampleProcess,
        sonar_types.SampleProcessGpu,
    ],
)
def test_every_sample_field_is_a_line_or_named_identity(cls: type[msgspec.Struct]) -> None:
    """A field added to the Sonar structs must be declared here (it would still survive, in the skeleton,
    but would not be queryable as a metric)."""
    level = {
        "SampleSystem": ("node", "hwthread"),
        "SampleGpu": ("accelerator",),
        "SampleDisk": ("disk",),
        "SampleJob": ("job",),
        "SampleProcess": ("process",),
        "SampleProcessGpu": ("process_gpu",),
    }[cls.__name__]
    as_lines = {m.field for m in REGISTRY if m.level in level}
    identity = IDENTITY_FIELDS[cls.__name__]
    fields = {f.name for f in msgspec.structs.fields(cls)}
    assert fields == (as_lines | identity) - {""}
    assert not as_lines & identity


def test_names_are_unique_and_types_fixed() -> None:
    assert len(BY_NAME) == len(REGISTRY)
    assert {m.kind for m in REGISTRY} == {int, float}
    cc_names = {"mem_used", "cpu_load", "acc_utilization", "acc_mem_used", "acc_power", "acc_mem_util"}
    assert all(BY_NAME[n].kind is float for n in cc_names)  # as cc-metric-collector sends them
    assert {"pid", "cmd", "job", "stype-id"} <= HIGH_CARDINALITY_TAGS and "user" not in HIGH_CARDINALITY_TAGS


def _fox_sample_lines():  # type: ignore[no-untyped-def]
    text = (CORPUS / "sonar" / "slurmmonitor__fox_sample_slurmnode_v0.18.json").read_text()
    [(_, env)] = list(iter_envelopes(text))
    return envelope_to_lines(env)


def test_series_are_distinct_in_cc_metric_store() -> None:
    """cc-metric-store keys a series by (level below the host, measurement), the level built from `type`,
    `type-id`, `stype`, `stype-id` by its own rules (`tests.metricstore`): no two lines of a sample may share
    that, or it would overwrite one process's value with another's."""
    lines = [ln for ln in _fox_sample_lines() if "value" in ln.fields]
    store = MetricStore()
    keys = [(store.path_of(ln.tags), ln.measurement) for ln in lines]
    assert len(keys) == len(set(keys))


def test_route_keeps_events_off_the_metrics_subject() -> None:
    routed = route(_fox_sample_lines())
    assert set(routed) == {"fox.educloud.no.metrics", "fox.educloud.no.events.sample"}
    assert all("value" in ln.fields for ln in routed["fox.educloud.no.metrics"])
    [skeleton] = routed["fox.educloud.no.events.sample"]
    assert subjects.parse("fox.educloud.no.events.sample").cluster == "fox.educloud.no"
    assert skeleton.tags["function"] == "skeleton"


def test_batch_never_splits_a_line_and_respects_the_limit() -> None:
    lines = _fox_sample_lines()
    payloads = list(batch(lines, max_bytes=4096))
    assert len(payloads) > 3
    assert all(len(p) <= 4096 for p in payloads[1:])  # the skeleton line alone may be longer
    joined = b"".join(payloads).decode()
    assert joined == "".join(format_line(ln) + "\n" for ln in lines)
    assert sum(len(parse_payload(p, now=0).lines) for p in payloads) == len(lines)


def test_fast_writer_is_byte_identical_on_the_corpus() -> None:
    from hpcbus.schemas.lineprotocol import Line, format_lines
    from hpcbus.schemas.translate.bus import format_shared

    for path in sorted((CORPUS / "sonar").glob("*.json*")):
        for _, env in iter_envelopes(path.read_text()):
            if isinstance(env, Exception):
                continue
            lines = envelope_to_lines(env)
            assert "".join(format_shared(lines)) == format_lines(lines)
    odd = [
        Line("m", {"a": "b c"}, {"value": -0.0}, 1),
        Line("m", {"a": "b"}, {"value": 5e-324}, 1),
        Line("m", {"a": "b"}, {"value": 2**64 - 1}, 1),
        Line("m", {"a": "b"}, {"value": True}, 1),
        Line("m x", {}, {"value": 1.5}, 1),
        Line("m", {"a": "b"}, {"value": 1.0, "other": 2}, 1),
    ]
    assert "".join(format_shared(odd)) == format_lines(odd)


def test_msg_id_is_deterministic_and_content_bound() -> None:
    payloads = list(batch(_fox_sample_lines(), max_bytes=4096))
    again = list(batch(_fox_sample_lines(), max_bytes=4096))
    ids = [msg_id("fox.educloud.no.metrics", p) for p in payloads]
    assert ids == [msg_id("fox.educloud.no.metrics", p) for p in again]  # re-publishing -> same ids
    assert len(set(ids)) == len(ids)
    assert msg_id("a.metrics", payloads[0]) != msg_id("b.metrics", payloads[0])
    assert len(ids[0]) == 32
