"""`hpcbus produce slurm`: poll sacct/squeue/sinfo and publish jobs and cluster state on the bus.

Two modes:

* `--once`: poll once and print what would be published, one `SUBJECT<TAB>LINE` per line (stdout), the
  summary and any problems on stderr. NATS is not contacted and the state file is read (if given) but never
  written, so an admin can try settings on a live system without side effects. Exit 0, or 1 when a Slurm
  command failed.
* service (default): connect (retrying forever), make sure the cluster's stream exists, then poll every
  `--interval` seconds, handing each poll's messages to the outbox (ordered, JetStream-acknowledged,
  deterministic `Nats-Msg-Id`). The state file is written only when JetStream has acknowledged everything
  queued, so the file never claims that something was sent which a crash could still lose; the worst a
  crash costs is records sent twice. SIGTERM/SIGINT: stop polling (a running command is killed), give the
  outbox `flush_seconds` to deliver, save the state, exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import time
from datetime import datetime, tzinfo
from typing import TYPE_CHECKING, Any

from hpcbus.settings import (
    BusSettings,
    SettingsError,
    add_stream_arguments,
    bus_settings,
    section_settings,
    stream_overrides,
)
from producers.slurm.settings import SlurmSettings

if TYPE_CHECKING:
    from hpcbus.outbox import Outbox
    from producers.slurm.producer import Outgoing, SlurmProducer
    from producers.slurm.state import SlurmState

HELP = "publish Slurm jobs (sacct, squeue) and partitions/node states (sinfo) on <cluster>.events.*"
USES_BUS = True

log = logging.getLogger("hpcbus.slurm")

MAX_PROBLEMS_LOGGED = 20
"""Problems logged one by one per poll; the rest are counted (a broken sacct must not flood the journal)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("slurm")
    g.add_argument("--interval", type=float, metavar="S", help="seconds between polls (default 60)")
    g.add_argument(
        "--overlap", type=float, metavar="S", help="seconds each sacct window reaches back (default 300)"
    )
    g.add_argument("--state", metavar="FILE", help="state file: what was sent (default: memory only)")
    g.add_argument(
        "--tz", metavar="ZONE", help="zone of Slurm's times: IANA name, UTC or +hh:mm (default: this host's)"
    )
    g.add_argument(
        "--once",
        action="store_true",
        help="poll once, print SUBJECT<TAB>LINE of what would be published; no NATS, state not written",
    )
    add_stream_arguments(p)


def slurm_settings(args: argparse.Namespace) -> SlurmSettings:
    settings = section_settings(
        args,
        "slurm",
        SlurmSettings,
        flags=("interval", "overlap", "state", "tz", "stream_max_age", "stream_max_bytes"),
    )
    if settings.interval <= 0 or settings.overlap < 0 or settings.timeout <= 0:
        raise SettingsError("slurm settings: interval and timeout must be > 0, overlap >= 0")
    return settings


def _report(poll_failures: list[str], out: Outgoing, elapsed: float) -> None:
    for failure in poll_failures:
        log.error("%s", failure)
    for problem in out.problems[:MAX_PROBLEMS_LOGGED]:
        log.warning("%s", problem)
    if len(out.problems) > MAX_PROBLEMS_LOGGED:
        log.warning("... and %d more problems", len(out.problems) - MAX_PROBLEMS_LOGGED)
    log.info("poll: %s (%.2f s)", out.summary(), elapsed)


class _Service:
    """The pieces one poll needs; built once per process."""

    def __init__(self, settings: SlurmSettings, cluster: str, tz: tzinfo, tz_env: str | None) -> None:
        from producers.slurm.poller import Poller
        from producers.slurm.producer import SlurmProducer
        from producers.slurm.state import SlurmState

        self.settings = settings
        self.tz = tz
        self.state: SlurmState = (
            SlurmState.load(settings.state, cluster) if settings.state else SlurmState(cluster)
        )
        self.producer: SlurmProducer = SlurmProducer(settings, cluster, self.state)
        self.poller = Poller(settings, cluster, tz, tz_env)

    async def poll(self) -> tuple[list[str], Outgoing]:
        started = time.monotonic()
        now = datetime.now(self.tz)
        poll = await self.poller.poll(self.producer.window_start(now), now)
        out = self.producer.build(poll)
        _report(poll.failures, out, time.monotonic() - started)
        return poll.failures, out

    def save(self) -> None:
        if not self.settings.state:
            return
        try:
            self.state.save(self.settings.state)
        except OSError as exc:
            log.error("cannot write state %s: %s", self.settings.state, exc)


async def once(settings: SlurmSettings, cluster: str, tz: tzinfo, tz_env: str | None) -> int:
    from schemas.lineprotocol import format_line

    service = _Service(settings, cluster, tz, tz_env)
    failures, out = await service.poll()
    write = sys.stdout.write
    for subject, lines in out.lines.items():
        for line in lines:
            write(f"{subject}\t{format_line(line)}\n")
    sys.stdout.flush()
    return 1 if failures else 0


async def _publish(js: object, outbox: Outbox, cluster: str, settings: SlurmSettings) -> None:
    """Make sure the stream exists (retrying: JetStream may still be recovering), then publish forever."""
    from hpcbus.bus import ensure_stream, telemetry_stream

    overrides = stream_overrides(settings.stream_max_age, settings.stream_max_bytes)
    delay = 1.0
    last = ""
    while True:
        try:
            await ensure_stream(js, telemetry_stream(cluster, **overrides))  # type: ignore[arg-type]
            break
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            text = f"{type(exc).__name__}: {exc}".rstrip(": ")
            if text != last:
                log.warning("cannot create/update the stream (%s); retrying", text)
                last = text
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
    await outbox.run(js)


async def _until(stopping: asyncio.Event, aw: asyncio.Future[Any]) -> bool:
    """Wait for `aw` unless `stopping` is set first (then cancel it); True when `aw` finished."""
    stop: asyncio.Future[Any] = asyncio.ensure_future(stopping.wait())
    try:
        done, _ = await asyncio.wait({aw, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if aw in done:
        return True
    aw.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await aw
    return False


async def serve(settings: SlurmSettings, bus: BusSettings, tz: tzinfo, tz_env: str | None) -> int:
    from hpcbus.bus import connect
    from hpcbus.outbox import Outbox, OutboxSettings

    cluster = bus.cluster
    service = _Service(settings, cluster, tz, tz_env)
    outbox = Outbox(OutboxSettings(max_messages=settings.max_messages, spill_dir=settings.spill_dir))
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        if not stopping.is_set():
            log.info("%s: flushing and saving state, then exiting", sig.name)
        stopping.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)

    connecting = asyncio.ensure_future(connect(bus, f"hpcbus-slurm-{cluster}"))
    if not await _until(stopping, connecting):
        log.info("stopped before NATS was reached")
        return 0
    nc = connecting.result()
    publisher = asyncio.create_task(_publish(nc.jetstream(), outbox, cluster, settings))
    log.info(
        "polling Slurm every %g s for cluster %s (state %s)",
        settings.interval,
        cluster,
        settings.state or "-",
    )
    try:
        while not stopping.is_set():
            started = loop.time()
            polling = asyncio.ensure_future(service.poll())
            if not await _until(stopping, polling):
                break
            try:
                _, out = polling.result()
            except Exception:  # a bug must not end the service: the next poll's window covers this one
                log.exception("poll failed; trying again in %g s", settings.interval)
            else:
                for subject, payload, msg_id in out.messages():
                    outbox.put(subject, payload, msg_id)
            wait = max(0.0, started + settings.interval - loop.time())
            flushing = asyncio.ensure_future(outbox.flush(max(wait, 0.1)))
            if not await _until(stopping, flushing):
                break
            if flushing.result():
                service.save()
            remaining = started + settings.interval - loop.time()
            if remaining > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), remaining)
    finally:
        flushed = await outbox.flush(settings.flush_seconds)
        publisher.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await publisher
        if flushed or settings.spill_dir:
            service.save()
        else:
            log.warning(
                "%d messages not acknowledged by JetStream; state not saved, so they are sent again after "
                "a restart",
                len(outbox),
            )
        try:
            await asyncio.wait_for(nc.drain(), 5)
        except Exception:
            await nc.close()
    log.info("stopped cleanly (%d messages published)", outbox.sent)
    return 0


def run(args: argparse.Namespace) -> int:
    from producers.slurm.zone import resolve_zone
    from schemas import subjects

    try:
        settings = slurm_settings(args)
        bus = bus_settings(args)
        if not bus.cluster:
            raise SettingsError("--cluster (HPCBUS_CLUSTER) is required: the first part of every subject")
        try:
            subjects.events(bus.cluster, "slurm")
        except subjects.SubjectError as exc:
            raise SettingsError(f"--cluster: {exc}") from None
        try:
            tz, tz_env = resolve_zone(settings.tz)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        if args.once:
            return asyncio.run(once(settings, bus.cluster, tz, tz_env))
        return asyncio.run(serve(settings, bus, tz, tz_env))
    except SettingsError as exc:
        log.error("%s", exc)
        return 2
