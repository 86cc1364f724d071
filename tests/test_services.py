"""The real services of tests/services/ do what the other tests rely on: one check per service, plus the
properties tests lean on (JetStream survives a restart, InfluxDB data survives stop/start, max_payload
applies, Slurm profiles reach InfluxDB)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable

import nats
import pytest

from tests.services import (
    InfluxDB,
    InfluxProfile,
    NatsServer,
    SlurmCluster,
    VictoriaMetrics,
    wait_until,
)
from tests.services.fixtures import SLURM_PROFILE_DB

pytestmark = pytest.mark.services


def _unique(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


async def test_nats_jetstream_publish_and_stream_info(nats_server: NatsServer) -> None:
    stream = _unique("SVC")
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name=stream, subjects=[f"{stream}.>"])
        ack = await js.publish(f"{stream}.x", b"hello")
        info = await js.stream_info(stream)
    finally:
        await nc.close()
    assert (ack.stream, ack.seq) == (stream, 1)
    assert info.state.messages == 1


async def test_nats_restart_keeps_jetstream_store(nats_factory: Callable[..., NatsServer]) -> None:
    server = nats_factory()
    port = server.port
    nc = await nats.connect(server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(name="KEEP", subjects=["keep.>"])
        for i in range(3):
            await js.publish("keep.x", str(i).encode())
    finally:
        await nc.close()
    server.restart()
    assert server.port == port
    nc = await nats.connect(server.url)
    try:
        info = await nc.jetstream().stream_info("KEEP")
    finally:
        await nc.close()
    assert info.state.messages == 3


async def test_nats_max_payload(nats_factory: Callable[..., NatsServer]) -> None:
    server = nats_factory(max_payload=4096)
    nc = await nats.connect(server.url)
    try:
        assert nc.max_payload == 4096
    finally:
        await nc.close()


def test_influxdb_write_then_query(influxdb: InfluxDB) -> None:
    db = _unique("svc")
    influxdb.create_db(db)
    influxdb.write(["cpu_load,hostname=n1,type=node value=2.5 1700000000"], db, precision="s")
    rows = influxdb.points('SELECT "value" FROM "cpu_load" WHERE "hostname" = \'n1\'', db, epoch="s")
    assert rows == [{"_measurement": "cpu_load", "time": 1700000000, "value": 2.5}]


def test_influxdb_stop_start_keeps_data(influxdb: InfluxDB) -> None:
    db = _unique("svc")
    influxdb.create_db(db)
    influxdb.write("m v=1i 1700000000", db)
    influxdb.stop()
    assert not influxdb.ping()
    influxdb.start()
    rows = influxdb.points("SELECT v FROM m", db, epoch="s")
    assert rows == [{"_measurement": "m", "time": 1700000000, "v": 1}]


def test_victoriametrics_v2_write_then_export_and_query(victoriametrics: VictoriaMetrics) -> None:
    host = _unique("n")
    now = int(time.time())
    victoriametrics.write(f"cpu_load,hostname={host},type=node value=2.5,other=7i {now}", precision="s")
    series = victoriametrics.wait_for_series(f'{{hostname="{host}"}}', until=lambda s: len(s) == 2)
    by_name = {s["metric"]["__name__"]: s for s in series}
    assert set(by_name) == {"cpu_load_value", "cpu_load_other"}
    assert by_name["cpu_load_value"]["values"] == [2.5]
    assert by_name["cpu_load_value"]["timestamps"] == [now * 1000]
    assert by_name["cpu_load_other"]["values"] == [7]

    def instant() -> list[dict[str, object]]:
        result: list[dict[str, object]] = victoriametrics.query(f'cpu_load_value{{hostname="{host}"}}')[
            "data"
        ]["result"]
        return result

    assert wait_until("instant query", instant, 10)[0]["value"][1] == "2.5"


def test_slurm_job_with_steps_in_sacct(slurm: SlurmCluster) -> None:
    job = slurm.sbatch(wrap="srun sleep 1")
    assert slurm.wait_job(job, timeout=60) == "COMPLETED"
    rows = slurm.sacct("-j", str(job), fields=("JobID", "JobName", "State", "ExitCode"))
    steps = {row["JobID"]: (row["State"], row["ExitCode"]) for row in rows}
    assert steps == {
        f"{job}": ("COMPLETED", "0:0"),
        f"{job}.batch": ("COMPLETED", "0:0"),
        f"{job}.0": ("COMPLETED", "0:0"),
    }


def test_slurm_profile_reaches_influxdb(
    slurm: SlurmCluster, influxdb: InfluxDB, slurm_influx_profile: InfluxProfile
) -> None:
    assert slurm_influx_profile.database == SLURM_PROFILE_DB
    # The plugin samples every `frequency` s; a step shorter than one interval sends nothing.
    job = slurm.sbatch(wrap="srun sleep 3")
    assert slurm.wait_job(job, timeout=60) == "COMPLETED"

    def rss_rows() -> list[dict[str, object]]:
        return influxdb.points(f'SELECT * FROM "RSS" WHERE "job" = \'{job}\'', SLURM_PROFILE_DB)

    rows = wait_until("profile rows in InfluxDB", rss_rows, 15, interval=0.2)
    assert {row["step"] for row in rows} >= {"0"}
    assert all(row["host"] == slurm.node_name for row in rows)
