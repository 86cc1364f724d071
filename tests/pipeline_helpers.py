"""What the end-to-end tests of the job view share (`hpcbus report`, the Grafana dashboards): the session's
real services, running, and the workers of the real pipeline with the arguments those tests run them with.

Each test module builds its own pipeline from these (its own cluster and database), so what one module's
jobs or series are cannot leak into the assertions of the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.consumer_helpers import Worker
from tests.services import InfluxDB, NatsServer, SlurmCluster

ROOT_JOBS = "[node.jobs]\nmin_uid = 0\n"
"""Node producer config keeping root's processes: the test Slurm's jobs and the tests' process groups run
as root, which the producer leaves out by default."""


@dataclass
class Services:
    nats: NatsServer
    influx: InfluxDB
    slurm: SlurmCluster
    tmp: Path
    """A temporary folder of the module, for configs, state files and worker logs."""


@pytest.fixture(scope="module")
def pipeline_services(
    nats_server_session: NatsServer,
    influxdb_session: InfluxDB,
    slurm_session: SlurmCluster,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Services:
    """NATS, InfluxDB and the test Slurm running (started again if an earlier test stopped one). Import it
    into a test module to use it there."""
    return Services(
        nats_server_session.ensure_running(),
        influxdb_session.ensure_running(),
        slurm_session.ensure_running(),
        tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1]),
    )


def influx_sink(bus: list[str], influx: InfluxDB, db: str, log: Path, *extra: str) -> Worker:
    """`consume influx` of the bus into `db` (not started)."""
    return Worker(["consume", "influx", *bus, "--influx-url", influx.url, "--db", db, *extra], log)


def jobs_worker(bus: list[str], influx: InfluxDB, db: str, tmp: Path, *extra: str) -> Worker:
    """`consume jobs` writing its `job_summary` points into `db`, closing a job 1 s after its end; state
    `tmp/jobs.state`, log `tmp/jobs.log` (not started)."""
    args = ["consume", "jobs", *bus, "--influx-url", influx.url, "--db", db, "--grace", "1"]
    return Worker([*args, "--state-file", str(tmp / "jobs.state"), *extra], tmp / "jobs.log")


def node_producer(
    bus: list[str], tmp: Path, log: Path, *extra: str, env: dict[str, str] | None = None
) -> Worker:
    """`produce node` on this host every second, keeping root's processes (config `tmp/node.toml`; not
    started)."""
    config = tmp / "node.toml"
    config.write_text(ROOT_JOBS)
    return Worker(["produce", "node", *bus, "--config", str(config), "--interval", "1", *extra], log, env)


def slurm_producer(bus: list[str], slurm: SlurmCluster, tmp: Path, *extra: str) -> Worker:
    """`produce slurm` on the test Slurm every second; state `tmp/slurm.state`, log `tmp/slurm.log` (not
    started)."""
    args = ["produce", "slurm", *bus, "--interval", "1", "--state-file", str(tmp / "slurm.state"), *extra]
    return Worker(args, tmp / "slurm.log", env=slurm.env())
