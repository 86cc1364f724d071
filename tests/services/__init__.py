"""Real services for tests and benchmarks, re-exported here so `from tests.services import NatsServer` is
all a test or `bench/` module needs. nats-server and the InfluxDB process come from `hpcbus.local` (the
package `hpcbus run` uses); InfluxDB's query helpers, VictoriaMetrics, Slurm (with its munge and MariaDB)
and `PeakRss` live here because only tests and benchmarks use them. No pytest here: `bench/` imports this.
`tests.services.fixtures` holds the pytest fixtures that `tests/conftest.py` exposes (one instance of each
service per session, started only when a test asks)."""

from hpcbus.local.daemon import LOOPBACK, ServiceError, free_port, free_ports, wait_until
from hpcbus.local.nats_server import NatsServer
from tests.services.influxdb import InfluxDB
from tests.services.rss import PeakRss
from tests.services.slurm import TERMINAL_STATES, InfluxProfile, SlurmCluster
from tests.services.victoria import VictoriaMetrics

__all__ = [
    "LOOPBACK",
    "TERMINAL_STATES",
    "InfluxDB",
    "InfluxProfile",
    "NatsServer",
    "PeakRss",
    "ServiceError",
    "SlurmCluster",
    "VictoriaMetrics",
    "free_port",
    "free_ports",
    "wait_until",
]
