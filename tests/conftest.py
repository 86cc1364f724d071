"""Fixtures every test module can use: the real services of `tests/services/` (started on first use), a
cluster name of its own per test, and the worker processes a test started (killed at teardown)."""

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
