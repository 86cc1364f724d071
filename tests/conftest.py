"""Fixtures every test module can use: the real services of `tests/services/` (started on first use)."""

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
