"""One contract for every sink (issue 30), held by one test: each sink runs on the runtime (`run_feeds`,
real nats-server and InfluxDB) through good input, bad input and input that fails permanently, and must
account for every message the same way (received = delivered + dead-lettered + returned + pending, with
nothing pending at the end) and publish exactly its counters as `hpcbus_<name>` self-telemetry. A counter
left out of the identity, a message acknowledged without being counted, or a sink that retries or
dead-letters behind the runtime's back fails here.

Permanently failing input is what each sink's far end can never take: InfluxDB refusing every write (no
database named), an ingest target subject no stream holds, a Sonar tree file that can never be written, an
envelope no stream takes, a job summary no stream takes (the jobs sink's delivery is saving its own state
file, transient by design: `hpcbus.consumers.jobs.sink.JobsSink.save`; what can fail for good is its
output, handed to the runtime as a dead letter like the Sonar envelope).

Besides, `test_no_sink_acknowledges_retries_or_takes_still_working` reads the sink modules: no
acknowledgement call, no `retry`, `publish_retrying` or `still_working` in any of them, and `deliver`,
`tick` and `close` take the batch and the stop only.
"""

from __future__ import annotations

import ast
import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import msgspec
import nats
import pytest
from nats.aio.client import Client as NATS

from hpcbus.bus import StreamSpec, deadletter_stream, ensure_stream, ingest_stream, stream_name
from hpcbus.consumers.influx.sink import InfluxSink
from hpcbus.consumers.ingest.sink import IngestSink
from hpcbus.consumers.jobs.settings import JobsSettings
from hpcbus.consumers.jobs.sink import JobsSink
from hpcbus.consumers.sonar.directory import DirectoryWriter
from hpcbus.consumers.sonar.settings import SonarSettings
from hpcbus.consumers.sonar.to_lp import ToLpSink
from hpcbus.consumers.sonar.to_sonar import ToSonarSink
from hpcbus.counters import STANDARD
from hpcbus.influx.settings import InfluxSettings
from hpcbus.influx.writer import make_writer
from hpcbus.outlet import Outlet
from hpcbus.retry import Stopping
from hpcbus.runner import RunnerSettings, Sink
from hpcbus.schemas import subjects
from hpcbus.schemas.jobsummary import State
from hpcbus.schemas.lineprotocol import parse_payload
from hpcbus.sinks import Feed, run_feeds
from tests.consumer_helpers import stream_messages, wait_for_async
from tests.corpus import CORPUS
from tests.services import InfluxDB, NatsServer
from tests.test_consume_sonar_unit import sample_messages

ROOT = Path(__file__).resolve().parents[1]
SONAR = CORPUS / "sonar"
NOW = int(time.time())


class Case(NamedTuple):
    """One sink's run: the streams it needs, what it reads, what is published, what it must count."""

    streams: list[StreamSpec]
    reads: list[str]
    messages: list[tuple[str, bytes]]
    sink: Sink
    expect: dict[str, int]
    """Counters the run must end with (besides the identity)."""
    close: Callable[[], object] | None = None


def telemetry_only(cluster: str, *also: str) -> StreamSpec:
    """A stream for the worker's own telemetry and log subject and `also`: nothing else has a stream."""
    return StreamSpec(
        name=stream_name("HPCBUS", cluster),
        subjects=[subjects.telemetry(cluster), subjects.wildcard(cluster, "log"), *also],
    )


def influx_case(nc: NATS, cluster: str, influxdb: InfluxDB, outcome: str) -> Case:
    db = "" if outcome == "permanent" else f"compliance_{uuid.uuid4().hex[:8]}"  # "": every write refused
    settings = InfluxSettings(url=influxdb.url, db=db, max_retry_wait=0.05)
    writer = make_writer(settings)
    metrics = subjects.metrics(cluster)
    good = f"cpu_load,hostname=n1,type=node value=1.5 {NOW}\n".encode()
    if outcome == "permanent":
        messages, expect = (
            [(metrics, good), (metrics, good.replace(b"n1", b"n2"))],
            {"undeliverable_messages": 2},
        )
    else:
        messages, expect = [(metrics, good), (metrics, b"not a line\n")], {"delivered": 1, "deadlettered": 1}
    sink = InfluxSink(nc, writer, settings, cluster, "c-influx")
    return Case([telemetry_only(cluster, metrics)], [metrics], messages, sink, expect, writer.close)


def jobs_case(nc: NATS, cluster: str, influxdb: InfluxDB, tmp: Path, outcome: str) -> Case:
    settings = InfluxSettings(url=influxdb.url, db=f"compliance_{uuid.uuid4().hex[:8]}")
    writer = make_writer(settings)
    outlet = Outlet(nc, cluster, jetstream=True)
    jobs = JobsSettings(process_quiet=0.1)
    sink = JobsSink(outlet, writer, jobs, "c-jobs", State(), tmp / "jobs.state")
    metrics = subjects.metrics(cluster)
    if outcome == "permanent":  # no stream takes <cluster>.events.jobsummary: the summary is dead-lettered
        job = f"job_processes,hostname=n1,job=5,stype=job,stype-id=5,type=node value=1i {NOW}\n".encode()
        messages = [(metrics, job)]
        expect = {"delivered": 1, "deadlettered_merged": 1, "refused_summaries": 1, "summaries": 0}
    else:
        good = f"cpu_load,hostname=n1,type=node value=1.5 {NOW}\n".encode()
        messages, expect = [(metrics, good), (metrics, b"not a line\n")], {"delivered": 1, "deadlettered": 1}
    return Case([telemetry_only(cluster, metrics)], [metrics], messages, sink, expect, writer.close)


def ingest_case(nc: NATS, cluster: str, outcome: str) -> Case:
    outlet = Outlet(nc, cluster, jetstream=True)
    own = f"cpu_load,hostname=n001,type=node value=1.5 {NOW}\n".encode()
    metrics = subjects.ingest(cluster, "n001", subjects.metrics(cluster))
    if outcome == "permanent":  # the node may send its logs, but no stream holds <cluster>.log.syslog
        target = subjects.log(cluster, "syslog")
        line = f'syslog,hostname=n001 log="disk ok" {NOW}\n'.encode()
        messages = [(metrics, own), (subjects.ingest(cluster, "n001", target), line)]
        expect = {"delivered": 1, "undeliverable_messages": 1}
        forwards = StreamSpec(
            name=stream_name("HPCBUS", cluster),
            subjects=[subjects.telemetry(cluster), subjects.metrics(cluster)],
        )
    else:
        messages = [(metrics, own), (metrics, own.replace(b"n001", b"n002"))]  # a forged host: refused
        expect = {"delivered": 1, "deadlettered": 1}
        forwards = telemetry_only(cluster, subjects.metrics(cluster))
    streams = [ingest_stream(cluster), forwards]
    return Case(
        streams, [subjects.ingest_wildcard(cluster)], messages, IngestSink(outlet, "c-ingest"), expect
    )


def to_lp_case(nc: NATS, cluster: str, tmp: Path, outcome: str) -> Case:
    outlet = Outlet(nc, cluster, jetstream=True)
    tree = tmp / "tree"
    envelope = (SONAR / "jobanalyzer__n1_sample_gpu_v0.14.jsonl").read_bytes().splitlines()[0]
    sample = subjects.sonar(cluster, "sample")
    if outcome == "permanent":  # a file where the envelope's day directory should be
        (tree / "2025/04").mkdir(parents=True)
        (tree / "2025/04/13").write_text("not a directory")
        messages, expect = [(sample, envelope)], {"undeliverable_messages": 1}
    else:
        messages, expect = [(sample, envelope), (sample, b"not json")], {"delivered": 1, "deadlettered": 1}
    stream = telemetry_only(cluster, subjects.wildcard(cluster, "sonar"), subjects.metrics(cluster))
    stream.subjects.append(subjects.wildcard(cluster, "events"))
    sink = ToLpSink(outlet, "c-to-lp", DirectoryWriter(tree))
    return Case([stream], [subjects.wildcard(cluster, "sonar")], messages, sink, expect)


def to_sonar_case(nc: NATS, cluster: str, outcome: str) -> Case:
    outlet = Outlet(nc, cluster, jetstream=True)
    _, msgs = sample_messages(cluster)  # a complete sample: published at once
    messages = [(m.subject, m.data) for m in msgs]
    inputs = [subjects.metrics(cluster), subjects.wildcard(cluster, "events")]
    if outcome == "permanent":  # no stream takes <cluster>.sonar.sample: the envelope is dead-lettered
        stream = telemetry_only(cluster, *inputs)
        expect = {"delivered": len(msgs), "deadlettered_merged": 1}
    else:
        messages.append((subjects.metrics(cluster), b"garbage here\n"))
        stream = telemetry_only(cluster, *inputs, subjects.wildcard(cluster, "sonar"))
        expect = {"delivered": len(msgs), "deadlettered": 1}
    sink = ToSonarSink(outlet, "c-to-sonar", SonarSettings(grace=0.5), None, acks=True)
    return Case([stream], inputs, messages, sink, expect)


async def durable_settled(nc: NATS, stream: str, durable: str) -> bool:
    try:
        info = await nc.jetstream().consumer_info(stream, durable)
    except Exception:
        return False
    return (info.num_pending, info.num_ack_pending) == (0, 0)


CASES = [
    ("influx", "good and bad"),
    ("influx", "permanent"),
    ("jobs", "good and bad"),
    ("jobs", "permanent"),
    ("ingest", "good and bad"),
    ("ingest", "permanent"),
    ("to-lp", "good and bad"),
    ("to-lp", "permanent"),
    ("to-sonar", "good and bad"),
    ("to-sonar", "permanent"),
]


@pytest.mark.services
@pytest.mark.parametrize(("kind", "outcome"), CASES)
async def test_every_sink_accounts_for_every_message_and_publishes_its_counters(
    nats_server: NatsServer, influxdb: InfluxDB, cluster: str, tmp_path: Path, kind: str, outcome: str
) -> None:
    nc = await nats.connect(nats_server.url)
    case = {
        "influx": lambda: influx_case(nc, cluster, influxdb, outcome),
        "jobs": lambda: jobs_case(nc, cluster, influxdb, tmp_path, outcome),
        "ingest": lambda: ingest_case(nc, cluster, outcome),
        "to-lp": lambda: to_lp_case(nc, cluster, tmp_path, outcome),
        "to-sonar": lambda: to_sonar_case(nc, cluster, outcome),
    }[kind]()
    js = nc.jetstream()
    for spec in [*case.streams, deadletter_stream(cluster)]:
        await ensure_stream(js, spec)
    durable = f"c-{kind}"
    read = case.streams[0].name
    delivery = RunnerSettings(durable=durable, flush_seconds=0.1, stats_seconds=3600.0)
    stopping = Stopping(2.0)
    running = asyncio.create_task(run_feeds(nc, [Feed(read, case.reads, delivery, case.sink)], stopping))
    try:
        for subject, payload in case.messages:
            await js.publish(subject, payload)
        c = case.sink.counters
        await wait_for_async(lambda: c.received == len(case.messages), 30, lambda: f"all taken: {c}")
        await wait_for_async(lambda: durable_settled(nc, read, durable), 30, lambda: f"all settled: {c}")
        expected = lambda: all(getattr(c, key) == value for key, value in case.expect.items())  # noqa: E731
        await wait_for_async(expected, 30, lambda: f"{case.expect}: {c}")  # a tick's work comes later
    finally:
        stopping.set()
        await asyncio.wait_for(running, 10)
        if case.close is not None:
            await case.close()  # type: ignore[misc]
    await nc.close()
    values = msgspec.structs.asdict(c)
    assert c.received == len(case.messages)
    assert c.received == c.delivered + c.deadlettered + c.returned_messages + c.pending, c
    assert c.pending == 0 and c.returned_messages == 0, c
    assert {key: values[key] for key in case.expect} == case.expect, c
    # the self-telemetry: every counter of its struct, once each, as hpcbus_<name>, and nothing else
    home = next(spec.name for spec in case.streams if subjects.telemetry(cluster) in spec.subjects)
    published = await stream_messages(nats_server.url, home, subjects.telemetry(cluster))
    last = parse_payload(published[-1].data or b"", now=0).lines
    names = [line.measurement for line in last]
    assert sorted(names) == sorted(f"hpcbus_{key}" for key in values), names
    assert {f"hpcbus_{key}" for key in STANDARD} <= set(names)
    assert {line.measurement: line.fields["value"] for line in last} == {
        f"hpcbus_{k}": v for k, v in values.items()
    }


SINK_MODULES = [
    "consumers/influx/sink.py",
    "consumers/jobs/sink.py",
    "consumers/ingest/sink.py",
    "consumers/sonar/to_lp.py",
    "consumers/sonar/to_sonar.py",
    "consumers/sonar/directory.py",
]
FORBIDDEN_NAMES = {"retry", "publish_retrying", "append_retrying", "still_working", "dead_letter", "Retrying"}
"""What a sink must not use: the runtime retries, keeps alive and dead-letters."""
ACK_CALLS = {"ack", "ack_sync", "nak", "in_progress", "term"}
"""nats-py's acknowledgement calls (`Msg.ack` ...)."""
ACK_BYTES = {b"+ACK", b"+WPI", b"-NAK", b"+NAK", b"+TERM"}
"""The acknowledgement protocol by hand."""
CONTRACT = {
    "deliver": ["self", "batch", "stopping"],
    "tick": ["self", "stopping"],
    "close": ["self", "stopping"],
}


def contract_breaches(source: str, place: str) -> list[str]:
    """What in one sink module's source breaks the contract."""
    found = []
    for node in ast.walk(ast.parse(source, place)):
        if isinstance(node, ast.ImportFrom):
            found += [
                f"{place}:{node.lineno}: imports {a.name}" for a in node.names if a.name in FORBIDDEN_NAMES
            ]
            if (
                node.module
                and node.module.startswith("nats")
                and any(a.name in ACK_CALLS for a in node.names)
            ):
                found.append(f"{place}:{node.lineno}: imports an acknowledgement call")
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            found.append(f"{place}:{node.lineno}: uses {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_NAMES:
            found.append(f"{place}:{node.lineno}: calls {node.attr}")
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in ACK_CALLS
        ):
            found.append(f"{place}:{node.lineno}: acknowledges ({node.func.attr})")
        elif isinstance(node, ast.Constant) and isinstance(node.value, bytes) and node.value in ACK_BYTES:
            found.append(f"{place}:{node.lineno}: the acknowledgement protocol ({node.value!r})")
        elif isinstance(node, ast.arg) and node.arg in FORBIDDEN_NAMES:
            found.append(f"{place}:{node.lineno}: takes {node.arg}")
        elif isinstance(node, ast.AsyncFunctionDef) and node.name in CONTRACT:
            args = [a.arg for a in node.args.args]
            if args != CONTRACT[node.name] or node.args.kwonlyargs:
                found.append(f"{place}:{node.lineno}: {node.name}({', '.join(args)}) is not the contract")
    return found


def test_no_sink_acknowledges_retries_or_takes_still_working() -> None:
    sinks = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob("consumers/*/sink.py"))
    assert set(sinks) <= set(SINK_MODULES)  # a new sink module is listed here
    breaches = [b for path in SINK_MODULES for b in contract_breaches((ROOT / path).read_text(), path)]
    assert breaches == []


def test_the_contract_reader_finds_each_breach() -> None:
    """The reader above, on a sink that breaks every rule: each is named (so the test can fail)."""
    source = """
from hpcbus.retry import retry
class S:
    async def deliver(self, batch, still_working, stopping):
        await msg.ack()
        await self.nc.publish(reply, b"+WPI")
        await self.outlet.publish_retrying(1)
    async def tick(self, stopping, still_working): ...
"""
    found = contract_breaches(source, "s.py")
    for what in ("imports retry", "acknowledges (ack)", "b'+WPI'", "publish_retrying", "takes still_working"):
        assert any(what in line for line in found), (what, found)
    assert sum("is not the contract" in line for line in found) == 2
