"""The node agent's integer counters reach a real InfluxDB 1.6 as integer fields, through a real nats-server
and the real `consume influx` worker; and a site whose InfluxDB already holds them as floats loses nothing.

What goes on the bus is what the node agent publishes every interval (`Pipeline.sample_messages` for the
`hpc` fixture node, with a GPU), published with JetStream as the agent does. The tests of batches across
shards give the sink (`InfluxSink`, on a real nats-server and InfluxDB) the batches themselves, so that which
points share a write is the test's choice, and count the requests it makes.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from hpcbus.consumers.influx.sink import InfluxSink
from hpcbus.influx.settings import InfluxSettings
from hpcbus.influx.writer import Partial, V1Writer
from hpcbus.producers.node import NodeCollector, NodeCollectorConfig
from hpcbus.producers.node.pipeline import AgentConfig, Pipeline
from hpcbus.retry import Stopping
from hpcbus.runner import BadInput
from hpcbus.schemas.lineprotocol import parse_payload
from hpcbus.schemas.metrics import BY_NAME, NODE
from hpcbus.schemas.metrics.node import CPU_FIELDS
from tests.consumer_helpers import Process, Worker, count_points, js_publish, wait_for
from tests.services import InfluxDB, NatsServer
from tests.test_node_gpu_nvml import Card, FakeNvml

pytestmark = pytest.mark.services

FIX = Path(__file__).parent / "fixtures" / "node"
T0, T1 = 1768400000.0, 1768400010.0
WEEK = 8 * 86400
"""Far enough for the next shard group (7 days for an infinite retention policy)."""
INTEGERS = sorted(m.name for m in NODE if m.kind is int)
"""The node agent's integer measurements: the 19 counters (net, ib, lustre, nv_energy_abs) and 5 counts."""


def agent_messages(tmp_path: Path, cluster: str, later: float = 0.0) -> list[tuple[str, bytes]]:
    """What the node agent publishes for its second reading of the `hpc` fixture node (rates included),
    `later` seconds after the fixture's time."""
    root = tmp_path / f"hpc{later}"
    shutil.copytree(FIX / "hpc", root)
    c = NodeCollector(NodeCollectorConfig(root=str(root)), nvml=FakeNvml([Card(0)]))
    c.collect(now=T0 + later)
    shutil.copytree(FIX / "hpc-later", root, dirs_exist_ok=True)
    s = c.collect(now=T1 + later)
    c.close()
    pipeline = Pipeline(cluster, "c1-10", AgentConfig(cpu_fields=list(CPU_FIELDS)))
    return [(m.subject, m.payload) for m in pipeline.sample_messages(s, 512 * 1024, queued=2, dropped=0)]


def metric_counts(messages: list[tuple[str, bytes]]) -> Counter[str]:
    """Metric lines per measurement in the messages."""
    counts: Counter[str] = Counter()
    for subject, payload in messages:
        parsed = parse_payload(payload, now=int(T1 + WEEK), place=subject)
        assert parsed.errors == []
        counts.update(ln.measurement for ln in parsed.lines if "value" in ln.fields)
    return counts


def field_types(influx: InfluxDB, db: str) -> dict[str, set[str]]:
    """measurement -> the types `SHOW FIELD KEYS` reports for its `value` field."""
    out: dict[str, set[str]] = {}
    for row in influx.points("SHOW FIELD KEYS", db):
        if row["fieldKey"] == "value":
            out.setdefault(row["_measurement"], set()).add(row["fieldType"])
    return out


def start_consumer(
    workers: list[Process],
    tmp_path: Path,
    nats: NatsServer,
    influx: InfluxDB,
    cluster: str,
    db: str,
    name: str = "influx",
) -> Worker:
    args = ["consume", "influx", "--nats", nats.url, "--cluster", cluster, "--influx-url", influx.url]
    w = Worker([*args, "--db", db], tmp_path / f"{name}.log")
    workers.append(w)
    return w.start()


def test_the_node_agents_integer_counters_are_integer_fields(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, workers: list[Process]
) -> None:
    db = f"db_{uuid.uuid4().hex[:8]}"
    messages = agent_messages(tmp_path, cluster)
    counts = metric_counts(messages)
    assert set(INTEGERS) <= counts.keys() and len(INTEGERS) == 24
    # On the bus: line protocol integers, as cc-metric-collector sends them (cc-metric-store reads Int too).
    bus = b"".join(p for _, p in messages)
    assert b"value=51250000000i " in bus and b"net_bytes_in," in bus
    start_consumer(workers, tmp_path, nats_server, influxdb, cluster, db)
    js_publish(nats_server.url, messages)
    types = wait_for(
        lambda: (found := field_types(influxdb, db)).keys() >= counts.keys() and found,
        30,
        lambda: (
            f"every measurement in {db}: missing {sorted(counts.keys() - field_types(influxdb, db).keys())}"
        ),
    )
    assert {name: types[name] for name in INTEGERS} == {name: {"integer"} for name in INTEGERS}
    declared = {name: {"integer" if BY_NAME[name].kind is int else "float"} for name in counts}
    assert {name: types[name] for name in counts} == declared  # the Sonar part too (cpu_time, diskstat_*)
    assert count_points(influxdb, db, "net_bytes_in") == counts["net_bytes_in"]


def test_a_site_with_float_counters_keeps_every_point(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, cluster: str, workers: list[Process]
) -> None:
    """An earlier hpcbus wrote `net_bytes_in` and `ib_recv` as floats into the current shard: their integer
    points are refused there ("field type conflict"), and the writer writes them as floats instead; the
    measurements InfluxDB does not hold yet become integers. Someone else wrote `mem_used` as an integer:
    that conflict (first in the batch, and InfluxDB names only the first) is reported and its line dropped,
    as before, and hides neither of the others. Restarted, the writer writes integers into the next shard,
    and a query reads both shards' points."""
    db = f"db_{uuid.uuid4().hex[:8]}"
    influxdb.create_db(db)
    old = int(T1) - 60  # the same shard as the sample
    influxdb.write(
        [
            f"net_bytes_in,cluster={cluster},hostname=old,stype=network,stype-id=eth0,type=node,"
            f"type-id=network value=1.0 {old}",
            f"ib_recv,cluster={cluster},hostname=old,stype=infiniband,stype-id=mlx5_0:1,type=node,"
            f"type-id=infiniband value=2.0 {old}",
            f"mem_used,cluster={cluster},hostname=old,type=node,type-id=0 value=3i {old}",
        ],
        db,
    )
    messages = agent_messages(tmp_path, cluster)
    counts = metric_counts(messages)
    w = start_consumer(workers, tmp_path, nats_server, influxdb, cluster, db)
    js_publish(nats_server.url, messages)
    wait_for(
        lambda: (
            count_points(influxdb, db, "ib_recv") == counts["ib_recv"] + 1
            and count_points(influxdb, db, "net_bytes_in") == counts["net_bytes_in"] + 1
        ),
        30,
        lambda: f"every point of the conflicting measurements:\n{w.log()}",
    )
    for name in INTEGERS:
        assert count_points(influxdb, db, name) == counts[name] + (name in ("net_bytes_in", "ib_recv")), name
    assert count_points(influxdb, db, "mem_used") == 1 and counts["mem_used"] == 1  # the old point only
    types = field_types(influxdb, db)
    assert types["net_bytes_in"] == types["ib_recv"] == {"float"} and types["mem_used"] == {"integer"}
    assert types["net_bytes_out"] == types["ib_xmit"] == types["lustre_open"] == {"integer"}
    notes = wait_for(
        lambda: influxdb.points('SELECT "log" FROM "hpcbus" WHERE "loglevel" = \'warn\'', db),
        15,
        "the warnings on the log subject",
    )
    assert sorted(r["log"] for r in notes) == [
        f"InfluxDB holds {name} as float (written so before): writing it as float"
        for name in ("ib_recv", "net_bytes_in")
    ]
    errors = wait_for(
        lambda: influxdb.points('SELECT "log" FROM "hpcbus" WHERE "loglevel" = \'error\'', db),
        15,
        "the conflict report on the log subject",
    )
    assert len(errors) == 1 and 'on measurement \\"mem_used\\" is type float' in errors[0]["log"], errors
    w.signal(signal.SIGTERM)
    assert w.wait(15) == 0
    assert "rejected 1," in w.log()  # mem_used's line
    start_consumer(workers, tmp_path, nats_server, influxdb, cluster, db, "again")
    js_publish(nats_server.url, agent_messages(tmp_path, cluster, later=WEEK))
    wait_for(
        lambda: field_types(influxdb, db)["net_bytes_in"] == {"float", "integer"},
        30,
        "integers in the next shard",
    )
    assert field_types(influxdb, db)["ib_recv"] == {"float", "integer"}
    wait_for(lambda: count_points(influxdb, db, "net_bytes_in") == 2 * counts["net_bytes_in"] + 1, 15, "all")


class CountingWriter:
    """The real InfluxDB 1.x writer, keeping each metric request's body (seconds; the event lines of a batch
    go in a request of their own): what a conflict costs in writes."""

    def __init__(self, settings: InfluxSettings) -> None:
        self.writer = V1Writer(settings)
        self.bodies: list[str] = []

    async def write(self, body: str, precision: str = "s") -> None:
        if precision == "s":
            self.bodies.append(body)
        await self.writer.write(body, precision)

    async def close(self) -> None:
        await self.writer.close()


@contextlib.asynccontextmanager
async def influx_sink(nats_server: NatsServer, influx: InfluxDB, db: str) -> AsyncIterator[InfluxSink]:
    """An InfluxDB sink as `consume influx` runs it, writing to `db` (its `writer` a `CountingWriter`)."""
    nc = await nats.connect(nats_server.url)
    settings = InfluxSettings(url=influx.url, db=db, processes="full")
    writer = CountingWriter(settings)
    try:
        yield InfluxSink(nc, writer, settings, "lab", "influx")
    finally:
        await writer.close()
        await nc.close()


async def write_batch(sink: InfluxSink, messages: list[tuple[str, bytes]]) -> int:
    """`messages` written as one batch; the number of metric write requests that took."""
    assert isinstance(sink.writer, CountingWriter)
    before = len(sink.writer.bodies)
    for subject, payload in messages:
        with contextlib.suppress(BadInput):  # none expected: `metric_counts` checks the payloads parse
            sink.take(Msg(sink.nc, subject=subject, data=payload))

    await sink.deliver(sink.cut(), Stopping())
    return len(sink.writer.bodies) - before


def lines_in(messages: list[tuple[str, bytes]]) -> int:
    return sum(payload.count(b"\n") for _, payload in messages)


@pytest.mark.parametrize("learned", [True, False], ids=["learned-float", "fresh"])
async def test_a_batch_across_a_float_shard_and_an_integer_shard_stores_every_point(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path, learned: bool
) -> None:
    """An older shard holds `net_bytes_in` as float (an earlier hpcbus), the current one as integer (a
    restarted or second worker created it). A backlog batch spans both: every point is stored, each shard
    keeps the variant of its type, nothing counts as rejected, and it takes three writes, not a loop.
    `learned`: the sink wrote into the float shard before (so it writes floats, and the current shard
    refuses them first); fresh: it writes integers, and the old shard refuses them first. Afterwards the
    sink writes the registry's type (integer, what the current shard holds) at the first try."""
    db = f"db_{uuid.uuid4().hex[:8]}"
    influxdb.create_db(db)
    name = "net_bytes_in"
    tags = "cluster=lab,hostname=old,stype=network,stype-id=eth0,type=node,type-id=network"
    influxdb.write(
        [f"{name},{tags} value=1.0 {int(T1) - 60}", f"{name},{tags} value=2i {int(T1) + WEEK}"], db
    )
    old = agent_messages(tmp_path, "lab")
    backlog = agent_messages(tmp_path, "lab", later=30) + agent_messages(tmp_path, "lab", later=WEEK)
    current = agent_messages(tmp_path, "lab", later=WEEK + 30)
    counts = metric_counts(old)
    writes, types = [], []  # per batch: the metric write requests, `net_bytes_in`'s type after it
    async with influx_sink(nats_server, influxdb, db) as sink:
        for batch in ([old] if learned else []) + [backlog, current]:
            writes.append(await write_batch(sink, batch))
            types.append(sink.types[name])
        counters = (sink.counters.rejected, sink.counters.written_lines)
    runs = len(writes) + 1  # the backlog is two samples
    assert count_points(influxdb, db, name) == runs * counts[name] + 2
    for measurement in INTEGERS:
        extra = 2 if measurement == name else 0
        assert count_points(influxdb, db, measurement) == runs * counts[measurement] + extra, measurement
    assert counters == (0, runs * lines_in(old))
    # the old shard refuses integers: written again as floats; the backlog takes three writes, no loop;
    # then the sink writes the registry's type, the current shard's, at the first try
    assert (writes, types) == (([2, 3, 1], [float, int, int]) if learned else ([3, 1], [int, int]))
    assert field_types(influxdb, db)[name] == {"float", "integer"}


async def test_two_workers_on_one_database_lose_nothing(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path
) -> None:
    """Worker a learned from an old shard that `ib_recv` is float; worker b, started later, creates the next
    shard with `ib_recv` as integer. Worker a's next batch there is refused as float: it writes those lines
    again as integers, stores every point and from then on writes integers."""
    db = f"db_{uuid.uuid4().hex[:8]}"
    influxdb.create_db(db)
    name = "ib_recv"
    tags = "cluster=lab,hostname=old,stype=infiniband,stype-id=mlx5_0:1,type=node,type-id=infiniband"
    influxdb.write(f"{name},{tags} value=1.0 {int(T1) - 60}", db)
    first = agent_messages(tmp_path, "lab")
    counts = metric_counts(first)
    async with influx_sink(nats_server, influxdb, db) as a, influx_sink(nats_server, influxdb, db) as b:
        assert await write_batch(a, first) == 2
        assert await write_batch(b, agent_messages(tmp_path, "lab", later=WEEK)) == 1
        assert field_types(influxdb, db)[name] == {"float", "integer"}
        assert a.types[name] is float
        assert await write_batch(a, agent_messages(tmp_path, "lab", later=WEEK + 30)) == 2
        assert a.types[name] is int
        assert await write_batch(a, agent_messages(tmp_path, "lab", later=WEEK + 60)) == 1
        assert a.counters.rejected == b.counters.rejected == 0
    assert count_points(influxdb, db, name) == 4 * counts[name] + 1
    assert count_points(influxdb, db, "net_bytes_in") == 4 * counts["net_bytes_in"]


async def test_an_unfixable_conflict_is_written_once(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path
) -> None:
    """`mem_used` is a float in the registry, and someone wrote it as integer into the shard: its points are
    refused (hpcbus never writes integers for a measurement that may carry fractions), raised for the runner
    to dead-letter once the batch is written, and, InfluxDB's count of dropped points being exactly its lines, the stored rest is not written again."""
    db = f"db_{uuid.uuid4().hex[:8]}"
    influxdb.create_db(db)
    influxdb.write(f"mem_used,cluster=lab,hostname=old,type=node,type-id=0 value=3i {int(T1) - 60}", db)
    messages = agent_messages(tmp_path, "lab")
    counts = metric_counts(messages)
    async with influx_sink(nats_server, influxdb, db) as sink:
        # raised once the batch is written (the runner then dead-letters the messages refused alone, and
        # counts their points as rejected then, once: `test_refused_points_are_dead_lettered...`)
        with pytest.raises(Partial, match="field type conflict"):
            await write_batch(sink, messages)
        assert len(sink.writer.bodies) == 1  # type: ignore[attr-defined]
        assert (sink.counters.rejected, sink.counters.written_lines) == (
            0,
            lines_in(messages) - counts["mem_used"],
        )
        assert sink.types["mem_used"] is float
    assert count_points(influxdb, db, "mem_used") == 1
    for measurement in ("net_bytes_in", "mem_free", "cpu_user"):
        assert count_points(influxdb, db, measurement) == counts[measurement]


async def test_conflicts_in_two_shards_are_each_counted(
    nats_server: NatsServer, influxdb: InfluxDB, tmp_path: Path
) -> None:
    """InfluxDB 1.x answers a write across shards with one shard's conflict and its count of dropped points
    only: a count that matches the named measurement's lines proves nothing there, the rest is written again
    and the other shard's conflict is found and counted too (never counted as written)."""
    db = f"db_{uuid.uuid4().hex[:8]}"
    influxdb.create_db(db)
    later = int(T1) + WEEK
    influxdb.write(
        [
            f"mem_used,cluster=lab,hostname=old,type=node,type-id=0 value=3i {int(T1)}",
            f"cpu_user,cluster=lab,hostname=old,type=node,type-id=0 value=3i {later}",
        ],
        db,
    )
    subject = agent_messages(tmp_path, "lab")[0][0]
    payload = (
        f"mem_used,hostname=n1,type=node value=1.5 {int(T1) + 1}\n"
        f"cpu_user,hostname=n1,type=node value=2.5 {later + 1}\n"
        f"cpu_load,hostname=n1,type=node value=0.5 {later + 1}\n"
    )
    async with influx_sink(nats_server, influxdb, db) as sink:
        # which shard's conflict InfluxDB names first varies from run to run (its shard writes run in
        # parallel): mem_used first costs 2 writes (the second write lies in one shard), cpu_user first 3 (the
        # second still spans both shards, so cpu_load is written once more); never more, nothing counted twice
        before = len(sink.writer.bodies)  # type: ignore[attr-defined]
        with pytest.raises(Partial, match="field type conflict"):  # one message: counted here, once
            await write_batch(sink, [(subject, payload.encode())])
        assert len(sink.writer.bodies) - before in (2, 3)  # type: ignore[attr-defined]
        assert (sink.counters.rejected, sink.counters.written_lines) == (2, 1)
    assert count_points(influxdb, db, "cpu_load") == 1
    assert count_points(influxdb, db, "mem_used") == count_points(influxdb, db, "cpu_user") == 1
