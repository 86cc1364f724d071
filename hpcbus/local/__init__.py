"""The private services `hpcbus run` starts when no existing ones are given: nats-server with JetStream
(`nats_server`) and InfluxDB 1.x (`influxdb`), on top of the process management in `daemon`.

Nothing here starts anything else: the Slurm, MariaDB, munge and VictoriaMetrics instances the tests need
live in `tests/services/`, which builds on `daemon` too.
"""

from hpcbus.local.daemon import ServiceError
from hpcbus.local.influxdb import InfluxDB
from hpcbus.local.nats_server import NatsServer, nats_server_binary

__all__ = ["InfluxDB", "NatsServer", "ServiceError", "nats_server_binary"]
