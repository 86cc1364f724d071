"""Consumers: everything of hpcbus that touches NATS, InfluxDB, /proc or subprocesses."""
