"""What the gateway counts and says about its traffic: counters per cluster and source (`influx-v1`,
`influx-v2`, `sonar`), the refusals summarised instead of logged one by one (`tally.Tally`), the periodic
summary line and the counters as self-telemetry (`hpcbus_<counter>` lines on each cluster's telemetry
subject)."""

from __future__ import annotations

import logging

from nats.aio.client import Client as NATS

from hpcbus.outlet import Outlet
from hpcbus.producers.gateway.answers import SourceCounters
from hpcbus.producers.gateway.tally import Tally

log = logging.getLogger("hpcbus.gateway")

ITEMS = {"sonar": "envelopes"}
"""What a source counts (`SourceCounters`): lines, but envelopes for Sonar."""


class Stats:
    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.counters: dict[tuple[str, str], SourceCounters] = {}
        self.unauthorized = 0
        self.busy_checks = 0
        """Requests answered 503 because `Authenticator.max_checks` secrets were being checked already."""
        self.refused_logins = Tally(log, "gateway: 401 (credentials refused)")
        self.malformed = Tally(log, "gateway: malformed HTTP request refused")
        self.gone = Tally(log, "gateway: client gone before its answer", level=logging.INFO)
        self.partial = Tally(log, "gateway: request partly or wholly refused (bad lines or envelopes)")
        """Requests answered 400 (or 401/403/413 for Sonar) naming what they carried that was refused: a
        broken client sends such a request every few milliseconds, so an episode, not a line each."""

    def source(self, cluster: str, name: str) -> SourceCounters:
        """The counters of one cluster's source, made on first use."""
        counters = self.counters.get((cluster, name))
        if counters is None:
            counters = self.counters[(cluster, name)] = SourceCounters()
        return counters

    def flush(self) -> None:
        """The summary lines of refusals counted but not yet logged (the report, and the stop)."""
        for tally in (self.refused_logins, self.malformed, self.gone, self.partial):
            tally.flush()

    def summary(self) -> str:
        parts = []
        for (cluster, source), c in sorted(self.counters.items()):
            parts.append(
                f"{cluster} {source}: {c.requests} requests, {c.delivered} {ITEMS.get(source, 'lines')} published, "
                f"{c.rejected} refused, "
                f"{c.refused_unavailable + c.refused_busy + c.refused_full + c.refused_no_durable} answered 503"
                + (f" ({c.refused_full} stream full)" if c.refused_full else "")
                + (f" ({c.refused_no_durable} before any worker's durable)" if c.refused_no_durable else "")
                + (f", {c.refused_timeout} body timeouts" if c.refused_timeout else "")
                + (f", {c.disconnected} clients gone mid-body" if c.disconnected else "")
            )
        if self.unauthorized:
            parts.append(f"{self.unauthorized} unauthorized")
        if self.partial.total:
            parts.append(f"{self.partial.total} requests with refused lines or envelopes")
        if self.malformed.total:
            parts.append(f"{self.malformed.total} malformed requests")
        if self.busy_checks:
            parts.append(f"{self.busy_checks} answered 503 while checking other credentials")
        return "; ".join(parts) or "no requests"

    async def report(self, nc: NATS | None, *, running: bool = True) -> None:
        """The summary line, and the counters as `hpcbus_*` metric lines on each cluster's subject
        (`running` False: the last report, made as the gateway stops)."""
        for counters in self.counters.values():
            counters.running = int(running)
        self.flush()
        log.info("gateway: %s", self.summary())
        if nc is None or not nc.is_connected:
            return
        for (cluster, source), counters in list(self.counters.items()):
            await Outlet(nc, cluster, jetstream=True, prefix=self.prefix).telemetry(
                f"gateway-{source}", counters
            )
