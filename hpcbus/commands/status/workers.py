"""Workers and the gateway from their self-telemetry: every `stats_seconds` (60 by default) each one
publishes its counters as `hpcbus_<counter>` lines (`stype=worker`, `stype-id=<its name>`, `hostname`) on
`<cluster>.telemetry`, which the telemetry stream keeps. The last two reports of a process give its rates and
its report interval; one that has not reported for three intervals is gone, and one whose last report says
`running 0` (the report a process makes as it stops) stopped. A gauge (`kind=gauge`: `pending`, `open_jobs`,
...) is shown as it is, never as a rate; a counter smaller than in the report before was reset by a restart,
and counts from 0 again (as Prometheus' `rate` reads a reset), so no rate is ever negative. Error lines on
`<cluster>.log.>` (`loglevel=error`) name the host they came from: the newest is a worker's last error."""

from __future__ import annotations

from collections.abc import Iterable

from hpcbus.commands.status.facts import Worker
from hpcbus.schemas.lineprotocol import Line

DEFAULT_INTERVAL = 60.0
"""The workers' default `stats_seconds`, assumed for a process seen reporting once."""
MISSED_REPORTS = 3.0
LEGACY_GAUGES = frozenset({"pending", "pending_summaries", "open_jobs", "open_samples", "state_bytes"})
"""Gauges of reports made before their lines carried `kind=gauge` (workers not yet upgraded)."""
BACKLOG_COUNTERS = ("pending", "outbox_messages")
"""A worker's backlog: `pending` (the standard counter of `hpcbus.counters`), a producer's `outbox_messages`."""


class Reports:
    """(host, name) -> report time -> counters."""

    def __init__(self) -> None:
        self.by_process: dict[tuple[str, str], dict[float, dict[str, float]]] = {}
        self.gauges: dict[tuple[str, str], set[str]] = {}
        """(host, name) -> the counters its lines mark as gauges."""

    def add(self, lines: Iterable[Line]) -> None:
        for line in lines:
            if not line.measurement.startswith("hpcbus_"):
                continue
            value = line.fields.get("value")
            if not isinstance(value, int | float) or isinstance(value, bool):
                continue
            key = (line.tags.get("hostname", ""), line.tags.get("stype-id", line.tags.get("type-id", "")))
            counters = self.by_process.setdefault(key, {}).setdefault(float(line.time), {})
            name = line.measurement.removeprefix("hpcbus_")
            counters[name] = float(value)
            if line.tags.get("kind") == "gauge":
                self.gauges.setdefault(key, set()).add(name)

    def workers(self, now: float, errors: dict[str, str], slack: float = 0.0) -> list[Worker]:
        out = []
        for (host, name), reports in sorted(self.by_process.items()):
            times = sorted(reports)
            last = times[-1]
            rates: dict[str, float] = {}
            interval = DEFAULT_INTERVAL
            gauges = self.gauges.get((host, name), set()) | LEGACY_GAUGES
            if len(times) >= 2:
                before = times[-2]
                interval = last - before
                for key, value in reports[last].items():
                    if key in reports[before] and key not in gauges:
                        previous = reports[before][key]
                        increase = value if value < previous else value - previous  # a reset: from 0
                        rates[key] = round(increase / interval, 3)
            counters = reports[last]
            stopped = counters.get("running") == 0
            backlog = next((counters[k] for k in BACKLOG_COUNTERS if k in counters), None)
            out.append(
                Worker(
                    host=host,
                    name=name,
                    last_report=last,
                    interval_s=interval,
                    alive=not stopped and now - last <= MISSED_REPORTS * interval + slack,
                    stopped=stopped,
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
