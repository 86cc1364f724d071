"""Real services for tests, benchmarks and `hpcbus run`: the process management is `hpcbus.localservices`
(plain Python, no pytest), re-exported here; `tests.services.fixtures` holds the pytest fixtures that
`tests/conftest.py` exposes (one instance of each service per session, started only when a test asks)."""

from hpcbus.localservices import (
    TERMINAL_STATES,
    InfluxDB,
    InfluxProfile,
    NatsServer,
    ServiceError,
    SlurmCluster,
    VictoriaMetrics,
    free_port,
    free_ports,
    wait_until,
)

__all__ = [
    "TERMINAL_STATES",
    "InfluxDB",
    "InfluxProfile",
    "NatsServer",
    "ServiceError",
    "SlurmCluster",
    "VictoriaMetrics",
    "free_port",
    "free_ports",
    "wait_until",
]
