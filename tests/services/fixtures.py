"""pytest fixtures for the real services, thin wrappers over the classes `tests.services` exports.

Each service starts at most once per session, and only when a test asks for it (session-scoped
`*_session` fixtures; Slurm costs a few seconds, the others well under one). The function-scoped fixtures
without the suffix hand the same instance to each test after `ensure_running()`, so a test that stops a
service (to test reconnects) does not break the tests after it. Every process is stopped at session end,
also when tests fail, and dies with pytest if pytest itself is killed (see `hpcbus.local.daemon`).

How long each service took to start is printed at the end of the run ("service start-up").
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from tests.services import LOOPBACK, InfluxDB, InfluxProfile, NatsServer, SlurmCluster, VictoriaMetrics

STARTUP_TIMES = pytest.StashKey[dict[str, float]]()
"""config.stash key: service name -> seconds its session instance took to start."""

SLURM_PROFILE_DB = "slurm_profile"
"""InfluxDB database that acct_gather_profile/influxdb writes to once `slurm_influx_profile` is used."""


def _record(config: pytest.Config, name: str, seconds: float | None) -> None:
    if seconds is not None:
        config.stash.setdefault(STARTUP_TIMES, {})[name] = seconds


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Show start-up times, so a slow service start is visible in CI logs without a benchmark."""
    times = config.stash.get(STARTUP_TIMES, {})
    if times:
        terminalreporter.write_sep("-", "service start-up")
        for name, seconds in times.items():
            terminalreporter.write_line(f"{name}: {seconds:.2f} s")


# ---- NATS


@pytest.fixture(scope="session")
def nats_server_session(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[NatsServer]:
    with NatsServer(tmp_path_factory.mktemp("nats")) as server:
        _record(pytestconfig, "nats-server", server.start_seconds)
        yield server


@pytest.fixture
def nats_server(nats_server_session: NatsServer) -> NatsServer:
    """The session's nats-server with JetStream (`.url`, `.port`, `.store_dir`, `.restart()`), running.
    Streams from earlier tests may exist: name yours uniquely."""
    return nats_server_session.ensure_running()


@pytest.fixture
def nats_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., NatsServer]]:
    """`make(max_payload=None) -> NatsServer`: extra, started nats-servers of the test's own (a fresh store,
    other limits); all stopped when the test ends. Use it to stop/restart a server without disturbing others."""
    with contextlib.ExitStack() as stack:

        def make(*, max_payload: int | None = None) -> NatsServer:
            server = NatsServer(tmp_path_factory.mktemp("nats-extra"), max_payload=max_payload)
            stack.callback(server.close)
            return server.start()

        yield make


# ---- InfluxDB


@pytest.fixture(scope="session")
def influxdb_session(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[InfluxDB]:
    with InfluxDB(tmp_path_factory.mktemp("influxdb")) as influx:
        _record(pytestconfig, "influxdb", influx.start_seconds)
        yield influx


@pytest.fixture
def influxdb(influxdb_session: InfluxDB) -> InfluxDB:
    """The session's InfluxDB 1.x (`.url`, `create_db`, `write`, `query`, `points`, `stop`/`start`), running.
    Databases from earlier tests may exist: name yours uniquely."""
    return influxdb_session.ensure_running()


# ---- VictoriaMetrics


@pytest.fixture(scope="session")
def victoriametrics_session(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[VictoriaMetrics]:
    with VictoriaMetrics(tmp_path_factory.mktemp("victoriametrics")) as vm:
        _record(pytestconfig, "victoria-metrics", vm.start_seconds)
        yield vm


@pytest.fixture
def victoriametrics(victoriametrics_session: VictoriaMetrics) -> VictoriaMetrics:
    """The session's VictoriaMetrics (`.url`, `.influx_write_url`, `write`, `export`, `wait_for_series`,
    `query`), running. Series from earlier tests may exist: use unique measurement or tag values."""
    return victoriametrics_session.ensure_running()


# ---- Slurm


@pytest.fixture(scope="session")
def slurm_session(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[SlurmCluster]:
    with SlurmCluster(tmp_path_factory.mktemp("slurm")) as cluster:
        _record(pytestconfig, "slurm (munge, mariadb, slurmdbd, slurmctld, slurmd)", cluster.start_seconds)
        yield cluster


@pytest.fixture
def slurm(slurm_session: SlurmCluster) -> SlurmCluster:
    """The session's single-node Slurm (`.slurm_conf`, `.env()`, `sbatch`, `wait_job`, `sacct`, `run`),
    running. sacct lists the jobs of earlier tests too: filter by the job ids you submitted."""
    return slurm_session.ensure_running()


@pytest.fixture(scope="session")
def slurm_influx_profile_session(slurm_session: SlurmCluster, influxdb_session: InfluxDB) -> InfluxProfile:
    influxdb_session.ensure_running().create_db(SLURM_PROFILE_DB)
    profile = InfluxProfile(host=f"{LOOPBACK}:{influxdb_session.port}", database=SLURM_PROFILE_DB)
    slurm_session.ensure_running().set_profile(profile)
    return profile


@pytest.fixture
def slurm_influx_profile(
    slurm_influx_profile_session: InfluxProfile, slurm: SlurmCluster, influxdb: InfluxDB
) -> InfluxProfile:
    """Turns on acct_gather_profile/influxdb in the session's Slurm, writing every job's task samples to the
    session's InfluxDB database `slurm_profile` (tags job, step, task, host; see FACTS.md). Switching it on
    restarts slurmctld and slurmd (~3 s) once; it then stays on for the rest of the session."""
    return slurm_influx_profile_session
