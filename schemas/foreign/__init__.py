"""What other producers send over HTTP, brought into the bus' shape (pure: no I/O).

`influx` reads InfluxDB line protocol as any InfluxDB client writes it (Slurm's `acct_gather_profile/influxdb`,
Telegraf, cc-metric-collector, influxdb-client, a curl) with the request's precision, and turns it into
ClusterCockpit lines; `sonar` checks Sonar envelopes POSTed by Sonar's HTTP sink for the cluster the request
was authenticated for. `hpcbus gateway` (producers/gateway/) is their user; docs/gateway.md the mapping.
"""

from hpcbus.schemas.foreign.influx import PRECISIONS, Normalised, normalise, slurm_measurement
from hpcbus.schemas.foreign.sonar import TOPIC_KINDS, Envelopes, read_envelopes, topic_kind

__all__ = [
    "PRECISIONS",
    "TOPIC_KINDS",
    "Envelopes",
    "Normalised",
    "normalise",
    "read_envelopes",
    "slurm_measurement",
    "topic_kind",
]
