"""Consumers: what `hpcbus consume <name>` (and `hpcbus deadletter`) run, one folder per command, each with a
README.

Each is a sink on the runtime's consumer side (`hpcbus.sinks`, `hpcbus.runner`: the durable JetStream
consumer, the counters, the dead letters) writing elsewhere (InfluxDB) or back onto the bus (the Sonar bridge;
`hpcbus.outlet` publishes, logs and dead-letters).
"""
