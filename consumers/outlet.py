"""What every consumer worker publishes besides its output: the log subject, the dead-letter stream,
self-telemetry, and the origin mark; plus publishing with retries.

Why a mark: with both directions running, an envelope translated to lines would be reassembled into an
envelope, which would be translated to lines again, forever. Everything this worker publishes carries the
header `Hpcbus-Origin: translated` (self-telemetry: `telemetry`), JetStream stores headers with the message,
and both directions acknowledge and skip marked input without translating it. A header rather than an LP tag
because a tag would change the lines (series keys in InfluxDB and cc-metric-store, message ids) and cannot be
put on Sonar JSON without changing the envelope.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from hpcbus.bus import deadletter_subject
from schemas import subjects
from schemas.lineprotocol import Line, format_line, format_lines, metric
from schemas.problems import Problem

log = logging.getLogger("hpcbus.outlet")

ORIGIN_HEADER = "Hpcbus-Origin"
TRANSLATED = "translated"
"""Header value on everything the translator publishes (envelopes and lines)."""
TELEMETRY = "telemetry"
"""Header value on the worker's own `hpcbus_*` metric lines."""
SKIPPED_ORIGINS = frozenset({TRANSLATED, TELEMETRY})

MAX_LOGGED_PROBLEMS = 20
"""Problems per message or envelope sent to the log subject (all of them go into the dead-letter header)."""


def own_output(msg: Msg) -> bool:
    """True when `msg` was published by a translator (this one or another hpcbus worker): never re-translated."""
    headers = msg.headers
    return headers is not None and headers.get(ORIGIN_HEADER, "") in SKIPPED_ORIGINS


class PublishFailed(Exception):
    """A publish did not get through in the time allowed; the caller keeps its input unacknowledged."""


class Outlet:
    """Publishing for one cluster: JetStream (waits for the stream's PubAck) or core NATS (`core` mode).

    Each method reports failure instead of raising, except `publish`, whose callers must keep their input
    unacknowledged when it fails.
    """

    def __init__(self, nc: NATS, cluster: str, *, jetstream: bool, timeout: float = 5.0) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.cluster = cluster
        self.jetstream = jetstream
        self.timeout = timeout
        self.host = socket.gethostname()
        self._last_error = ""

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> bool:
        """Publish once; True when JetStream reports a duplicate (its `Nats-Msg-Id` was seen in the window)."""
        if not self.jetstream:
            await self.nc.publish(subject, payload, headers=headers)
            return False
        ack = await self.js.publish(subject, payload, timeout=self.timeout, headers=headers)
        return bool(ack.duplicate)

    async def publish_retrying(
        self,
        subject: str,
        payload: bytes,
        headers: dict[str, str],
        stopping: asyncio.Event,
        *,
        deadline: float,
        on_retry: Callable[[], Awaitable[None]] | None = None,
    ) -> bool:
        """`publish` until it works (returns its duplicate flag) or, once `stopping` is set, `deadline`
        (monotonic) passes: then `PublishFailed`. Waits grow from 0.5 s to 5 s; each cause is logged once."""
        wait = 0.5
        while True:
            try:
                duplicate = await self.publish(subject, payload, headers)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure: keep the data, try again
                text = f"{type(exc).__name__}: {exc}".rstrip(": ")
                if text != self._last_error:
                    log.warning(
                        "publish to %s failed (%s); retrying, nothing is acked meanwhile", subject, text
                    )
                    self._last_error = text
                if stopping.is_set() and time.monotonic() + wait > deadline:
                    raise PublishFailed(text) from None
                if on_retry is not None:
                    await on_retry()
                await asyncio.sleep(wait)
                wait = min(wait * 2, 5.0)
                continue
            if self._last_error:
                log.info("publishing to %s again", subject)
                self._last_error = ""
            return duplicate

    async def log_line(self, level: str, text: str) -> bool:
        """One CC log line on `<cluster>.log.hpcbus`, the subject humans and the InfluxDB writer read."""
        line = Line("hpcbus", {"hostname": self.host, "loglevel": level}, {"log": text}, int(time.time()))
        try:
            await self.publish(subjects.log(self.cluster, "hpcbus"), (format_line(line) + "\n").encode(), {})
        except Exception as exc:
            log.warning("could not publish to the log subject: %s", exc)
            return False
        return True

    async def report_problems(self, problems: list[Problem], level: str = "error") -> bool:
        """Each problem on the Python log, the first `MAX_LOGGED_PROBLEMS` also on the log subject."""
        ok = True
        for i, problem in enumerate(problems):
            (log.warning if level == "error" else log.info)("%s: %s", level, problem)
            if i < MAX_LOGGED_PROBLEMS:
                ok = await self.log_line(level, str(problem)) and ok
        if len(problems) > MAX_LOGGED_PROBLEMS:
            ok = await self.log_line(level, f"... and {len(problems) - MAX_LOGGED_PROBLEMS} more") and ok
        return ok

    async def deadletter(
        self, origin_subject: str, data: bytes, problems: list[Problem], dedup_id: str = ""
    ) -> bool:
        """The original payload to `<cluster>.deadletter.<category>` with `Hpcbus-Subject` and
        `Hpcbus-Problems` headers, the form `hpcbus deadletter list|replay` reads."""
        category = "unknown"
        with contextlib.suppress(subjects.SubjectError):
            category = subjects.parse(origin_subject).category
        headers = {
            "Hpcbus-Subject": origin_subject,
            "Hpcbus-Problems": msgspec.json.encode(problems[:100]).decode(),
        }
        if dedup_id:
            headers["Nats-Msg-Id"] = dedup_id
        try:
            await self.publish(deadletter_subject(self.cluster, category), data, headers)
        except Exception as exc:
            log.warning("could not dead-letter a message from %s: %s", origin_subject, exc)
            return False
        return True

    async def telemetry(self, name: str, counters: msgspec.Struct) -> None:
        """`hpcbus_<counter>` metric lines (stype `worker`, stype-id `name`) on `<cluster>.metrics`, marked so
        that the translator itself skips them."""
        now = int(time.time())
        lines = [
            metric(f"hpcbus_{key}", value, hostname=self.host, time=now, stype="worker", stype_id=name)
            for key, value in msgspec.structs.asdict(counters).items()
        ]
        try:
            await self.nc.publish(
                subjects.metrics(self.cluster),
                format_lines(lines).encode(),
                headers={ORIGIN_HEADER: TELEMETRY},
            )
        except Exception as exc:  # telemetry about telemetry must never stop the worker
            log.debug("self-telemetry not published: %s", exc)


def dedup_id(msg: Msg) -> str:
    """The dead-letter `Nats-Msg-Id` of a JetStream message: the same as the InfluxDB writer's, so when both
    workers reject one message the dead-letter stream keeps one copy."""
    try:
        meta = msg.metadata
    except Exception:  # not a JetStream delivery (core mode, or a request with a reply subject)
        return ""
    return f"dlq:{meta.stream}:{meta.sequence.stream}"
