"""The `hpcbus` command and the runtime its subcommands share (settings, NATS connection, logging)."""

__version__ = "0.1.0"
