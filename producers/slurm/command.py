"""`hpcbus produce slurm`: poll sacct/squeue/sinfo and publish jobs and cluster state on the bus.

Two modes:

* `--once`: poll once and print what would be published, one `SUBJECT<TAB>LINE` per line (stdout), the
  summary and any problems on stderr. NATS is not contacted and the state file is read (if given) but never
  written, so an admin can try settings on a live system without side effects. Exit 0, or 1 when a Slurm
  command failed.
* service (default): `producers.slurm.source.SlurmSource` on the producer runtime (`hpcbus.sources`):
  a poll every `--interval` seconds, the state file saved only after JetStream acknowledged the poll;
  SIGTERM/SIGINT stops within 5 s (a running command is killed, the outbox flushed within the deadline).
  With `[slurm] state = "jetstream"`, one side of an active/standby pair (`hpcbus.heldsources`): it polls
  only while it holds the cluster's `slurm` lease, its state and each poll's messages written ahead in
  fenced entries of the roles bucket.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import TYPE_CHECKING

from hpcbus.options import add_section_arguments, read_section
from hpcbus.producers.slurm.settings import SLURM, SLURM_OUTBOX, SlurmSettings
from hpcbus.settings import BUS, CCBACKEND, BusSettings, SettingsError, bus_settings, cc_backend_settings
from hpcbus.settings import clusters as cluster_names

if TYPE_CHECKING:
    from hpcbus.producers.slurm.source import SlurmSource

HELP = "publish Slurm jobs (sacct, squeue) and partitions/node states (sinfo) on <cluster>.events.*"
USES_BUS = True


SECTIONS = (BUS, SLURM, SLURM_OUTBOX, CCBACKEND)

ROLE = "slurm"
"""The lease a cluster's `produce slurm` pair shares (`lease.slurm` in the cluster's roles bucket)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_section_arguments(p, CCBACKEND)
    g = add_section_arguments(p, SLURM)
    g.add_argument(
        "--once",
        action="store_true",
        help="poll once, print SUBJECT<TAB>LINE of what would be published; no NATS, state not written",
    )
    add_section_arguments(p, SLURM_OUTBOX)


async def once(source: SlurmSource) -> int:
    from hpcbus.sources import once, rows

    await once([source], rows(sys.stdout))
    sys.stdout.flush()
    return 1 if source.failures else 0


async def serve(source: SlurmSource, args: argparse.Namespace, bus: BusSettings) -> int:
    from hpcbus.heldsources import serve_source
    from hpcbus.settings import stream_overrides
    from hpcbus.sources import Telemetry
    from hpcbus.streams import telemetry_stream

    settings = source.settings
    stream = telemetry_stream(
        bus.cluster,
        prefix=bus.subject_prefix,
        **stream_overrides(settings.stream_max_age, settings.stream_max_bytes),
    )
    name = f"hpcbus-slurm-{bus.cluster}"
    outbox = read_section(args, SLURM_OUTBOX)
    telemetry = Telemetry("slurm", bus.cluster, bus.subject_prefix)
    return await serve_source(
        bus,
        name,
        source,
        outbox,
        [stream],
        state=settings.state,
        role=ROLE,
        lease_ttl=settings.lease_ttl,
        core_subjects=sorted(source.relay.subjects),
        telemetry=telemetry,
    )


def slurm_source(args: argparse.Namespace, settings: SlurmSettings, bus: BusSettings) -> SlurmSource:
    from hpcbus.producers.slurm.source import SlurmSource
    from hpcbus.producers.slurm.zone import resolve_zone

    try:
        tz, tz_env = resolve_zone(settings.tz)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    cc = cc_backend_settings(args)
    return SlurmSource(settings, bus.cluster, tz, tz_env, prefix=bus.subject_prefix, cc=cc)


def run(args: argparse.Namespace) -> int:
    bus = bus_settings(args)
    cluster_names(bus)
    source = slurm_source(args, read_section(args, SLURM), bus)
    return asyncio.run(once(source) if args.once else serve(source, args, bus))
