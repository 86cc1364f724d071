"""`schemas.sonar.split` and `envelope_messages`: envelopes larger than one NATS message, cut into valid
envelopes with the same meta and attributes (jobs, cluster), or refused with the reason (a sample, a single
record); and the translator's events of a large envelope, cut the same way."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcbus.schemas.lineprotocol import format_line
from hpcbus.schemas.sonar import decode_envelope, encode_envelope, validate_envelope
from hpcbus.schemas.sonar.split import Part, split_envelope, split_own
from hpcbus.schemas.sonar.types import ClusterEnvelope, JobsEnvelope, SampleEnvelope, SlurmJob
from hpcbus.schemas.translate import (
    MAX_PAYLOAD,
    JobsAssembler,
    batch,
    cluster_to_lines,
    envelope_messages,
    event_budget,
    jobs_to_lines,
    msg_id,
)
from hpcbus.schemas.translate.bus import split_payloads
from hpcbus.schemas.translate.payloads import envelope_payloads
from tests.sonar_big import big_cluster, big_jobs, big_sample

LIMIT = 1024 * 1024 - 91


def _records(parts: list[JobsEnvelope]) -> list[object]:
    return [r for p in parts if p.data is not None for r in p.data.attributes.slurm_jobs]


def test_a_2mb_jobs_envelope_becomes_valid_envelopes_that_fit() -> None:
    env = big_jobs(2_000_000)
    assert env.data is not None
    raw = encode_envelope(env)
    parts = split_envelope(env, LIMIT, payload=raw)
    assert len(raw) > 2_000_000 and len(parts) == 2
    assert all(p.problem is None and len(p.payload) <= LIMIT for p in parts)
    for p in parts:
        assert isinstance(p.envelope, JobsEnvelope) and p.envelope.data is not None
        assert validate_envelope(p.envelope) == []
        assert decode_envelope(p.payload, expect="job") == p.envelope
        assert p.envelope.meta == env.meta
        attrs = msgspec.structs.replace(p.envelope.data.attributes, slurm_jobs=[])
        assert attrs == msgspec.structs.replace(env.data.attributes, slurm_jobs=[])
    envelopes = [p.envelope for p in parts]
    assert _records(envelopes) == env.data.attributes.slurm_jobs  # every record once, in order
    assert split_envelope(env, LIMIT, payload=raw) == parts  # the same envelope, the same parts


def test_a_part_keeps_the_spec_spelling_and_a_fitting_envelope_its_own_bytes() -> None:
    raw = encode_envelope(big_jobs(0))
    pretty = raw.replace(b',"data"', b',\n  "data"').replace(b'"type":"job"', b'"type":"jobs"')
    env = decode_envelope(pretty, expect="job")
    assert split_envelope(env, LIMIT, payload=pretty)[0].payload == pretty  # fits: exactly as it came
    parts = split_envelope(env, 2000, payload=pretty)
    assert len(parts) > 3 and all(b'"type":"jobs"' in p.payload for p in parts)


def test_one_record_too_large_is_named_and_the_others_are_kept() -> None:
    env = big_jobs(50_000)
    assert env.data is not None
    records = env.data.attributes.slurm_jobs
    huge = msgspec.structs.replace(records[7], job_name="x" * 20_000)
    env = msgspec.structs.replace(
        env,
        data=msgspec.structs.replace(
            env.data,
            attributes=msgspec.structs.replace(
                env.data.attributes, slurm_jobs=[*records[:7], huge, *records[8:]]
            ),
        ),
    )
    parts = split_envelope(env, 10_000)
    bad = [p for p in parts if p.problem is not None]
    assert len(bad) == 1 and bad[0].problem is not None
    assert bad[0].problem.path == "data.attributes.slurm_jobs[7]"
    assert f"job {huge.job_id}" in bad[0].problem.reason and "10000" in bad[0].problem.reason
    good = [p.envelope for p in parts if p.problem is None]
    assert _records(good) == [*records[:7], *records[8:]]
    messages, problems = envelope_messages("fox.sonar.job", encode_envelope(env), 10_000, env=env)
    assert [m.payload for m in messages] == [p.payload for p in parts if p.problem is None]
    assert [p.path for p in problems] == ["data.attributes.slurm_jobs[7]"]
    assert problems[0].place == "fox.sonar.job"


def test_a_sample_is_never_cut() -> None:
    env = big_sample(1_200_000)
    raw = encode_envelope(env)
    parts = split_envelope(env, LIMIT, payload=raw)
    assert len(parts) == 1 and parts[0].payload == raw and parts[0].problem is not None
    assert "never cut" in parts[0].problem.reason and str(LIMIT) in parts[0].problem.reason
    messages, problems = envelope_messages("fox.sonar.sample", raw, LIMIT, kind="sample")
    assert messages == [] and problems[0].kind == "sonar sample"
    assert envelope_messages("fox.sonar.sample", raw, len(raw), kind="sample")[0][0].payload == raw


def test_a_cluster_envelope_with_many_nodes_splits() -> None:
    env = big_cluster(3000)
    assert env.data is not None
    raw = encode_envelope(env)
    parts = split_envelope(env, 64 * 1024, payload=raw)
    assert len(raw) > 200_000 and len(parts) >= 4
    assert all(p.problem is None and len(p.payload) <= 64 * 1024 for p in parts)
    got = [p.envelope for p in parts]
    assert all(isinstance(e, ClusterEnvelope) and validate_envelope(e) == [] for e in got)
    assert [x for e in got for x in e.data.attributes.partitions] == env.data.attributes.partitions  # type: ignore[union-attr]
    assert [x for e in got for x in e.data.attributes.nodes] == env.data.attributes.nodes  # type: ignore[union-attr]
    assert {e.data.attributes.time for e in got} == {env.data.attributes.time}  # type: ignore[union-attr]


def test_message_ids_are_per_part_and_a_fitting_envelope_keeps_its_id() -> None:
    env = big_jobs(300_000)
    raw = encode_envelope(env)
    subject = "fox.sonar.job"
    whole, _ = envelope_messages(subject, raw, len(raw), kind="job")
    assert [(m.payload, m.msg_id) for m in whole] == [(raw, msg_id(subject, raw))]
    messages, problems = envelope_messages(subject, raw, 100_000, kind="job")
    assert problems == [] and len(messages) == 4
    assert len({m.msg_id for m in messages}) == 4
    assert [m.msg_id for m in messages] == [
        msg_id(subject, m.payload, f"{i}/4") for i, m in enumerate(messages, 1)
    ]
    assert envelope_messages(subject, raw, 100_000, kind="job")[0] == messages  # a retry: the same ids


@pytest.mark.parametrize("limit", [64 * 1024, 1024 * 1024 - 200])
def test_translated_events_of_a_large_envelope_fit_the_message(limit: int) -> None:
    """`consume sonar --to lp` cuts by the server's limit: every jobs and cluster event, and every message of
    them, fits (quotes escaped), and the jobs parts join back to the envelope."""
    budget = event_budget(limit)
    for env in (big_jobs(900_000, "fox"), big_cluster(4000, "fox")):
        groups = envelope_payloads(env, cluster="fox", max_bytes=limit, max_event_bytes=budget)
        assert all(len(p) <= limit for payloads in groups.values() for p in payloads)
        assert all(split_payloads(p, limit) == [p] for payloads in groups.values() for p in payloads)
    jobs = big_jobs(900_000, "fox")
    lines = jobs_to_lines(jobs, cc_events=False, max_part_bytes=budget)
    assert len(lines) > 1
    joined = JobsAssembler().add_lines(lines, now=0)
    assert [a.envelope for a in joined] == [jobs] and joined[0].complete
    cluster = big_cluster(4000, "fox")
    events = cluster_to_lines(cluster, max_part_bytes=budget)
    parts = [
        decode_envelope(str(e.fields["event"]), expect="cluster")
        for e in events
        if e.measurement == "cluster"
    ]
    assert (
        len(parts) > 1
        and [n for p in parts for n in p.data.attributes.nodes] == cluster.data.attributes.nodes
    )  # type: ignore[union-attr]
    hosts = [
        n["hostname"]
        for e in events
        if e.measurement == "nodestate"
        for n in msgspec.json.decode(str(e.fields["event"]))["nodes"]
    ]
    assert len(hosts) == 4000 * 64 and len(set(hosts)) == len(hosts)


def test_a_sample_envelope_type_is_kept_whole_whatever_the_budget() -> None:
    env = big_sample(50_000)
    assert isinstance(split_envelope(env, 1000)[0].envelope, SampleEnvelope)
    assert len(split_envelope(env, 1000)) == 1


def test_default_jobs_and_cluster_events_fit_a_producers_message_whatever_they_hold() -> None:
    """Producers (`produce slurm`, `produce ocs`) cut their messages at `MAX_PAYLOAD`: a jobs or cluster event
    line, quotes escaped, always fits one, even for records made of quotes (escaping doubles them)."""
    env = big_jobs(600_000, "fox")
    assert env.data is not None
    quoted = [msgspec.structs.replace(r, job_name='"' * 400) for r in env.data.attributes.slurm_jobs]
    env = msgspec.structs.replace(
        env,
        data=msgspec.structs.replace(
            env.data, attributes=msgspec.structs.replace(env.data.attributes, slurm_jobs=quoted)
        ),
    )
    lines = jobs_to_lines(env, cc_events=False)
    assert len(lines) > 3
    assert all(len(format_line(line)) + 1 <= MAX_PAYLOAD for line in lines)
    assert all(len(p) <= MAX_PAYLOAD for p in batch(lines))
    lines = cluster_to_lines(big_cluster(20_000, "fox"))
    assert all(len(format_line(line)) + 1 <= MAX_PAYLOAD for line in lines)


# --- split_own: a producer's own envelope, each record encoded once ------------------------------------------


def same_split(env: object, limit: int) -> list[Part]:
    """`split_own` gives `split_envelope`'s parts, and each part's bytes are what the encoder writes for it
    (the records' bytes put in as `msgspec.Raw` are exactly the encoder's)."""
    own = split_own(env, limit)  # type: ignore[arg-type]
    assert own == split_envelope(env, limit, payload=encode_envelope(env))  # type: ignore[arg-type]
    assert own == split_envelope(env, limit)  # type: ignore[arg-type]
    assert all(p.payload == encode_envelope(p.envelope) for p in own)
    assert all(len(p.payload) <= limit for p in own if p.problem is None)
    data = getattr(env, "data", None)
    for field in ("slurm_jobs", "partitions", "nodes"):  # every record once, in order
        if data is not None and hasattr(data.attributes, field):
            got = [r for p in own for r in getattr(p.envelope.data.attributes, field)]  # type: ignore[union-attr]
            assert got == getattr(data.attributes, field)
    return own


@pytest.mark.parametrize("limit", [300, 4000, 64 * 1024, 10**9])
def test_own_envelopes_split_as_received_ones(limit: int) -> None:
    """Jobs and cluster envelopes, one record too large among them, a sample, an envelope without records."""
    jobs = big_jobs(200_000)
    assert jobs.data is not None
    records = jobs.data.attributes.slurm_jobs
    huge = msgspec.structs.replace(records[3], job_name='x"\\\n' * 2_000)
    attrs = msgspec.structs.replace(jobs.data.attributes, slurm_jobs=[*records[:3], huge, *records[4:]])
    with_huge = msgspec.structs.replace(jobs, data=msgspec.structs.replace(jobs.data, attributes=attrs))
    empty = msgspec.structs.replace(
        jobs,
        data=msgspec.structs.replace(jobs.data, attributes=msgspec.structs.replace(attrs, slurm_jobs=[])),
    )
    for env in (jobs, with_huge, big_cluster(300), big_sample(10_000), empty, big_jobs(0)):
        same_split(env, limit)
    assert (len(same_split(jobs, limit)) > 1) == (len(encode_envelope(jobs)) > limit)
    assert [p.problem.path for p in same_split(with_huge, 4000) if p.problem] == [
        "data.attributes.slurm_jobs[3]"
    ]


_text = st.text(max_size=12) | st.sampled_from(["", '"', "\\", "\n", "\r\n", "é", "\x00", "\u2028", "😀"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.builds(
            SlurmJob,
            job_id=st.integers(1, 2**40),
            job_name=_text,
            user_name=_text,
            job_state=st.sampled_from(["COMPLETED", "RUNNING", "CANCELLED by 5"]),
            nodes=st.lists(_text, max_size=3),
            account=_text,
        ),
        max_size=30,
    ),
    _text,
    st.integers(1, 3000),
)
def test_generated_envelopes_split_alike(jobs: list[SlurmJob], cluster: str, limit: int) -> None:
    env = big_jobs(0)
    assert env.data is not None
    attrs = msgspec.structs.replace(env.data.attributes, slurm_jobs=jobs, cluster=cluster)
    env = msgspec.structs.replace(env, data=msgspec.structs.replace(env.data, attributes=attrs))
    same_split(env, limit)


def test_a_record_holding_a_raw_newline_is_encoded_alone() -> None:
    """The records are encoded as JSON lines in one call and cut at newlines: a record whose JSON holds one
    anyway (raw JSON put in by a caller) makes the cut count wrong, and the records are encoded one by one."""
    env = big_jobs(20_000)
    assert env.data is not None
    records = env.data.attributes.slurm_jobs
    odd = msgspec.structs.replace(records[2], nodes=msgspec.Raw(b'[\n"c1"]'))
    attrs = msgspec.structs.replace(env.data.attributes, slurm_jobs=[*records[:2], odd, *records[3:]])
    env = msgspec.structs.replace(env, data=msgspec.structs.replace(env.data, attributes=attrs))
    for limit in (2000, 10**9):
        assert b'[\n"c1"]' in b"".join(p.payload for p in same_split(env, limit))
