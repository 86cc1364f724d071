"""Logging for humans: one line per event, UTC timestamps, no tracebacks for expected failures.

A process started by `hpcbus run` shares its terminal with the others; `HPCBUS_LOG_TAG` (set by `run` for
each child) names it in every line, so four `SIGINT: stopping` lines or two copies of a warning say which
worker each came from.
"""

from __future__ import annotations

import logging
import os
import sys
import time


class _OneLine(logging.Formatter):
    converter = staticmethod(time.gmtime)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text.replace("\n", " | ")


class _NoTlsEofNotice(logging.Filter):
    """Drops asyncio's "returning true from eof_received() has no effect when using ssl". nats-py upgrades
    a plain connection to TLS after the server's INFO (`start_tls`), keeping the stream protocol that decided
    at connect time that it was not over TLS, so asyncio says this whenever a server closes a TLS connection
    (nats-io/nats.py#574). Nothing is wrong or lost; left in, it is a WARNING per connection in every
    command's output and every unit's journal on a site with `verify: true`, one that teaches to ignore
    warnings."""

    MESSAGE = "returning true from eof_received() has no effect when using ssl"

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != self.MESSAGE


_TLS_EOF = _NoTlsEofNotice()

LOG_TAG = "HPCBUS_LOG_TAG"
"""Environment variable: a name put in front of every log line of this process (`hpcbus run`'s children)."""


def setup_logging(verbosity: int = 0) -> None:
    level = logging.WARNING - 10 * min(verbosity + 1, 2)  # default INFO, -v DEBUG
    handler = logging.StreamHandler(sys.stderr)
    tag = os.environ.get(LOG_TAG, "").strip()
    who = f"[{tag}] " if tag else ""
    handler.setFormatter(
        _OneLine(f"%(asctime)sZ %(levelname)s {who}%(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("nats", "asyncio", "urllib3", "influxdb_client"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
    logging.getLogger("asyncio").addFilter(_TLS_EOF)  # the same object: added once however often called
