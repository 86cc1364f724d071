"""`hpcbus produce ocs`: publish what an OCS / Grid Engine accounting file says about finished jobs.

Run it on the host that sees `$SGE_ROOT/$SGE_CELL/common/accounting.jsonl` (or the colon-format
`accounting`). Each poll's new lines become one Sonar jobs envelope on `<cluster>.events.slurm`, cc-backend
`stop_job` events on `<cluster>.events.job`, and one `log` line per bad line on `<cluster>.log.hpcbus`.

`--once` prints what would be published as `SUBJECT<TAB>LINE` (so `cut -f2` gives plain line protocol and
`grep` selects a subject) and touches neither NATS nor the state file; bad lines go to stderr and make the
exit status 1. It starts where the service would: at the saved `--state`, else at the start of the file
(at its end with `--from-end`, so nothing of the history is printed).

As a service: `producers.ocs.source.OcsSource` on the producer runtime (`hpcbus.sources`): the accounting
file is the buffer, and the offset in the state file only moves past lines JetStream has stored.
SIGTERM/SIGINT: publish what is queued within the stop deadline, save the state, exit 0; what was not
acknowledged is read again at the next start, with the same message ids.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import TextIO

from hpcbus.options import Section, add_section_arguments, read_section
from hpcbus.producers.ocs.settings import OCS, OcsSettings
from hpcbus.settings import (
    BUS,
    CCBACKEND,
    CcBackendSettings,
    SettingsError,
    bus_settings,
    cc_backend_settings,
    check_sonar_names,
    stream_overrides,
)
from hpcbus.settings import clusters as cluster_names

HELP = "follow an OCS/Grid Engine accounting file: jobs envelopes and cc-backend stop_job events"
USES_BUS = True

log = logging.getLogger("hpcbus.ocs")


CC = Section(
    CCBACKEND.table,
    CCBACKEND.struct,
    env=CCBACKEND.env,
    metavars=CCBACKEND.metavars,
    notes={"cc_node_state_subject": "Not used by `produce ocs` (the accounting file has no node states)."},
)

SECTIONS = (BUS, OCS, CC)

ROLE = "ocs"
"""The lease a cluster's `produce ocs` pair shares (`lease.ocs` in the cluster's roles bucket)."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_section_arguments(p, CC)
    g = add_section_arguments(p, OCS)
    g.add_argument(
        "--once",
        action="store_true",
        help="print SUBJECT<TAB>LINE for what would be published; no NATS, no state written; exit 1 on bad lines",
    )


def ocs_settings(args: argparse.Namespace) -> OcsSettings:
    settings = read_section(args, OCS)
    if not settings.accounting:
        raise SettingsError("--accounting FILE is required (or `accounting` in the [ocs] table)")
    if not settings.interval > 0:
        raise SettingsError(f"--interval must be positive, not {settings.interval}")
    if settings.max_inflight < 1 or settings.max_chunk_bytes < 1:
        raise SettingsError("max_inflight and max_chunk_bytes must be positive")
    return settings


def _cluster(args: argparse.Namespace) -> str:
    (cluster,) = cluster_names(bus_settings(args))
    check_sonar_names([cluster])
    return cluster


def check(args: argparse.Namespace) -> None:
    """What `--check-config` checks besides the tables: the cluster stamped into every envelope."""
    _cluster(args)


def run(args: argparse.Namespace) -> int:
    from hpcbus.producers.ocs.follow import StateError

    settings = ocs_settings(args)
    cluster = _cluster(args)
    cc = cc_backend_settings(args, CC)
    prefix = bus_settings(args).subject_prefix
    try:
        if args.once:
            return asyncio.run(run_once(settings, cluster, sys.stdout, prefix=prefix, cc=cc))
        return asyncio.run(serve(settings, args, cluster, cc))
    except StateError as exc:  # a state file that cannot be read: the admin must look
        log.error("%s", exc)
        return 2


async def run_once(
    settings: OcsSettings,
    cluster: str,
    out: TextIO,
    *,
    prefix: str = "",
    cc: CcBackendSettings | None = None,
) -> int:
    """The source's polls until the end of the file (from the saved state, if any), their lines printed;
    1 when some line was bad."""
    from hpcbus.producers.ocs.source import OcsSource
    from hpcbus.sources import once, rows

    if not os.path.isfile(settings.accounting):
        raise SettingsError(f"--accounting {settings.accounting}: no such file")
    source = OcsSource(settings, cluster, prefix=prefix, cc=cc, keep_state=False)
    try:
        await once([source], rows(out))
    finally:
        source.follower.close()
    out.flush()
    totals = source.totals
    log.info(
        "%s: %d records, %d jobs, %d bad",
        settings.accounting,
        totals["records"],
        totals["jobs"],
        totals["problems"],
    )
    return 1 if totals["problems"] else 0


# --- service ------------------------------------------------------------------------------------------------


async def serve(
    settings: OcsSettings, args: argparse.Namespace, cluster: str, cc: CcBackendSettings | None = None
) -> int:
    from hpcbus.heldsources import serve_source
    from hpcbus.outbox import OutboxSettings
    from hpcbus.producers.ocs.source import OcsSource
    from hpcbus.sources import Telemetry
    from hpcbus.streams import telemetry_stream

    bus = bus_settings(args)
    source = OcsSource(settings, cluster, prefix=bus.subject_prefix, cc=cc)
    stream = telemetry_stream(
        cluster,
        prefix=bus.subject_prefix,
        **stream_overrides(settings.stream_max_age, settings.stream_max_bytes),
    )
    # Memory only: the accounting file is the durable copy. Reading pauses at `max_inflight` polls, so these
    # bounds are never reached (the outbox would drop the oldest messages there).
    outbox = OutboxSettings(
        max_messages=1_000_000,
        max_bytes=max(256 << 20, 8 * settings.max_chunk_bytes * settings.max_inflight),
    )
    telemetry = Telemetry("ocs", cluster, bus.subject_prefix, settings.stats_seconds)
    return await serve_source(
        bus,
        "hpcbus-ocs",
        source,
        outbox,
        [stream],
        state=settings.state,
        role=ROLE,
        lease_ttl=settings.lease_ttl,
        core_subjects=sorted(source.relay.subjects),
        telemetry=telemetry,
    )
