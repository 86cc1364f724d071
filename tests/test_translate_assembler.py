"""The sample Assembler: out-of-order delivery, grace window, late lines, memory bounds, redelivery.

Uses the real GPU node sample of the corpus (4 GPUs, 23 jobs) as the envelope on the wire.
"""

from __future__ import annotations

import random

import msgspec
import pytest

from hpcbus.schemas.lineprotocol import Line, format_lines, parse_payload
from hpcbus.schemas.sonar import iter_envelopes
from hpcbus.schemas.sonar.types import SampleEnvelope
from hpcbus.schemas.translate import Assembler, envelope_to_lines
from tests.corpus import CORPUS


def _sample(n: int = 0) -> SampleEnvelope:
    text = (CORPUS / "sonar" / "jobanalyzer__n1_sample_gpu_v0.14.jsonl").read_text()
    env = [e for _, e in iter_envelopes(text)][n]
    assert isinstance(env, SampleEnvelope)
    return env


def _wire(env: SampleEnvelope) -> tuple[Line, list[Line]]:
    """(skeleton event, metric lines) as a consumer parses them from text."""
    lines = parse_payload(format_lines(envelope_to_lines(env)), now=0).lines
    header = [ln for ln in lines if ln.measurement == "sample"]
    assert len(header) == 1
    return header[0], [ln for ln in lines if ln.measurement != "sample"]


def test_complete_as_soon_as_the_last_line_arrives_in_any_order() -> None:
    env = _sample()
    header, metrics = _wire(env)
    random.Random(7).shuffle(metrics)
    asm = Assembler(grace=30)
    # skeleton in the middle, metrics in 5 messages
    chunks = [metrics[i::5] for i in range(5)]
    assert asm.add_lines(chunks[0], now=0) == []
    assert asm.add_lines(chunks[1], now=1) == []
    assert asm.add_lines([header], now=2) == []
    assert asm.add_lines(chunks[2] + chunks[3], now=3) == []
    [result] = asm.add_lines(chunks[4], now=4)
    assert result.complete and not result.followup
    assert result.envelope == env
    assert asm.open_groups == 0


def test_redelivered_message_does_not_complete_early() -> None:
    env = _sample()
    header, metrics = _wire(env)
    half = len(metrics) // 2
    asm = Assembler()
    assert asm.add_lines([header, *metrics[:half]], now=0) == []
    assert asm.add_lines(metrics[:half], now=1) == []  # JetStream redelivery of the first message
    assert asm.add_lines(metrics[: half - 1], now=1) == []
    [result] = asm.add_lines(metrics[half:], now=2)
    assert result.complete and result.envelope == env


def test_missing_lines_give_a_partial_envelope_after_the_grace_window() -> None:
    env = _sample()
    header, metrics = _wire(env)
    lost = [ln for ln in metrics if ln.measurement == "acc_power"]
    kept = [ln for ln in metrics if ln.measurement != "acc_power"]
    asm = Assembler(grace=10)
    assert asm.add_lines([header, *kept], now=100) == []
    assert asm.flush(now=109) == []  # not yet
    [result] = asm.flush(now=110)
    assert not result.complete and not result.followup
    gpus = result.envelope.data.attributes.system.gpus
    assert [g.power for g in gpus] == [0, 0, 0, 0]  # what did not arrive is absent, as in Sonar
    assert [g.ce_util for g in gpus] == [g.ce_util for g in env.data.attributes.system.gpus]
    # the late lines are not lost: they make a follow-up envelope
    assert asm.add_lines(lost, now=111) == []
    [late] = asm.flush(now=200)
    assert late.followup and not late.complete
    power = {g.uuid: g.power for g in late.envelope.data.attributes.system.gpus}
    assert power == {g.uuid: g.power for g in env.data.attributes.system.gpus}
    assert sorted(power.values()) == [172, 208, 217, 236]


def test_late_line_after_a_complete_envelope_is_a_follow_up() -> None:
    env = _sample()
    header, metrics = _wire(env)
    asm = Assembler(grace=5)
    [first] = asm.add_lines([header, *metrics], now=0)
    assert first.complete
    extra = Line("mem_used", dict(metrics[0].tags), {"value": 1234.0}, metrics[0].time)
    assert asm.add_lines([extra], now=1) == []
    [late] = asm.flush(now=6)
    assert late.followup and not late.complete
    assert late.envelope.data.attributes.system.used_memory == 1234
    # a skeleton redelivered after its complete envelope is a duplicate, not news
    assert asm.add_lines([header], now=7) == []
    assert asm.duplicates == 1 and asm.open_groups == 0


def test_memory_is_bounded_by_max_groups_and_nothing_is_dropped() -> None:
    env = _sample()
    _, metrics = _wire(env)
    asm = Assembler(grace=1000, max_groups=3)
    out = []
    hosts = [f"n{i}" for i in range(10)]
    for i, host in enumerate(hosts):
        lines = [
            Line(ln.measurement, {**ln.tags, "hostname": host}, ln.fields, ln.time) for ln in metrics[:20]
        ]
        out += asm.add_lines(lines, now=i)
        assert asm.open_groups <= 3
    out += asm.flush_all()
    assert sorted(a.envelope.data.attributes.node for a in out) == sorted(hosts)
    assert all(not a.complete for a in out)


def test_max_lines_bounds_one_group() -> None:
    env = _sample()
    header, metrics = _wire(env)
    asm = Assembler(max_lines=50)
    out = asm.add_lines([header, *metrics], now=0)
    out += asm.flush_all()
    assert len(out) >= 2 and out[0].complete is False
    assert all(a.followup for a in out[1:])
    total = sum(len(envelope_to_lines(a.envelope)) for a in out)
    assert total > len(metrics)  # every value went somewhere (plus each envelope's own skeleton)


def test_groups_are_per_host_and_timestamp() -> None:
    a, b = _sample(0), _sample(1)
    ha, ma = _wire(a)
    hb, mb = _wire(b)
    lines = [ha, hb, *ma, *mb]
    random.Random(1).shuffle(lines)
    out = Assembler().add_lines(lines, now=0)
    assert sorted(r.envelope.data.attributes.time for r in out) == sorted(
        [a.data.attributes.time, b.data.attributes.time]
    )
    assert {id(r.envelope) for r in out} and all(r.complete for r in out)
    assert [r.envelope for r in out if r.envelope.data.attributes.time == a.data.attributes.time] == [a]


def test_without_a_skeleton_the_tags_rebuild_the_sample() -> None:
    """The skeleton got lost: everything numeric and every identity in tags still comes back; the documented
    normalisations are time in +00:00, hpcbus meta, canonical order, and skeleton-only fields empty."""
    env = _sample()
    _, metrics = _wire(env)
    random.Random(2).shuffle(metrics)
    asm = Assembler(grace=0)
    assert asm.add_lines(metrics, now=0) == []
    [result] = asm.flush(now=0)
    assert not result.complete and result.problems == []
    got, want = result.envelope.data.attributes, env.data.attributes
    assert got.time == "2025-04-13T06:17:35+00:00" and want.time == "2025-04-13T08:17:35+02:00"
    assert result.envelope.meta.producer == "hpcbus"
    assert got.system.used_memory == want.system.used_memory and got.system.cpus == want.system.cpus
    assert [msgspec.structs.replace(g, index=0) for g in got.system.gpus] == sorted(
        (msgspec.structs.replace(g, index=0) for g in want.system.gpus), key=lambda g: g.uuid
    )

    def canon(jobs):  # type: ignore[no-untyped-def]
        return sorted(
            (
                j.job,
                j.epoch,
                j.user,
                sorted(
                    (
                        p.pid,
                        p.ppid,
                        p.cmd,
                        p.cpu_time,
                        p.resident_memory,
                        p.cpu_util,
                        tuple((g.uuid, g.gpu_util, g.gpu_memory) for g in p.gpus),
                    )
                    for p in j.processes
                ),
            )
            for j in jobs
        )

    assert canon(got.jobs) == canon(want.jobs)


def test_lines_of_other_levels_with_sonar_names_are_ignored() -> None:
    """cc-metric-store's own example writes `cpu_load` per hwthread: that is not Sonar's node load."""
    payload = (
        CORPUS / "clustercockpit" / "lineprotocol" / "cc-metric-store-write-api-example.lp"
    ).read_text()
    asm = Assembler(grace=0)
    assert asm.add_lines(parse_payload(payload, now=0).lines, now=0) == []
    assert asm.flush(now=1) == [] and asm.ignored == 1


@pytest.mark.parametrize("bad", [{"grace": -1}, {"max_groups": 0}, {"max_lines": 0}])
def test_options_are_checked(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Assembler(**bad)  # type: ignore[arg-type]


# --- ClusterCockpit lines beside a skeleton (hpcbus' node producer sends both in one message) -------------------


def _cc_extras(env: SampleEnvelope) -> list[Line]:
    """What the node producer adds after the Sonar lines of a sample (producers/node/cc_lines.py): CPU
    percentages per hwthread and node, and CC-only node lines; plus cc-metric-collector's `nv_util` for the
    same GPUs, whose Sonar field (`ce_util`) the skeleton's own `acc_utilization` lines already carry."""
    a = env.data.attributes  # type: ignore[union-attr]
    base = {"cluster": a.cluster, "hostname": a.node}
    t = _wire(env)[0].time
    lines = [
        Line(f"cpu_{f}", {**base, "type": "hwthread", "type-id": str(i)}, {"value": 0.0}, t)
        for i in range(len(a.system.cpus))
        for f in ("user", "system", "idle", "iowait", "used")
    ]
    lines += [
        Line("cpu_user", {**base, "type": "node", "type-id": "0"}, {"value": 0.0}, t),
        Line("mem_total", {**base, "type": "node", "type-id": "0"}, {"value": 1.0}, t),
        Line(
            "net_bytes_in",
            {**base, "type": "node", "type-id": "0", "stype": "network", "stype-id": "e"},
            {"value": 1},
            t,
        ),
    ]
    lines += [
        Line("nv_util", {**base, "type": "accelerator", "type-id": g.uuid}, {"value": 99.0}, t)
        for g in a.system.gpus
    ]
    return lines


def test_cc_lines_after_the_skeletons_lines_make_no_second_envelope() -> None:
    """The node producer's order: skeleton (its own message), then one message with the Sonar lines followed
    by the CC lines. The envelope is complete at the last Sonar line; the CC lines after it have no Sonar
    meaning next to its skeleton and must not open a follow-up group (a phantom sample of zero `cpus`)."""
    env = _sample()
    header, metrics = _wire(env)
    extras = _cc_extras(env)
    asm = Assembler(grace=5)
    assert asm.add_lines([header], now=0) == []
    [result] = asm.add_lines([*metrics, *extras], now=0)
    assert result.complete and not result.followup and result.envelope == env
    assert asm.open_groups == 0
    assert asm.flush(now=100) == [] and asm.flush_all() == []
    assert asm.ignored == len(extras)
    # The next sample of the host is not touched by the ignored percentages either.
    env2 = _sample(1)
    header2, metrics2 = _wire(env2)
    out = asm.add_lines([header2], now=101) + asm.add_lines([*metrics2, *_cc_extras(env2)], now=101)
    assert [(r.complete, r.followup) for r in out] == [(True, False)] and out[0].envelope == env2
    assert asm.flush_all() == []


def test_cc_lines_before_the_skeleton_are_dropped_when_it_arrives() -> None:
    """Metrics message first, skeleton last: the CC aliases waited in the group and are not placed (the
    `nv_util` of 99 % would otherwise overwrite the GPUs' `ce_util`)."""
    env = _sample()
    header, metrics = _wire(env)
    extras = _cc_extras(env)
    asm = Assembler(grace=5)
    assert asm.add_lines([*extras, *metrics], now=0) == []
    [result] = asm.add_lines([header], now=1)
    assert result.complete and not result.followup and result.envelope == env
    assert asm.flush_all() == [] and asm.ignored == len(extras)


def test_cc_lines_after_a_partial_skeleton_envelope_are_ignored_real_lines_still_follow_up() -> None:
    env = _sample()
    header, metrics = _wire(env)
    lost = [ln for ln in metrics if ln.measurement == "acc_power"]
    kept = [ln for ln in metrics if ln.measurement != "acc_power"]
    asm = Assembler(grace=10)
    assert asm.add_lines([header, *kept], now=0) == []
    [partial] = asm.flush(now=10)
    assert not partial.complete and not partial.followup
    assert asm.add_lines(_cc_extras(env), now=11) == [] and asm.open_groups == 0  # CC-only: no group
    assert asm.add_lines(lost, now=12) == []  # Sonar lines that came late: a follow-up, as before
    assert asm.add_lines(_cc_extras(env), now=12) == []  # ... to which the CC lines add nothing
    [late] = asm.flush(now=100)
    assert late.followup and not late.complete
    assert late.envelope.data.attributes.system.cpus == []  # no cpus integrated from percentages
    assert [g.ce_util for g in late.envelope.data.attributes.system.gpus] == [0, 0, 0, 0]


def test_a_collector_stream_split_over_messages_is_one_envelope_per_host_and_time() -> None:
    """Without skeletons, CC aliases are the data: the lines of one (host, time), in any number of messages,
    make one envelope, never a follow-up."""
    env = _sample()
    extras = _cc_extras(env)
    asm = Assembler(grace=5)
    out = []
    for k, host in enumerate(("a", "b", "a", "b")):
        t = 1000 + 10 * (k // 2)
        lines = [Line(ln.measurement, {**ln.tags, "hostname": host}, ln.fields, t) for ln in extras]
        out += asm.add_lines(lines[: len(lines) // 2], now=k)
        out += asm.add_lines(lines[len(lines) // 2 :], now=k)
    out += asm.flush(now=100)
    keys = [(r.envelope.data.attributes.node, r.envelope.data.attributes.time) for r in out]
    assert len(keys) == 4 and len(set(keys)) == 4
    assert not any(r.followup or r.complete for r in out)
    assert all(r.envelope.data.attributes.system.cpus == [0] * 56 for r in out)  # type: ignore[union-attr]
    assert all([g.ce_util for g in r.envelope.data.attributes.system.gpus] == [99] * 4 for r in out)
