"""`hpcbus produce ocs`: publish what an OCS / Grid Engine accounting file says about finished jobs.

Run it on the host that sees `$SGE_ROOT/$SGE_CELL/common/accounting.jsonl` (or the colon-format
`accounting`). Each poll's new lines become one Sonar jobs envelope on `<cluster>.events.slurm`, cc-backend
`stop_job` events on `<cluster>.events.job`, and one `log` line per bad line on `<cluster>.log.hpcbus`.

`--once` prints what would be published as `SUBJECT<TAB>LINE` (so `cut -f2` gives plain line protocol and
`grep` selects a subject) and touches neither NATS nor the state file; bad lines go to stderr and make the
exit status 1. Without `--state` it reads the whole file; with it, it starts where the service would.

As a service: the accounting file is the buffer. Lines are read only while fewer than `max_inflight` chunks
wait for JetStream's ack, so a long broker outage costs nothing but time, and the offset in the state file
only moves past lines JetStream has stored. SIGTERM/SIGINT: publish what is queued (`flush_seconds`), save
the state, exit 0; what was not acknowledged is read again at the next start, with the same message ids.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import logging
import os
import re
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING, Any, NamedTuple, TextIO

import msgspec

from hpcbus.settings import (
    SettingsError,
    add_stream_arguments,
    bus_settings,
    section_settings,
    stream_overrides,
)

if TYPE_CHECKING:
    from producers.ocs.follow import Position

HELP = "follow an OCS/Grid Engine accounting file: jobs envelopes and cc-backend stop_job events"
USES_BUS = True

log = logging.getLogger("hpcbus.ocs")


class OcsSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`[ocs]` table of the `--config` file; the flags of the same name override it."""

    accounting: str = ""
    """The accounting file to follow (required)."""
    state: str = ""
    """State file keeping the acknowledged offset across restarts ("" = none: a restart reads it all again)."""
    interval: float = 10.0
    """Seconds between polls of the file."""
    from_end: bool = False
    """Without a saved state, start at the current end of the file instead of publishing its history."""
    start_jobs: bool = False
    """Also send cc-backend a start_job before each stop_job (when nothing else announces the jobs)."""
    max_chunk_bytes: int = 4 << 20
    """Bytes read per chunk (one jobs envelope per chunk)."""
    max_inflight: int = 8
    """Chunks published but not yet acknowledged before reading pauses."""
    flush_seconds: float = 5.0
    """On SIGTERM, seconds allowed to get queued messages acknowledged."""
    max_jobs: int = 4096
    """Jobs whose records are remembered for merging with later records (PE tasks, running, requeued)."""
    stats_seconds: float = 300.0
    """Interval of the one-line progress summary in the log."""
    stream_max_age: float = 0.0
    """Seconds the telemetry stream keeps messages when this command creates it (0: hpcbus' default, 7 days)."""
    stream_max_bytes: int = 0
    """Bytes the telemetry stream keeps when this command creates it (0: hpcbus' default, 10 GiB)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("ocs")
    g.add_argument(
        "--accounting", metavar="FILE", help="accounting.jsonl (OCS >= 9.0) or colon-format accounting"
    )
    g.add_argument(
        "--state", metavar="FILE", help="state file: the acknowledged offset, kept across restarts"
    )
    g.add_argument("--interval", type=float, metavar="S", help="seconds between polls (default 10)")
    g.add_argument(
        "--once",
        action="store_true",
        help="print SUBJECT<TAB>LINE for what would be published; no NATS, no state written; exit 1 on bad lines",
    )
    g.add_argument(
        "--from-end",
        dest="from_end",
        action="store_true",
        default=None,
        help="without a saved state, skip what the file holds already",
    )
    g.add_argument(
        "--start-jobs",
        dest="start_jobs",
        action="store_true",
        default=None,
        help="also send cc-backend a start_job before each stop_job",
    )
    add_stream_arguments(p)


def ocs_settings(args: argparse.Namespace) -> OcsSettings:
    settings = section_settings(args, "ocs", OcsSettings)
    if not settings.accounting:
        raise SettingsError("--accounting FILE is required (or `accounting` in the [ocs] table)")
    if not settings.interval > 0:
        raise SettingsError(f"--interval must be positive, not {settings.interval}")
    if settings.max_inflight < 1 or settings.max_chunk_bytes < 1:
        raise SettingsError("max_inflight and max_chunk_bytes must be positive")
    return settings


def _cluster(args: argparse.Namespace) -> str:
    from schemas.sonar.types import HOSTNAME_PATTERN
    from schemas.subjects import SubjectError, metrics

    cluster = bus_settings(args).cluster.strip()
    if not cluster:
        raise SettingsError("--cluster (HPCBUS_CLUSTER) is required: the first part of every subject")
    if "," in cluster:
        raise SettingsError(f"--cluster {cluster!r}: one accounting file belongs to one cluster")
    try:
        metrics(cluster)
    except SubjectError as exc:
        raise SettingsError(str(exc)) from None
    if not re.fullmatch(HOSTNAME_PATTERN, cluster):
        raise SettingsError(
            f"--cluster {cluster!r}: a Sonar envelope's cluster is a host-name-like name (letters, digits, "
            "inner hyphens, dots)"
        )
    return cluster


def run(args: argparse.Namespace) -> int:
    from producers.ocs.follow import StateError

    try:
        settings = ocs_settings(args)
        cluster = _cluster(args)
        if args.once:
            return run_once(settings, cluster, sys.stdout)
        return asyncio.run(serve(settings, args, cluster))
    except (SettingsError, StateError) as exc:
        log.error("%s", exc)
        return 2


# --- --once -------------------------------------------------------------------------------------------------


def run_once(settings: OcsSettings, cluster: str, out: TextIO) -> int:
    """Map the file (from the saved state, if any) and print the lines; 1 when some line was bad."""
    from producers.ocs.follow import Follower, load_state
    from producers.ocs.mapping import JobMerger
    from producers.ocs.pipeline import Pipeline

    if not os.path.isfile(settings.accounting):
        raise SettingsError(f"--accounting {settings.accounting}: no such file")
    state = load_state(settings.state) if settings.state else None
    follower = Follower(settings.accounting, state, max_chunk_bytes=settings.max_chunk_bytes)
    pipeline = Pipeline(
        cluster,
        hostname=socket.gethostname(),
        start_jobs=settings.start_jobs,
        merger=JobMerger(max_jobs=settings.max_jobs),
    )
    now = int(time.time())
    records = jobs = problems = 0
    try:
        while True:
            for chunk in follower.read():
                batch = pipeline.process(chunk, now=now)
                for problem in batch.problems:
                    log.error("%s", problem)
                records, jobs, problems = (
                    records + batch.records,
                    jobs + batch.jobs,
                    problems + len(batch.problems),
                )
                for message in batch.messages:
                    for line in message.payload.decode().splitlines():
                        out.write(f"{message.subject}\t{line}\n")
            if not follower.behind:
                break
    finally:
        follower.close()
    out.flush()
    log.info("%s: %d records, %d jobs, %d bad", settings.accounting, records, jobs, problems)
    return 1 if problems else 0


# --- service ------------------------------------------------------------------------------------------------


class _InFlight(NamedTuple):
    """A chunk handed to the outbox: acknowledged once the outbox has sent `sent_after` messages in all."""

    sent_after: int
    end: Position
    cut: tuple[int, int]


async def _wait(event: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)


async def _close(nc: Any) -> None:
    """Drain when connected; while the broker is away, closing is all there is (and may fail too)."""
    try:
        if nc.is_connected:
            await nc.drain()
            return
    except Exception as exc:
        log.debug("nats: drain failed (%s); closing", exc)
    with contextlib.suppress(Exception):
        await nc.close()


async def serve(settings: OcsSettings, args: argparse.Namespace, cluster: str) -> int:
    from hpcbus.bus import connect, ensure_stream, telemetry_stream
    from hpcbus.outbox import Outbox, OutboxSettings
    from producers.ocs.follow import Follower, FollowState, load_state, save_state
    from producers.ocs.mapping import JobMerger
    from producers.ocs.pipeline import Batch, Pipeline

    bus = bus_settings(args)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)

    state = load_state(settings.state) if settings.state else None
    if not settings.state:
        log.warning("no --state file: after a restart the whole accounting file is published again")
    follower = Follower(
        settings.accounting, state, max_chunk_bytes=settings.max_chunk_bytes, from_end=settings.from_end
    )
    committed: Position = follower.position  # the saved one, unless the file was truncated/replaced
    pipeline = Pipeline(
        cluster,
        hostname=socket.gethostname(),
        start_jobs=settings.start_jobs,
        merger=JobMerger(max_jobs=settings.max_jobs),
    )

    connecting = asyncio.ensure_future(connect(bus, "hpcbus-ocs"))
    stop_wait = asyncio.ensure_future(stopping.wait())
    await asyncio.wait({connecting, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
    if not connecting.done():
        connecting.cancel()
        follower.close()
        return 0
    stop_wait.cancel()
    nc = connecting.result()
    js = nc.jetstream()
    overrides = stream_overrides(settings.stream_max_age, settings.stream_max_bytes)
    reported = ""
    while not stopping.is_set():
        try:
            await ensure_stream(js, telemetry_stream(cluster, **overrides))
            break
        except Exception as exc:  # JetStream not enabled yet, no permission, broker restarting: retry
            text = f"{type(exc).__name__}: {exc}"
            if text != reported:
                log.warning("cannot set up the telemetry stream (%s); retrying", text)
                reported = text
            await _wait(stopping, 2.0)

    # Memory only: the accounting file is the durable copy. Reading pauses at `max_inflight` chunks, so these
    # bounds are never reached (the outbox would drop the oldest messages there, and their chunks would
    # never count as acknowledged).
    outbox = Outbox(
        OutboxSettings(
            max_messages=1_000_000,
            max_bytes=max(256 << 20, 8 * settings.max_chunk_bytes * settings.max_inflight),
        )
    )
    sender = asyncio.create_task(outbox.run(js))
    inflight: collections.deque[_InFlight] = collections.deque()
    put_total = 0
    totals = collections.Counter[str]()
    last_stats = time.monotonic()

    def save() -> None:
        if settings.state:
            cuts = [f.cut for f in inflight]
            save_state(settings.state, FollowState(path=settings.accounting, position=committed, cuts=cuts))

    def advance() -> bool:
        nonlocal committed
        moved = False
        while inflight and inflight[0].sent_after <= outbox.sent:
            committed = inflight.popleft().end
            moved = True
        return moved

    def step() -> list[Batch]:
        now = int(time.time())
        return [pipeline.process(chunk, now=now) for chunk in follower.read()]

    log.info("following %s for cluster %s", settings.accounting, cluster)
    try:
        while not stopping.is_set():
            if advance():
                save()
            if len(inflight) >= settings.max_inflight:
                await _wait(stopping, min(0.1, settings.interval))
                continue
            batches = await asyncio.to_thread(step)
            for batch in batches:
                for problem in batch.problems:
                    log.error("%s", problem)
                for message in batch.messages:
                    outbox.put(message.subject, message.payload, message.msg_id)
                put_total += len(batch.messages)
                end = batch.chunk.end
                inflight.append(_InFlight(put_total, end, (end.inode, end.offset)))
                totals.update(
                    records=batch.records, jobs=batch.jobs, events=batch.events, problems=len(batch.problems)
                )
            if batches:
                save()  # write-ahead: the chunk boundaries, so a crash re-cuts the same chunks
            if time.monotonic() - last_stats >= settings.stats_seconds:
                log.info(
                    "%d records, %d job records, %d cc events, %d bad lines so far; acknowledged up to line %d",
                    totals["records"],
                    totals["jobs"],
                    totals["events"],
                    totals["problems"],
                    committed.line,
                )
                last_stats = time.monotonic()
            if not (follower.behind and len(inflight) < settings.max_inflight):
                await _wait(stopping, settings.interval)
    finally:
        flushed = await outbox.flush(settings.flush_seconds)
        advance()
        save()
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        await _close(nc)
        follower.close()
    if flushed:
        log.info("stopped cleanly at line %d of %s", committed.line, settings.accounting)
    else:
        log.warning(
            "stopped with %d messages unacknowledged; they are read again at the next start", len(outbox)
        )
    return 0
