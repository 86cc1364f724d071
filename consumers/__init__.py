"""Consumers: what `hpcbus consume <name>` (and `hpcbus deadletter`) run, one folder per command, each with a
README.

They read the bus through a durable JetStream consumer (`consumers.runner`, shared) and write elsewhere
(InfluxDB) or back onto the bus (the Sonar bridge; `consumers.outlet` publishes, logs and dead-letters).
"""
