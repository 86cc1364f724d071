"""Fixtures every test module can use: the real services of `tests/services/` (started on first use), a
cluster name of its own per test, and the worker processes a test started (killed at teardown)."""

import fnmatch
import logging
import uuid
from collections.abc import Iterator

import pytest

from tests.consumer_helpers import Process
from tests.services.fixtures import (
    influxdb,
    influxdb_session,
    nats_factory,
    nats_server,
    nats_server_session,
    pytest_terminal_summary,
    slurm,
    slurm_influx_profile,
    slurm_influx_profile_session,
    slurm_session,
    victoriametrics,
    victoriametrics_session,
)

__all__ = [
    "influxdb",
    "influxdb_session",
    "nats_factory",
    "nats_server",
    "nats_server_session",
    "pytest_terminal_summary",
    "slurm",
    "slurm_influx_profile",
    "slurm_influx_profile_session",
    "slurm_session",
    "victoriametrics",
    "victoriametrics_session",
]


@pytest.fixture(autouse=True)
def _root_logging() -> Iterator[None]:
    """A test that runs `cli.main` in-process sets up logging on the stderr pytest captures for that test only:
    the root logger's handlers and level are put back after it, so a later test never logs into a closed file."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def cluster() -> str:
    """A cluster of the test's own (so its own stream and durables), dotted like fox.educloud.no."""
    return f"t{uuid.uuid4().hex[:8]}.example.org"


@pytest.fixture
def workers() -> Iterator[list[Process]]:
    """Processes appended here are killed at teardown if still running."""
    started: list[Process] = []
    yield started
    for w in started:
        w.stop()


SERVICE_FIXTURES = frozenset(name for name in __all__ if name != "pytest_terminal_summary")
"""The fixtures that start a real service (nats-server, InfluxDB, VictoriaMetrics, Slurm)."""


BOTH_PATHS = (
    "test_lineprotocol*.py",
    "test_names.py",
    "test_noderange.py",
    "test_ocs_accounting.py",
    "test_ocs_fast.py",
    "test_ocs_typed.py",
    "test_ocs_producer.py",
    "test_slurm_sacct.py",
    "test_slurm_values.py",
    "test_slurm_producer.py",
    "test_sonar_*.py",
    "test_translate_*.py",
    "test_consume_influx.py",
    "test_influx_*.py",
    "test_consume_sonar*.py",
    "test_ingest.py",
    "test_gateway.py",
    "test_gateway_envelopes.py",
)
"""The codec and sink test modules, which `make test` runs a second time with `HPCBUS_PURE=1` (marker
`both_paths`): every hot path has a compiled and a pure path (`hpcbus.schemas.native`), and both must pass
them; a worker a test starts inherits the variable, so the sinks run on the pure path too. The
`test_compiled_*` modules compare the two paths in one process instead."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that uses a real service carries the `services` marker (so `-m "not services"` runs the rest
    alone, in seconds): checked at collection, so a test added without it stops the run at once. The tests of
    `BOTH_PATHS` get the `both_paths` marker."""
    for item in items:
        if any(fnmatch.fnmatch(item.path.name, pattern) for pattern in BOTH_PATHS):
            item.add_marker(pytest.mark.both_paths)
    unmarked = [
        item.nodeid
        for item in items
        if SERVICE_FIXTURES & _fixtures(item) and item.get_closest_marker("services") is None
    ]
    if unmarked:
        raise pytest.UsageError(
            f"{len(unmarked)} tests use a service fixture without @pytest.mark.services: {', '.join(unmarked)}"
        )


def _fixtures(item: pytest.Item) -> set[str]:
    """The fixtures a test uses (a parametrized argument of a fixture's name is no fixture)."""
    callspec = getattr(item, "callspec", None)
    return set(getattr(item, "fixturenames", ())) - set(callspec.params if callspec else ())
