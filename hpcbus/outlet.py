"""What every consumer worker publishes besides its output: the log subject, the dead-letter stream,
self-telemetry, and the origin mark. A publish is made once (`publish`): retrying it is the runtime's
(`hpcbus.runner.Runner.attempt`), except a dead letter, stored before its original is acknowledged and so
retried here until it is (`store_deadletter`).

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

import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from hpcbus.bus import (
    DEFAULT_MAX_PAYLOAD,
    check_size,
    deadletter_stream,
    header_bytes,
    js_publish,
    refused_publish,
)
from hpcbus.retry import Stopped, Stopping, Trouble, retry
from hpcbus.schemas import subjects
from hpcbus.schemas.lineprotocol import Line, format_line, format_lines, metric
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.translate import msg_id

log = logging.getLogger("hpcbus.outlet")

ORIGIN_HEADER = "Hpcbus-Origin"
TRANSLATED = "translated"
"""Header value on everything the translator publishes (envelopes and lines)."""
TELEMETRY = "telemetry"
"""Header value on the worker's own `hpcbus_*` metric lines."""
SKIPPED_ORIGINS = frozenset({TRANSLATED, TELEMETRY})

MAX_PROBLEMS_HEADER = 16 * 1024
"""Bytes of JSON problems in a dead letter's header; beyond it the first problems and a count."""
PART_HEADER_BYTES = 64
"""Room for `Hpcbus-Part` and the part number on a dead letter cut into parts."""

MAX_LOGGED_PROBLEMS = 20
PROBLEMS_PER_MINUTE = 100
"""Problems a worker writes to its Python log (the journal) in a minute; the rest are counted there."""
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

    def __init__(
        self, nc: NATS, cluster: str, *, jetstream: bool, timeout: float = 5.0, prefix: str = ""
    ) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.cluster = cluster
        self.prefix = prefix
        """The subject prefix (`[bus] subject_prefix`): every subject this cluster's workers use is under it."""
        self.jetstream = jetstream
        self.timeout = timeout
        self.host = socket.gethostname()
        self.trouble = Trouble(log, f"publish for {cluster}")
        self.deadletters = Trouble(log, f"dead-letter for {cluster}")
        self._said = 0
        """Problems written to the Python log in the current minute (`PROBLEMS_PER_MINUTE` at most)."""
        self._unsaid = 0
        self._minute = 0.0

    def message_limit(self) -> int:
        """Bytes a payload this outlet publishes may have: the server's `max_payload` as announced, less the
        headers a translator's message carries (`Nats-Msg-Id`, `Hpcbus-Origin`), which the server counts."""
        room = header_bytes({"Nats-Msg-Id": "0" * 64, ORIGIN_HEADER: TRANSLATED})
        return int(self.nc.max_payload or DEFAULT_MAX_PAYLOAD) - room

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> bool:
        """Publish once; True when JetStream reports a duplicate (its `Nats-Msg-Id` was seen in the window)."""
        if not self.jetstream:
            check_size(self.nc, subject, payload, headers)
            await self.nc.publish(subject, payload, headers=headers)
            return False
        try:
            ack = await js_publish(self.nc, subject, payload, headers, self.timeout)
        except TimeoutError:
            # A publish the server refuses for this identity's permissions is dropped with an -ERR that
            # nats-py keeps as the connection's last error; the request only times out. Raised as that
            # error, which `hpcbus.permanent.outcome` calls permanent: no retry cures it.
            refusal = refused_publish(self.nc, subject)
            if refusal is not None:
                raise refusal from None
            raise
        return bool(ack.duplicate)

    async def log_line(self, level: str, text: str) -> bool:
        """One CC log line on `<cluster>.log.hpcbus`, the subject humans and the InfluxDB writer read."""
        line = Line("hpcbus", {"hostname": self.host, "loglevel": level}, {"log": text}, int(time.time()))
        try:
            subject = subjects.log(self.cluster, "hpcbus", prefix=self.prefix)
            await self.publish(subject, (format_line(line) + "\n").encode(), {})
        except Exception as exc:
            log.warning("could not publish to the log subject: %s", exc)
            return False
        return True

    async def report_problems(self, problems: list[Problem], level: str = "error") -> bool:
        """The first `MAX_LOGGED_PROBLEMS` problems of a message on the Python log and the log subject, then
        how many more: a message of 10,000 bad lines is 21 lines, not 10,000 (the dead letter keeps them
        all, `hpcbus deadletter list` shows them)."""
        ok = True
        for problem in problems[:MAX_LOGGED_PROBLEMS]:
            self._say(level, str(problem))
            ok = await self.log_line(level, str(problem)) and ok
        if len(problems) > MAX_LOGGED_PROBLEMS:
            more = f"... and {len(problems) - MAX_LOGGED_PROBLEMS} more (in the dead letter)"
            self._say(level, more)
            ok = await self.log_line(level, more) and ok
        return ok

    def _say(self, level: str, text: str) -> None:
        """One problem on the Python log, at most `PROBLEMS_PER_MINUTE` a minute: a flood of bad input (a
        broken node sending thousands of bad messages) is an episode there, one line saying how many more
        the minute had, while the log subject and the dead letters keep every one."""
        now = time.monotonic()
        if now - self._minute >= 60.0:
            if self._unsaid:
                log.warning(
                    "%s: %d more problems in the last minute not written here (on the log subject "
                    "and in the dead letters: hpcbus deadletter list)",
                    self.cluster,
                    self._unsaid,
                )
            self._minute, self._said, self._unsaid = now, 0, 0
        if self._said >= PROBLEMS_PER_MINUTE:
            self._unsaid += 1
            return
        self._said += 1
        (log.warning if level == "error" else log.info)("%s: %s", level, text)

    async def store_deadletter(
        self,
        origin_subject: str,
        data: bytes,
        problems: list[Problem],
        dedup_id: str = "",
        stopping: Stopping | None = None,
    ) -> bool:
        """Dead-letter (see `_deadletter_once`), retried until stored: True; False when the stop deadline
        came first. Never given up on: the caller acknowledges the original only once its dead letter is
        stored, so a dead-letter stream that cannot take it (missing, full, no quorum, not permitted)
        stalls the worker visibly (one WARNING per episode, `hpcbus status`) instead of losing it."""
        try:
            await retry(
                lambda: self._deadletter_once(origin_subject, data, problems, dedup_id),
                trouble=self.deadletters,
                stopping=stopping,
                cap=10.0,
            )
        except Stopped:
            return False
        return True

    async def deadletter_dropped(self) -> int | None:
        """Dead letters the dead-letter stream no longer holds from its oldest end: its first sequence less
        one. The stream (`hpcbus.bus.deadletter_stream`) keeps 30 days and at most its `max_bytes` (1 GiB
        by default), dropping the oldest beyond either (`hpcbus deadletter replay` deletes what it replayed,
        which counts here when it was the oldest). None when it cannot be asked now (core mode, NATS
        away): a gauge, best effort, bounded to a second."""
        if not self.jetstream or not self.nc.is_connected:
            return None
        try:
            name = deadletter_stream(self.cluster, prefix=self.prefix).name
            info = await asyncio.wait_for(self.js.stream_info(name), 1.0)
        except Exception as exc:  # no stream yet, NATS away: said next time
            log.debug("dead-letter stream not asked: %s", exc)
            return None
        return max(0, int(info.state.first_seq or 1) - 1)

    async def _deadletter_once(
        self, origin_subject: str, data: bytes, problems: list[Problem], dedup_id: str
    ) -> None:
        """The original payload to `<cluster>.deadletter.<category>` with `Hpcbus-Subject` and
        `Hpcbus-Problems` headers, the form `hpcbus deadletter list|replay` reads.

        The server's `max_payload` counts headers too, so an original close to the limit cannot go as it
        came (and sending it would make the server close the connection): it is cut into parts that fit,
        each with `Hpcbus-Part: i/n` and `Hpcbus-Original` (the original's id), which `deadletter replay`
        puts together again. The problems header is bounded the same way (the first ones, then a count)."""
        category = "unknown"
        with contextlib.suppress(subjects.SubjectError):
            category = subjects.parse(origin_subject, self.prefix).category
        original = dedup_id or "dlq:" + msg_id(origin_subject, data)
        headers = {
            "Hpcbus-Subject": origin_subject,
            "Hpcbus-Problems": problems_header(problems),
            "Nats-Msg-Id": original,
        }
        limit = int(self.nc.max_payload or DEFAULT_MAX_PAYLOAD)
        room = limit - header_bytes(headers) - PART_HEADER_BYTES - len(original)
        parts = [data] if len(data) + header_bytes(headers) <= limit else split_bytes(data, room)
        subject = subjects.deadletter(self.cluster, category, prefix=self.prefix)
        for i, part in enumerate(parts, 1):
            part_headers = headers
            if len(parts) > 1:
                part_headers = {
                    **headers,
                    "Nats-Msg-Id": f"{original}:{i}",
                    "Hpcbus-Part": f"{i}/{len(parts)}",
                    "Hpcbus-Original": original,
                }
            await self.publish(subject, part, part_headers)

    async def telemetry(self, name: str, counters: msgspec.Struct) -> None:
        """`hpcbus_<counter>` metric lines (stype `worker`, stype-id `name`) on `<cluster>.telemetry` (a
        subject of their own: see `subjects.TELEMETRY`), marked so that a translator reading it skips them."""
        now = int(time.time())
        gauges: frozenset[str] = getattr(counters, "GAUGES", frozenset())
        lines = [
            metric(f"hpcbus_{key}", value, hostname=self.host, time=now, stype="worker", stype_id=name)
            for key, value in msgspec.structs.asdict(counters).items()
        ]
        for line in lines:
            if line.measurement.removeprefix("hpcbus_") in gauges:
                line.tags["kind"] = "gauge"  # a level, not a count: `hpcbus status` shows no rate of it
        try:
            await self.nc.publish(
                subjects.telemetry(self.cluster, prefix=self.prefix),
                format_lines(lines).encode(),
                headers={ORIGIN_HEADER: TELEMETRY},
            )
        except Exception as exc:  # telemetry about telemetry must never stop the worker
            log.debug("self-telemetry not published: %s", exc)


def problems_header(problems: list[Problem]) -> str:
    """`problems` as JSON, at most `MAX_PROBLEMS_HEADER` bytes: as many as fit, then one saying how many
    more there were (all of them were reported on the log subject and the Python log)."""
    text = msgspec.json.encode(problems).decode()
    if len(text) <= MAX_PROBLEMS_HEADER:
        return text
    kept = list(problems)
    while kept:
        kept = kept[: len(kept) // 2]
        more = Problem(f"... and {len(problems) - len(kept)} more problems", kind="deadletter")
        text = msgspec.json.encode([*kept, more]).decode()
        if len(text) <= MAX_PROBLEMS_HEADER:
            return text
    return msgspec.json.encode([Problem(f"{len(problems)} problems", kind="deadletter")]).decode()


def split_bytes(data: bytes, size: int) -> list[bytes]:
    """`data` in pieces of `size` bytes (the last shorter); put together again by `deadletter replay`."""
    size = max(1, size)
    return [data[i : i + size] for i in range(0, len(data), size)] or [b""]


def dedup_id(msg: Msg) -> str:
    """The dead-letter `Nats-Msg-Id` of a JetStream message: the same as the InfluxDB writer's, so when both
    workers reject one message the dead-letter stream keeps one copy."""
    try:
        meta = msg.metadata
    except Exception:  # not a JetStream delivery (core mode, or a request with a reply subject)
        return ""
    return f"dlq:{meta.stream}:{meta.sequence.stream}"
