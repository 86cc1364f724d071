"""`hpcbus consume sonar` against a real nats-server, as a real worker process.

Every test has its own cluster name (so its own stream and durables) and reads what the worker published back
from the stream itself, so nothing depends on being subscribed at the right moment.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import signal
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from hashlib import sha256
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from nats.js.api import RawStreamMsg

from hpcbus.bus import round_trip
from hpcbus.schemas import subjects
from hpcbus.schemas.lineprotocol import Line, parse_payload
from hpcbus.schemas.sonar import decode_envelope, encode_envelope, iter_envelopes
from hpcbus.schemas.sonar.types import SampleEnvelope
from hpcbus.schemas.translate import batch, envelope_to_lines, msg_id, route
from hpcbus.streams import stream_name
from tests.consumer_helpers import (
    TO_LP,
    TO_SONAR,
    Process,
    Worker,
    bus_messages,
    deadletter_records,
    js_publish,
    log_counter,
    settled,
    sonar_worker,
    unacked,
    wait_for,
    wait_for_async,
)
from tests.corpus import CORPUS
from tests.services import NatsServer

pytestmark = pytest.mark.services

SONAR = CORPUS / "sonar"
GPU_SAMPLES = "jobanalyzer__n1_sample_gpu_v0.14.jsonl"


Start = Callable[..., Worker]
"""`sonar_worker` bound to the test's worker list, temp dir, server and cluster: `start_worker("--to", "lp")`
starts `hpcbus consume sonar --to lp`."""


@pytest.fixture
def start_worker(workers: list[Process], tmp_path: Path, nats_server: NatsServer, cluster: str) -> Start:
    return functools.partial(sonar_worker, workers, tmp_path, nats_server.url, cluster)


def corpus(name: str, kind: str) -> list[Any]:
    return [env for _, env in iter_envelopes((SONAR / name).read_text(), expect=kind)]


def raw_lines(name: str) -> list[bytes]:
    return [line for line in (SONAR / name).read_bytes().splitlines() if line.strip()]


def ours(subject: str, cluster: str) -> str:
    """A subject of the envelope's cluster moved to the test's cluster (the worker does the same)."""
    parsed = subjects.parse(subject)
    return str(subjects.Subject(cluster, parsed.category, parsed.detail))


def lp_messages(env: Any, cluster: str) -> list[tuple[str, bytes]]:
    """The messages a Sonar-aware producer publishes for one envelope (`envelope_to_lines`, `route`, `batch`)."""
    return [
        (ours(subject, cluster), payload)
        for subject, group in route(envelope_to_lines(env)).items()
        for payload in batch(group)
    ]


def messages(nats_server: NatsServer, cluster: str, prefix: str = "") -> list[RawStreamMsg]:
    return bus_messages(nats_server.url, cluster, prefix)


def ack_pending(nats_server: NatsServer, cluster: str, durable: str) -> int:
    return unacked(nats_server.url, cluster, durable)


def lines_on(msgs: list[RawStreamMsg], subject: str) -> list[Line]:
    """The line-protocol lines of the messages on `subject`, in order."""
    return [line for m in msgs if m.subject == subject for line in parse_payload(m.data or b"", now=0).lines]


def counts(msgs: list[RawStreamMsg]) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in msgs:
        out[m.subject or ""] = out.get(m.subject or "", 0) + 1
    return out


def test_lp_of_a_sonar_sample_comes_back_as_the_original_envelope(
    nats_server: NatsServer, cluster: str, start_worker: Start
) -> None:
    start_worker("--to", "sonar", "--grace", "2")
    env = corpus(GPU_SAMPLES, "sample")[0]
    inputs = lp_messages(env, cluster)
    assert [s for s, _ in inputs] == [f"{cluster}.events.sample", f"{cluster}.metrics"]
    js_publish(nats_server.url, inputs)
    subject = f"{cluster}.sonar.sample"
    (out,) = wait_for(lambda: messages(nats_server, cluster, subject), 20, "the envelope on .sonar.sample")
    assert decode_envelope(out.data or b"", expect="sample") == env
    assert out.headers is not None
    assert out.headers["Nats-Msg-Id"] == msg_id(subject, out.data or b"")
    assert out.headers["Hpcbus-Origin"] == "translated"
    # Both inputs are acknowledged once the grace window has passed (none is left pending or redelivered).
    wait_for(lambda: ack_pending(nats_server, cluster, TO_SONAR) == 0, 20, "the inputs acked")
    assert len(messages(nats_server, cluster, subject)) == 1


def test_a_waiting_envelope_holds_its_input_until_the_grace_window_publishes_it(
    nats_server: NatsServer, cluster: str, start_worker: Start
) -> None:
    grace = 2.0
    start_worker("--to", "sonar", "--grace", str(grace))
    env = corpus(GPU_SAMPLES, "sample")[0]
    skeleton, _metrics = lp_messages(env, cluster)  # the metrics never come
    start = time.monotonic()
    js_publish(nats_server.url, [skeleton])
    wait_for(lambda: ack_pending(nats_server, cluster, TO_SONAR) == 1, 10, "the skeleton delivered")
    assert messages(nats_server, cluster, f"{cluster}.sonar.") == []
    (out,) = wait_for(
        lambda: messages(nats_server, cluster, f"{cluster}.sonar.sample"), 20, "the partial envelope"
    )
    wait_for(lambda: ack_pending(nats_server, cluster, TO_SONAR) == 0, 20, "the skeleton acked")
    assert time.monotonic() - start >= grace  # never acknowledged before its envelope could be complete
    partial = decode_envelope(out.data or b"", expect="sample")
    assert partial != env and partial.meta == env.meta  # the skeleton's envelope with its values missing
    assert isinstance(partial, SampleEnvelope) and isinstance(env, SampleEnvelope)
    assert partial.data is not None and env.data is not None
    assert partial.data.attributes.node == env.data.attributes.node


def test_a_sonar_jobs_envelope_becomes_slurm_events_and_cc_backend_job_events(
    nats_server: NatsServer, cluster: str, start_worker: Start
) -> None:
    start_worker("--to", "lp")
    raw = (SONAR / "sonar__fox_jobs_v0.18.1_trimmed.json").read_bytes()
    env = decode_envelope(raw, expect="job")
    js_publish(nats_server.url, [(f"{cluster}.sonar.job", raw)])
    expected = lp_messages(env, cluster)
    got = wait_for(
        lambda: (m := messages(nats_server, cluster, f"{cluster}.events.")) and len(m) >= len(expected) and m,
        20,
        "the job events",
    )
    assert sorted((m.subject, m.data) for m in got) == sorted(expected)  # exactly the mapping's lines
    for m in got:
        assert m.headers is not None and m.headers["Nats-Msg-Id"] == msg_id(m.subject or "", m.data or b"")
        assert m.headers["Hpcbus-Origin"] == "translated"
    slurm = lines_on(got, f"{cluster}.events.slurm")
    assert [(line.measurement, line.tags["function"]) for line in slurm] == [("slurm", "sonar")]
    assert decode_envelope(str(slurm[0].fields["event"]), expect="job") == env
    jobs = lines_on(got, f"{cluster}.events.job")
    stops = {
        json.loads(str(line.fields["event"]))["jobId"]: json.loads(str(line.fields["event"]))
        for line in jobs
        if line.tags["function"] == "stop_job"
    }
    assert all(line.tags["origin"] == "sonar" for line in jobs)
    assert stops[1955319]["jobState"] == "timeout" and stops[1955319]["stopTime"] == 1758866726  # mapping.md
    assert {k: s["jobState"] for k, s in stops.items()} == {
        1955319: "timeout",
        1956882: "failed",
        1956889: "completed",
    }
    assert {line.tags["function"] for line in jobs} == {"start_job", "stop_job"}


def test_a_bad_envelope_is_dead_lettered_and_logged_and_the_good_ones_go_on(
    nats_server: NatsServer, tmp_path: Path, cluster: str, workers: list[Process], start_worker: Start
) -> None:
    start_worker("--to", "lp")
    sysinfo = raw_lines("jobanalyzer__n1_sysinfo_gpu_v0.14.jsonl")[0]
    broken = b'{"meta":{"producer":"sonar","version":"0.18.1"},"data":{"type":"job",'
    good = raw_lines(GPU_SAMPLES)[0]
    js_publish(
        nats_server.url,
        [
            (f"{cluster}.sonar.sample", sysinfo),
            (f"{cluster}.sonar.job", broken),
            (f"{cluster}.sonar.sample", good),
        ],
    )
    dead = wait_for(
        lambda: (d := bus_messages(nats_server.url, cluster, kind="HPCBUS_DLQ")) and len(d) >= 2 and d,
        20,
        "two dead letters",
    )
    assert [m.subject for m in dead] == [f"{cluster}.deadletter.sonar"] * 2
    assert [m.data for m in dead] == [sysinfo, broken]  # the original payloads, for replay
    first, second = (json.loads((m.headers or {})["Hpcbus-Problems"]) for m in dead)
    assert [(m.headers or {})["Hpcbus-Subject"] for m in dead] == [
        f"{cluster}.sonar.sample",
        f"{cluster}.sonar.job",
    ]
    assert any(p["path"] == "data.type" and "expected a `sample` envelope" in p["reason"] for p in first)
    assert "invalid JSON" in second[0]["reason"]
    logged = [m.data.decode() for m in messages(nats_server, cluster, f"{cluster}.log.hpcbus") if m.data]
    assert any(
        f"{cluster}.sonar.sample: sonar sysinfo: data.type: expected a `sample`" in line
        and "loglevel=error" in line
        for line in logged
    )
    assert any(f"{cluster}.sonar.job: sonar job: invalid JSON" in line for line in logged)
    # The good envelope after them was translated.
    wait_for(lambda: messages(nats_server, cluster, f"{cluster}.metrics"), 20, "the good sample's metrics")
    records = deadletter_records(workers, tmp_path / "dlq.log", nats_server.url, cluster)
    assert [r["subject"] for r in records] == [f"{cluster}.sonar.sample", f"{cluster}.sonar.job"]


def test_both_directions_never_translate_their_own_output(
    nats_server: NatsServer, cluster: str, start_worker: Start
) -> None:
    grace = 2.0
    w = start_worker("--to", "both", "--grace", str(grace))
    native_raw = raw_lines(GPU_SAMPLES)[0]
    native = decode_envelope(native_raw, expect="sample")
    fox = corpus("slurmmonitor__fox_sample_slurmnode_v0.18.json", "sample")[0]
    lp_in = lp_messages(fox, cluster)
    js_publish(nats_server.url, [(f"{cluster}.sonar.sample", native_raw), *lp_in])
    # Expected: the 2 inputs' worth of messages, the native envelope's lines, the LP's envelope; nothing more.
    expected = counts([RawStreamMsg(subject=s) for s, _ in [*lp_messages(native, cluster), *lp_in]])
    expected[f"{cluster}.sonar.sample"] = 2
    wait_for(lambda: counts(messages(nats_server, cluster)) == expected, 20, f"exactly {expected}")
    # Both directions have taken and acknowledged everything on the stream (the LP inputs once their grace
    # window published the envelope): nothing stored can still cause output.
    wait_for(lambda: settled(nats_server.url, cluster, TO_SONAR, TO_LP), 20, "both directions settled")
    msgs = messages(nats_server, cluster)
    assert counts(msgs) == expected
    sonar_out = [m for m in msgs if m.subject == f"{cluster}.sonar.sample"]
    assert sonar_out[0].data == native_raw and "Hpcbus-Origin" not in (
        sonar_out[0].headers or {}
    )  # the input
    assert decode_envelope(sonar_out[1].data or b"", expect="sample") == fox  # the only envelope assembled
    w.signal(signal.SIGTERM)
    assert w.wait(20) == 0
    text = w.log()
    # LP -> Sonar translated the 2 LP input messages only; it skipped the 2 translated ones (and, at shutdown,
    # perhaps the other direction's marked self-telemetry); Sonar -> LP skipped the assembled envelope.
    got = re.search(r"to-sonar: received (\d+), .*; received lines (\d+), skipped messages (\d+),", text)
    assert got is not None and int(got[1]) - int(got[3]) == 2 and int(got[2]) == 361, text
    assert "envelopes 1, partial envelopes 0," in text
    assert re.search(r"hpcbus-sonar-to-lp: received 2, .*; skipped messages 1, envelopes 1,", text), text


def test_directory_tree_as_sonar_writes_it(
    nats_server: NatsServer, tmp_path: Path, cluster: str, start_worker: Start
) -> None:
    tree = tmp_path / "data"
    w = start_worker("--to", "both", "--grace", "2", "--directory", f"{tree}/{{cluster}}")
    samples = corpus(GPU_SAMPLES, "sample")
    sample_raw = raw_lines(GPU_SAMPLES)
    sysinfo_raw = raw_lines("jobanalyzer__n1_sysinfo_gpu_v0.14.jsonl")
    jobs_raw = raw_lines("jobanalyzer__cluster1_jobs_v0.14_trimmed.jsonl")
    cluster_raw = raw_lines("jobanalyzer__cluster1_cluster_v0.14.jsonl")
    inputs = [
        *lp_messages(samples[0], cluster),  # LP -> Sonar writes this one
        (f"{cluster}.sonar.sample", sample_raw[1]),  # Sonar -> LP writes the native ones
        *((f"{cluster}.sonar.sysinfo", raw) for raw in sysinfo_raw),
        *((f"{cluster}.sonar.job", raw) for raw in jobs_raw),
        *((f"{cluster}.sonar.cluster", raw) for raw in cluster_raw),
    ]
    js_publish(nats_server.url, inputs)
    root = tree / cluster
    files = {
        "2025/04/13/0+sample-n1.cluster1.uio.no.json": (samples, "sample"),
        "2025/04/13/0+sysinfo-n1.cluster1.uio.no.json": (
            corpus("jobanalyzer__n1_sysinfo_gpu_v0.14.jsonl", "sysinfo"),
            "sysinfo",
        ),
        "2025/05/03/0+job-slurm.json": (
            corpus("jobanalyzer__cluster1_jobs_v0.14_trimmed.jsonl", "job"),
            "job",
        ),
        "2025/05/03/0+cluzter-slurm.json": (
            corpus("jobanalyzer__cluster1_cluster_v0.14.jsonl", "cluster"),
            "cluster",
        ),
    }

    def lines_written() -> int:
        return sum(p.read_bytes().count(b"\n") for p in root.rglob("*.json")) if root.exists() else 0

    wait_for(lambda: lines_written() >= 7, 20, "seven envelopes in the tree")
    # Settled: the translated copies on the bus were taken and acknowledged, so they were not written again.
    wait_for(lambda: settled(nats_server.url, cluster, TO_SONAR, TO_LP), 20, "both directions settled")
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == sorted(files)
    for rel, (envs, kind) in files.items():
        text = (root / rel).read_text()
        assert text.endswith("\n")
        got = [decode_envelope(line, expect=kind) for line in text.splitlines()]  # JSONL, one per line
        assert sorted(map(repr, got)) == sorted(map(repr, envs)), rel
    w.signal(signal.SIGTERM)
    assert w.wait(20) == 0


LONG_HOST = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])
"""A valid FQDN of 253 characters: `0+sample-<host>.json` would be 267 bytes, over the 255 a file name may have."""


def test_a_253_character_host_name_gets_its_file_and_the_next_host_gets_its_own(
    nats_server: NatsServer, tmp_path: Path, cluster: str, start_worker: Start
) -> None:
    """Was: ENAMETOOLONG retried forever, both directions halted, the next host's file never written."""
    assert len(LONG_HOST) == 253
    tree = tmp_path / "data"
    w = start_worker("--to", "both", "--grace", "2", "--directory", str(tree))
    raw = json.loads(raw_lines(GPU_SAMPLES)[0])
    hosts = [LONG_HOST, "n2.cluster1.uio.no"]
    envs = []
    for host in hosts:
        raw["data"]["attributes"]["node"] = host
        envs.append(decode_envelope(json.dumps(raw).encode(), expect="sample"))
    # The long host's sample as lines (LP -> Sonar writes it), the next host's as a native envelope
    # (Sonar -> LP writes it): both directions must keep flowing.
    js_publish(
        nats_server.url,
        [*lp_messages(envs[0], cluster), (f"{cluster}.sonar.sample", encode_envelope(envs[1]))],
    )
    day = tree / "2025/04/13"
    long_file = day / (
        "0+sample-" + LONG_HOST[:224] + "~" + sha256(LONG_HOST.encode()).hexdigest()[:16] + ".json"
    )
    next_file = day / "0+sample-n2.cluster1.uio.no.json"
    wait_for(lambda: long_file.exists() and next_file.exists(), 20, f"both files in {day}")
    assert len(long_file.name.encode()) == 255
    wait_for(lambda: settled(nats_server.url, cluster, TO_SONAR, TO_LP), 20, "both directions settled")
    for path, env in ((long_file, envs[0]), (next_file, envs[1])):
        (line,) = path.read_text().splitlines()
        assert decode_envelope(line, expect="sample") == env  # the host is in the record, whole
    assert sorted(p.name for p in day.iterdir()) == sorted([long_file.name, next_file.name])
    assert "File name too long" not in w.log()
    assert bus_messages(nats_server.url, cluster, kind="HPCBUS_DLQ") == []
    w.signal(signal.SIGTERM)
    assert w.wait(20) == 0


def test_a_file_that_can_never_be_written_dead_letters_its_message_and_the_next_ones_flow(
    nats_server: NatsServer, tmp_path: Path, cluster: str, start_worker: Start
) -> None:
    """A file where the day's directory should be: no retry can write there (an error no retry cures, like
    a permission refused); the message is dead-lettered with the reason, the next day's file is written."""
    tree = tmp_path / "data"
    (tree / "2025/04").mkdir(parents=True)
    (tree / "2025/04/13").write_text("in the way")
    w = start_worker("--to", "lp", "--directory", str(tree))
    raw = json.loads(raw_lines(GPU_SAMPLES)[0])
    blocked = encode_envelope(decode_envelope(json.dumps(raw).encode(), expect="sample"))
    raw["data"]["attributes"]["time"] = "2025-04-14T08:17:35+02:00"
    fine = encode_envelope(decode_envelope(json.dumps(raw).encode(), expect="sample"))
    subject = f"{cluster}.sonar.sample"
    js_publish(nats_server.url, [(subject, blocked), (subject, fine)])
    written = tree / "2025/04/14/0+sample-n1.cluster1.uio.no.json"
    wait_for(written.exists, 20, f"{written}")
    wait_for(lambda: settled(nats_server.url, cluster, TO_LP), 20, "the durable settled")
    (dead,) = wait_for(lambda: bus_messages(nats_server.url, cluster, kind="HPCBUS_DLQ"), 20, "a dead letter")
    assert dead.data == blocked
    (problem,) = json.loads((dead.headers or {})["Hpcbus-Problems"])
    assert "can never be delivered" in problem["reason"] and "2025/04/13" in problem["reason"]
    assert w.log().count("can never be delivered") == 1
    w.signal(signal.SIGTERM)
    assert w.wait(20) == 0


def test_sigterm_returns_waiting_input_and_the_next_worker_completes_the_envelope(
    nats_server: NatsServer, cluster: str, start_worker: Start
) -> None:
    a = start_worker("--to", "both", "--grace", "30", name="a")
    env = corpus(GPU_SAMPLES, "sample")[0]
    skeleton, metrics = lp_messages(env, cluster)
    js_publish(nats_server.url, [skeleton])
    wait_for(lambda: ack_pending(nats_server, cluster, TO_SONAR) == 1, 10, "the skeleton delivered")
    a.signal(signal.SIGTERM)
    assert a.wait(20) == 0
    text = a.log()
    assert "stopped cleanly" in text and "returned 1 messages" in text
    assert messages(nats_server, cluster, f"{cluster}.sonar.") == []  # not published partial
    start_worker("--to", "both", "--grace", "30", name="b")
    js_publish(nats_server.url, [metrics])
    (out,) = wait_for(lambda: messages(nats_server, cluster, f"{cluster}.sonar.sample"), 20, "the envelope")
    assert decode_envelope(out.data or b"", expect="sample") == env  # complete: the skeleton came back


def test_a_killed_worker_loses_no_waiting_input(
    nats_server: NatsServer, cluster: str, start_worker: Start
) -> None:
    # ack_wait 1 s is raised to 2 x grace + 10 = 14 s, after which JetStream redelivers the killed worker's input.
    a = start_worker("--to", "sonar", "--grace", "2", name="a", delivery="ack_wait = 1.0\n")
    env = corpus(GPU_SAMPLES, "sample")[0]
    skeleton, _metrics = lp_messages(env, cluster)
    js_publish(nats_server.url, [skeleton])
    wait_for(lambda: ack_pending(nats_server, cluster, TO_SONAR) == 1, 10, "the skeleton delivered")
    assert "delivery ack_wait 1s raised to 14s" in a.log()
    a.signal(signal.SIGKILL)
    a.wait(10)
    assert messages(nats_server, cluster, f"{cluster}.sonar.") == []
    start_worker("--to", "sonar", "--grace", "2", name="b")
    (out,) = wait_for(
        lambda: messages(nats_server, cluster, f"{cluster}.sonar.sample"), 40, "the redelivered skeleton"
    )
    partial = decode_envelope(out.data or b"", expect="sample")
    assert partial.meta == env.meta and partial != env  # the skeleton alone, published after its grace window


def test_core_mode_translates_without_jetstream_and_without_loops(
    nats_server: NatsServer, cluster: str, start_worker: Start
) -> None:
    w = start_worker("--mode", "core", "--to", "both", "--grace", "1")
    native_raw = raw_lines(GPU_SAMPLES)[0]
    native = decode_envelope(native_raw, expect="sample")
    seen: list[tuple[str, bytes, dict[str, str]]] = []
    expected = sorted((s, p) for s, p in lp_messages(native, cluster))

    def translated() -> list[tuple[str, bytes]]:
        return sorted((s, p) for s, p, h in seen if h.get("Hpcbus-Origin") == "translated")

    async def scenario() -> int:
        nc = await nats.connect(nats_server.url)

        async def on_msg(msg: Any) -> None:
            seen.append((msg.subject, msg.data, dict(msg.headers or {})))

        await nc.subscribe(f"{cluster}.>", cb=on_msg)
        await round_trip(nc, 5)
        await nc.publish(f"{cluster}.sonar.sample", native_raw)  # core publish, as `nats pub` does
        await wait_for_async(lambda: len(translated()) >= len(expected), 20, "the translated lines")
        # Without JetStream, SIGTERM publishes whatever the assembler still holds (partial envelopes too)
        # before the worker exits: once it has exited, everything it would ever publish is out.
        w.signal(signal.SIGTERM)
        rc = await asyncio.to_thread(w.wait, 20)
        await round_trip(nc, 5)
        streams.extend(info.config.name for info in await nc.jetstream().streams_info())
        await nc.close()
        return rc

    streams: list[str | None] = []
    rc = asyncio.run(scenario())
    # core mode asks JetStream for nothing: neither the cluster's stream nor its dead-letter stream
    assert not {stream_name("HPCBUS", cluster), stream_name("HPCBUS_DLQ", cluster)} & set(streams)
    assert translated() == expected  # the lines, once; never reassembled into a second envelope
    assert [s for s, _, _ in seen if ".sonar." in s] == [f"{cluster}.sonar.sample"]
    text = w.log()
    assert rc == 0 and "core NATS: at-most-once" in text
    # LP -> Sonar did receive the translated lines (there was something to reassemble) and skipped them all
    # (the worker's own telemetry, published while it stops, may be among them: also skipped).
    got = re.search(r"to-sonar: received (\d+), .*; received lines (\d+), skipped messages (\d+),", text)
    assert got is not None and int(got[1]) == int(got[3]) >= len(expected) and int(got[2]) == 0, text


def _at(env: Any, node: str, seconds: int) -> Any:
    """The envelope from `node`, `seconds` later (the node agent's next interval): a copy, as built by a
    writer that does not check host names against Sonar's rule (line protocol allows `c1_5`)."""
    attrs = env.data.attributes
    moved = datetime.fromisoformat(attrs.time) + timedelta(seconds=seconds)
    attrs = msgspec.structs.replace(attrs, node=node, time=moved.isoformat(timespec="seconds"))
    return msgspec.structs.replace(env, data=msgspec.structs.replace(env.data, attributes=attrs))


def test_a_host_sonar_refuses_is_said_once_and_dead_lettered_once(
    nats_server: NatsServer, tmp_path: Path, cluster: str, workers: list[Process], start_worker: Start
) -> None:
    """Issue 32 item 2: `c1_5` and a single label of 253 characters are host names line protocol carries
    but Sonar's `Hostname` refuses (`names.sonar_host_problem`). Interval after interval, each is refused
    once (one WARNING, one dead letter: its first message, with the reason), counted in the self-telemetry
    (`refused hosts`, `refused host lines`), and no envelope is built for it (none without `data` or
    `errors`, none the validator refuses); the good host beside them is translated every interval."""
    w = start_worker("--to", "sonar", "--grace", "1")
    sample = corpus(GPU_SAMPLES, "sample")[0]
    sysinfo = corpus("jobanalyzer__n1_sysinfo_gpu_v0.14.jsonl", "sysinfo")[0]
    good, bad = "n1.cluster1.uio.no", ["c1_5", "a" * 253]
    intervals, lines = 3, 0
    for i in range(intervals):
        refused = [
            m
            for host in bad
            for env in (sample, sysinfo)
            for m in lp_messages(_at(env, host, 30 * i), cluster)
        ]
        lines += sum(len(parse_payload(payload, now=0).lines) for _, payload in refused)
        js_publish(nats_server.url, [*refused, *lp_messages(_at(sample, good, 30 * i), cluster)])
        wait_for(
            lambda n=i + 1: len(messages(nats_server, cluster, f"{cluster}.sonar.sample")) == n,
            20,
            f"the good host's envelope of interval {i}",
        )
        wait_for(lambda: ack_pending(nats_server, cluster, TO_SONAR) == 0, 20, f"interval {i} settled")
    out = messages(nats_server, cluster, f"{cluster}.sonar.")
    envelopes = [decode_envelope(m.data or b"") for m in out]  # every one valid (decode validates)
    assert [env.data.attributes.node for env in envelopes] == [good] * intervals
    dead = bus_messages(nats_server.url, cluster, kind="HPCBUS_DLQ")
    assert len(dead) == len(bad)  # one a host for the episode, not one a sample (or two) every interval
    reasons = [json.loads((m.headers or {})["Hpcbus-Problems"]) for m in dead]
    assert sorted(p["reason"].split(":")[0] for r in reasons for p in r) == [
        f"Sonar Hostname '{'a' * 40}'... (253 characters) has a label of 253 characters, longer than 63",
        "Sonar Hostname 'c1_5'",
    ]
    w.signal(signal.SIGTERM)
    assert w.wait(20) == 0
    text = w.log()
    warnings = [line for line in text.splitlines() if "WARNING" in line]
    assert len([line for line in warnings if "'c1_5'" in line]) == 1, warnings
    assert len([line for line in warnings if "(253 characters)" in line]) == 1, warnings
    assert log_counter(text, r"refused hosts (\d+)") == len(bad)
    # every line of a bad host refused: its metrics, its skeleton and its sysinfo event
    assert log_counter(text, r"refused host lines (\d+)") == lines
    assert log_counter(text, r"invalid envelopes (\d+)") == 0
