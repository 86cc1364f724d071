"""`hpcbus produce slurm`: poll sacct/squeue/sinfo and publish jobs and cluster state on the bus.

Two modes:

* `--once`: poll once and print what would be published, one `SUBJECT<TAB>LINE` per line (stdout), the
  summary and any problems on stderr. NATS is not contacted and the state file is read (if given) but never
  written, so an admin can try settings on a live system without side effects. Exit 0, or 1 when a Slurm
  command failed.
* service (default): `producers.slurm.source.SlurmSource` on the producer runtime (`hpcbus.sources`):
  a poll every `--interval` seconds, the state file saved only after JetStream acknowledged the poll;
  SIGTERM/SIGINT stops within 5 s (a running command is killed, the outbox flushed within the deadline).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from datetime import tzinfo

from hpcbus.options import add_section_arguments, read_section
from hpcbus.producers.slurm.settings import SLURM, SlurmSettings
from hpcbus.settings import (
    BUS,
    CCBACKEND,
    BusSettings,
    CcBackendSettings,
    SettingsError,
    bus_settings,
    cc_backend_settings,
    stream_overrides,
)
from hpcbus.settings import clusters as cluster_names

HELP = "publish Slurm jobs (sacct, squeue) and partitions/node states (sinfo) on <cluster>.events.*"
USES_BUS = True

log = logging.getLogger("hpcbus.slurm")

SECTIONS = (BUS, SLURM, CCBACKEND)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_section_arguments(p, CCBACKEND)
    g = add_section_arguments(p, SLURM)
    g.add_argument(
        "--once",
        action="store_true",
        help="poll once, print SUBJECT<TAB>LINE of what would be published; no NATS, state not written",
    )


def slurm_settings(args: argparse.Namespace) -> SlurmSettings:
    settings: SlurmSettings = read_section(args, SLURM)
    return settings


async def once(
    settings: SlurmSettings, bus: BusSettings, cc: CcBackendSettings, tz: tzinfo, tz_env: str | None
) -> int:
    from hpcbus.producers.slurm.source import SlurmSource

    source = SlurmSource(settings, bus.cluster, tz, tz_env, prefix=bus.subject_prefix, cc=cc)
    failures, out = await source.poll_once()
    write = sys.stdout.write
    for subject, payload, _ in out.messages():
        for line in payload.decode().splitlines():
            write(f"{subject}\t{line}\n")
    sys.stdout.flush()
    return 1 if failures else 0


async def serve(
    settings: SlurmSettings, bus: BusSettings, cc: CcBackendSettings, tz: tzinfo, tz_env: str | None
) -> int:
    from hpcbus.bus import telemetry_stream
    from hpcbus.outbox import OutboxSettings
    from hpcbus.producers.slurm.source import SlurmSource
    from hpcbus.sources import serve as serve_sources

    source = SlurmSource(settings, bus.cluster, tz, tz_env, prefix=bus.subject_prefix, cc=cc)
    stream = telemetry_stream(
        bus.cluster,
        prefix=bus.subject_prefix,
        **stream_overrides(settings.stream_max_age, settings.stream_max_bytes),
    )
    outbox = OutboxSettings(max_messages=settings.max_messages, spill_dir=settings.spill_dir)
    return await serve_sources(
        bus,
        f"hpcbus-slurm-{bus.cluster}",
        [source],
        outbox,
        [stream],
        core_subjects=source.relay.subjects,
    )


def run(args: argparse.Namespace) -> int:
    from hpcbus.producers.slurm.zone import resolve_zone

    try:
        settings = slurm_settings(args)
        bus = bus_settings(args)
        cc = cc_backend_settings(args)
        cluster_names(bus)
        try:
            tz, tz_env = resolve_zone(settings.tz)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        if args.once:
            return asyncio.run(once(settings, bus, cc, tz, tz_env))
        return asyncio.run(serve(settings, bus, cc, tz, tz_env))
    except SettingsError as exc:
        log.error("%s", exc)
        return 2
