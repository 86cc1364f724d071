"""Consumers: what `hpcbus consume <name>` (and `hpcbus deadletter`) run, one folder per command, each with a
README.

They read the bus through a durable JetStream consumer (`hpcbus.runner`, shared) and write elsewhere
(InfluxDB) or back onto the bus (the Sonar bridge; `hpcbus.outlet` publishes, logs and dead-letters).
"""
