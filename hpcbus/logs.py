"""Logging for humans: one line per event, UTC timestamps, no tracebacks for expected failures."""

from __future__ import annotations

import logging
import sys
import time


class _OneLine(logging.Formatter):
    converter = staticmethod(time.gmtime)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text.replace("\n", " | ")


def setup_logging(verbosity: int = 0) -> None:
    level = logging.WARNING - 10 * min(verbosity + 1, 2)  # default INFO, -v DEBUG
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_OneLine("%(asctime)sZ %(levelname)s %(name)s: %(message)s", "%Y-%m-%dT%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("nats", "asyncio", "urllib3", "influxdb_client"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
