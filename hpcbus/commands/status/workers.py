"""Workers and the gateway from their self-telemetry: every `stats_seconds` (60 by default) each one
publishes its counters as `hpcbus_<counter>` lines (`stype=worker`, `stype-id=<its name>`, `hostname`) on
`<cluster>.telemetry`, which the telemetry stream keeps. The last two reports of a process give its rates and
its report interval; one that has not reported for three intervals is gone. Error lines on
`<cluster>.log.>` (`loglevel=error`) name the host they came from: the newest is a worker's last error."""

from __future__ import annotations

from collections.abc import Iterable

from hpcbus.commands.status.facts import Worker
from hpcbus.schemas.lineprotocol import Line

DEFAULT_INTERVAL = 60.0
"""The workers' default `stats_seconds`, assumed for a process seen reporting once."""
MISSED_REPORTS = 3.0
BACKLOG_COUNTERS = ("pending", "outbox_messages")
"""A worker's backlog: `pending` (the standard counter of `hpcbus.counters`), a producer's `outbox_messages`."""


class Reports:
    """(host, name) -> report time -> counters."""

    def __init__(self) -> None:
        self.by_process: dict[tuple[str, str], dict[float, dict[str, float]]] = {}

    def add(self, lines: Iterable[Line]) -> None:
        for line in lines:
            if not line.measurement.startswith("hpcbus_"):
                continue
            value = line.fields.get("value")
            if not isinstance(value, int | float) or isinstance(value, bool):
                continue
            key = (line.tags.get("hostname", ""), line.tags.get("stype-id", line.tags.get("type-id", "")))
            counters = self.by_process.setdefault(key, {}).setdefault(float(line.time), {})
            counters[line.measurement.removeprefix("hpcbus_")] = float(value)

    def workers(self, now: float, errors: dict[str, str], slack: float = 0.0) -> list[Worker]:
        out = []
        for (host, name), reports in sorted(self.by_process.items()):
            times = sorted(reports)
            last = times[-1]
            rates: dict[str, float] = {}
            interval = DEFAULT_INTERVAL
            if len(times) >= 2:
                before = times[-2]
                interval = last - before
                for key, value in reports[last].items():
                    if key in reports[before] and not key.startswith("pending"):
                        rates[key] = round((value - reports[before][key]) / interval, 3)
            counters = reports[last]
            backlog = next((counters[k] for k in BACKLOG_COUNTERS if k in counters), None)
            out.append(
                Worker(
                    host=host,
                    name=name,
                    last_report=last,
                    interval_s=interval,
                    alive=now - last <= MISSED_REPORTS * interval + slack,
                    counters=counters,
                    rates=rates,
                    backlog=backlog,
                    last_error=errors.get(host, ""),
                )
            )
        return out


def error_text(line: Line) -> str | None:
    """The text of an error line on `<cluster>.log.>`, None for other levels."""
    level = line.tags.get("loglevel", "")
    if level not in ("error", "critical", "fatal"):
        return None
    text = line.fields.get("log")
    return str(text) if text is not None else None
