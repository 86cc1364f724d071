"""`hpcbus deploy influx-retention` on a real InfluxDB 1.6 whose continuous-query service runs every second:
the policies and queries are created once (a second run changes nothing), and the real continuous query
fills the `5m` policy with the 5-minute means of the raw points (and copies `job_summary`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcbus import cli
from hpcbus.commands.deploy.dashboards.boards import measurements
from tests.consumer_helpers import wait_for
from tests.services import InfluxDB

pytestmark = pytest.mark.services


class CqInfluxDB(InfluxDB):
    """The test InfluxDB with the continuous-query service on, checking every second (the shared fixture
    turns it off). A query with `RESAMPLE EVERY 1s` then runs within about a second of being due."""

    def _write_config(self) -> None:
        super()._write_config()
        text = self.config_path.read_text()
        off = "[continuous_queries]\n  enabled = false\n"
        assert off in text
        on = '[continuous_queries]\n  enabled = true\n  log-enabled = true\n  run-interval = "1s"\n'
        self.config_path.write_text(text.replace(off, on))


@pytest.fixture(scope="module")
def influx(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CqInfluxDB]:
    with CqInfluxDB(tmp_path_factory.mktemp("influx-cq")) as server:
        yield server


def deploy(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    rc = cli.main(["deploy", "influx-retention", *argv])
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err


def policies(influx: InfluxDB, db: str) -> dict[str, tuple[str, bool]]:
    return {
        r["name"]: (r["duration"], r["default"]) for r in influx.points(f'SHOW RETENTION POLICIES ON "{db}"')
    }


def cq_names(influx: InfluxDB, db: str) -> set[str]:
    return {r["name"] for r in influx.points("SHOW CONTINUOUS QUERIES") if r["_measurement"] == db}


def test_policies_and_queries_are_created_once_and_corrected_when_settings_change(
    influx: CqInfluxDB, capsys: pytest.CaptureFixture[str]
) -> None:
    db = "ret_idem"
    base = ["--influx-url", influx.url, "--db", db]
    rc, first, err = deploy(capsys, *base, "--raw-duration", "2d")
    assert rc == 0, err
    assert first[0] == f'CREATE DATABASE "{db}"'
    assert f'ALTER RETENTION POLICY "autogen" ON "{db}" DURATION 2d SHARD DURATION 1d' in first
    assert f'CREATE RETENTION POLICY "5m" ON "{db}" DURATION 365d REPLICATION 1 SHARD DURATION 7d' in first
    assert policies(influx, db) == {"autogen": ("48h0m0s", True), "5m": ("8760h0m0s", False)}
    names = cq_names(influx, db)
    assert len(names) == 2 and all(n.startswith("hpcbus_5m_") for n in names)

    rc, again, _ = deploy(capsys, *base, "--raw-duration", "2d")
    assert (rc, again) == (0, [f'CREATE DATABASE "{db}"'])  # nothing else to do
    assert cq_names(influx, db) == names

    rc, changed, _ = deploy(capsys, *base, "--raw-duration", "2d", "--resample-for", "1h")
    assert rc == 0
    assert sum(s.startswith("DROP CONTINUOUS QUERY") for s in changed) == 2
    assert sum(s.startswith("CREATE CONTINUOUS QUERY") for s in changed) == 2
    now = cq_names(influx, db)
    assert len(now) == 2 and not now & names


def test_the_continuous_query_writes_five_minute_means_of_the_dashboards_measurements(
    influx: CqInfluxDB, capsys: pytest.CaptureFixture[str]
) -> None:
    db = "ret_cq"
    influx.create_db(db)
    bucket = int(time.time()) // 300 * 300 - 300  # the last complete 5-minute bucket: inside RESAMPLE FOR
    lines = []
    for i, (a, b) in enumerate([(1.0, 10), (2.0, 20), (6.0, 30)]):
        t = bucket + 10 + 60 * i
        lines.append(f"cpu_load,cluster=c,hostname=n1,type=node,type-id=0 value={a} {t}")
        lines.append(f"cpu_load,cluster=c,hostname=n2,type=node,type-id=0 value={a * 10} {t}")
        lines.append(
            f"job_processes,cluster=c,hostname=n1,job=7,stype=job,stype-id=7,type=node,type-id=0,user=u value={b}i {t}"
        )
        lines.append(f'sample,cluster=c,function=skeleton,hostname=n1 event="{{}}" {t}')  # not downsampled
    lines.append(
        f'job_summary,account=a,cluster=c,job=7,partition=p,scheduler=slurm,user=u state="COMPLETED",'
        f'cpu_eff=42.5,cores=4i,flags="cpu_underused",flag_cpu_underused=true {bucket + 100}'
    )
    influx.write(lines, db)
    assert "cpu_load" in measurements() and "job_processes" in measurements()

    rc, _, err = deploy(
        capsys, "--influx-url", influx.url, "--db", db, "--resample-every", "1s", "--resample-for", "10m"
    )
    assert rc == 0, err

    def downsampled() -> list[dict[str, object]]:
        rows = influx.points('SELECT * FROM "5m"."cpu_load" GROUP BY "hostname"', db, epoch="s")
        return rows if len(rows) == 2 else []

    rows = wait_for(downsampled, 90, "the continuous query's 5-minute means in the 5m policy")
    assert {r["hostname"]: (r["time"], r["value"]) for r in rows} == {
        "n1": (bucket, 3.0),
        "n2": (bucket, 30.0),
    }
    (summary,) = wait_for(
        lambda: influx.points('SELECT * FROM "5m"."job_summary"', db, epoch="s"), 30, "the job_summary copy"
    )
    assert (summary["time"], summary["job"], summary["account"]) == (bucket, "7", "a")
    assert (summary["state"], summary["cpu_eff"], summary["cores"], summary["flag_cpu_underused"]) == (
        "COMPLETED",
        42.5,
        4,
        True,
    )
    assert "gpu_util" not in summary  # absent stays absent (no null written)
    # the per-job series stay raw (a year of them is the schema's largest cost: docs/scaling.md)
    assert influx.points('SELECT count(*) FROM "5m"."job_processes"', db) == []
    assert influx.points('SELECT count(*) FROM "5m"."cpu_load"', db) != []
    assert influx.points('SHOW MEASUREMENTS ON "ret_cq" WITH MEASUREMENT =~ /^sample$/', db) != []
    assert influx.points('SELECT count(*) FROM "5m"."sample"', db) == []


def test_bad_settings_exit_2_and_an_unreachable_influxdb_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    rc, out, err = deploy(capsys, "--raw-duration", "30days")
    assert (rc, out) == (2, [])
    assert "raw_duration" in err and "30days" in err and "Traceback" not in err
    rc, _, err = deploy(capsys, "--influx-api", "v2")
    assert rc == 2 and "InfluxDB 1.x" in err
    config = tmp_path / "hpcbus.toml"
    config.write_text('[retention]\nresample_for = "1m"\n')
    rc, _, err = deploy(capsys, "--config", str(config))
    assert rc == 2 and "resample_for" in err
    rc, out, err = deploy(capsys, "--influx-url", "http://127.0.0.1:9")
    assert rc == 1 and "127.0.0.1:9" in err and "Traceback" not in err
