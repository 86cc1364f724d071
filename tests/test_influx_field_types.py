"""The node agent's integer counters reach a real InfluxDB 1.6 as integer fields, through a real nats-server
and the real `consume influx` worker; and a site whose InfluxDB already holds them as floats loses nothing.

What goes on the bus is what the node agent publishes every interval (`Pipeline.sample_messages` for the
`hpc` fixture node, with a GPU), published with JetStream as the agent does.
"""

from __future__ import annotations

import shutil
import signal
import uuid
from collections import Counter
from pathlib import Path

import pytest

from hpcbus.producers.node import NodeCollector, NodeCollectorConfig
from hpcbus.producers.node.pipeline import AgentConfig, Pipeline
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
