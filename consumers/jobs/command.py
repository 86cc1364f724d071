"""`hpcbus consume jobs`: per-job summaries from the bus (docs/jobs.md): one runner per cluster reading
`<cluster>.metrics` and `<cluster>.events.>`, a `jobsummary` event and a `job_summary` InfluxDB point per
finished job. Run one per cluster (the aggregates of a job must live in one process), or, with `[jobs] state =
"jetstream"`, two per cluster on two hosts: an active/standby pair sharing a lease (`serve_pair`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from hpcbus.consumers.jobs.settings import JOBS, JobsSettings
from hpcbus.delivery import PEERS_ELSEWHERE, RunnerSettings, delivery_section
from hpcbus.influx.settings import INFLUX
from hpcbus.options import add_section_arguments, read_section
from hpcbus.settings import BUS, BusSettings, SettingsError, add_stream_arguments, bus_settings

if TYPE_CHECKING:
    from hpcbus.influx.settings import InfluxSettings
    from hpcbus.schemas.jobsummary import State
    from hpcbus.sinks import Clusters

HELP = "per-job summaries from the bus: jobsummary events and job_summary points"
USES_BUS = True

log = logging.getLogger("hpcbus.jobs")

DELIVERY = delivery_section("hpcbus-jobs", notes={"peers": PEERS_ELSEWHERE})
SECTIONS = (BUS, JOBS, INFLUX, DELIVERY)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_section_arguments(p, JOBS)
    add_section_arguments(p, INFLUX)
    add_section_arguments(p, DELIVERY)
    add_stream_arguments(p)


def jobs_settings(args: argparse.Namespace) -> JobsSettings:
    settings = read_section(args, JOBS)
    return settings


LEGACY_STATE = "hpcbus-jobs.state"
"""The file the old default kept in the current directory (the systemd unit's: the state directory)."""


def adopt_legacy(path: Path, cluster: str, durable: str) -> State | None:
    """The state an older release kept as `hpcbus-jobs.state` in the state directory (the unit's working
    directory), renamed to `path` when `path` does not exist yet and the file is this cluster's (one of
    another is refused as `load_state` says): an upgrade keeps its open jobs. None when there is none."""
    from hpcbus.consumers.jobs.sink import load_state

    legacy = path.parent / LEGACY_STATE
    if path.exists() or not legacy.is_file():
        return None
    state = load_state(legacy, cluster, durable)
    try:
        os.replace(legacy, path)
    except OSError as exc:
        raise SettingsError(f"[jobs] state_file: cannot rename {legacy} to {path} ({exc.strerror})") from None
    log.info("%s: the state of an older release, %s, is now %s", cluster, legacy, path)
    return state


def runner_settings(args: argparse.Namespace, jobs: JobsSettings) -> RunnerSettings:
    # `peers` names the InfluxDB writer's other groups (the table is shared): never this command's durables
    settings = msgspec.structs.replace(read_section(args, DELIVERY), peers=[])
    if settings.mode != "jetstream":
        raise SettingsError("[delivery] mode: consume jobs needs jetstream (its state follows the acks)")
    if jobs.window <= settings.ack_wait:
        raise SettingsError(
            f"[jobs] window = {jobs.window} must exceed [delivery] ack_wait = {settings.ack_wait:g}: "
            "redelivered messages come back after ack_wait and must still find their samples open"
        )
    if jobs.save_seconds >= settings.ack_wait:
        raise SettingsError(
            f"[jobs] save_seconds = {jobs.save_seconds:g} must stay below [delivery] ack_wait = "
            f"{settings.ack_wait:g}: input is acknowledged only after the write that holds it"
        )
    return settings


async def main(args: argparse.Namespace) -> int:
    from nats.aio.client import Client as NATS

    from hpcbus.consumers.jobs.sink import JobsSink, StateFileError, load_state, state_path
    from hpcbus.influx.writer import make_writer, prepare
    from hpcbus.outlet import Outlet
    from hpcbus.schemas import subjects
    from hpcbus.sinks import Feed, serve, worker_clusters

    bus = bus_settings(args)
    jobs = jobs_settings(args)
    influx = read_section(args, INFLUX)
    delivery = runner_settings(args, jobs)
    clusters = worker_clusters(args, bus)
    prefix = clusters.prefix
    if jobs.state == "jetstream":
        return await serve_pair(bus, jobs, influx, delivery, clusters)
    several = len(clusters.names) > 1
    paths = {c: state_path(jobs.state_file, c, several, delivery.durable) for c in clusters.names}
    for path in paths.values():
        if not jobs.state_file:  # the state directory: made on first use (systemd makes its own)
            try:
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            except OSError as exc:
                raise SettingsError(
                    f"[jobs] state_file: cannot create {path.parent} ({exc.strerror})"
                ) from None
        if not path.parent.is_dir():
            raise SettingsError(f"[jobs] state_file: directory {path.parent} does not exist")
    try:
        states = {c: load_state(path, c, delivery.durable) for c, path in paths.items()}
        if not jobs.state_file and not several:
            (cluster,) = clusters.names
            states[cluster] = adopt_legacy(paths[cluster], cluster, delivery.durable) or states[cluster]
    except StateFileError as exc:
        log.error("%s", exc)
        return 1
    writer = make_writer(influx)

    async def feeds(nc: NATS) -> list[Feed]:
        await prepare(writer, "summaries will wait")
        return [
            Feed(
                clusters.streams[cluster].name,
                subjects.wildcards(cluster, "metrics", "events", prefix=prefix),
                delivery,
                JobsSink(
                    Outlet(nc, cluster, jetstream=True, timeout=jobs.publish_timeout, prefix=prefix),
                    writer,
                    jobs,
                    delivery.durable,
                    states[cluster],  # one state per cluster for the whole process: it outlives a connection
                    paths[cluster],
                ),
            )
            for cluster in clusters.names
        ]

    return await serve(bus, delivery.durable, clusters.wanted, feeds, closing=[writer])


ROLE = "jobs"
"""The lease a cluster's jobs worker pair shares (`lease.jobs` in the cluster's roles bucket)."""


async def serve_pair(
    bus: BusSettings, jobs: JobsSettings, influx: InfluxSettings, delivery: RunnerSettings, clusters: Clusters
) -> int:
    """`state = "jetstream"`: one side of an active/standby pair per cluster. Each cluster's runner starts
    only once this process holds the cluster's `jobs` lease, from the state the last holder saved in the
    roles bucket, and closes no job before it has caught up on the durable (`CatchUp`)."""
    from nats.aio.client import Client as NATS

    from hpcbus.consumers.jobs.kvstate import KvStore
    from hpcbus.consumers.jobs.sink import JobsSink
    from hpcbus.influx.writer import make_writer, prepare
    from hpcbus.lease import FencedStore, Lease
    from hpcbus.outlet import Outlet
    from hpcbus.schemas import subjects
    from hpcbus.sinks import CatchUp, Feed, Held, serve_held
    from hpcbus.streams import auto_replicas, roles_bucket, server_info

    writer = make_writer(influx)
    prefix = clusters.prefix

    def held(nc: NATS) -> list[Held]:
        replicas = bus.stream_replicas or auto_replicas(server_info(nc))
        out = []
        for cluster in clusters.names:
            lease = Lease(nc, roles_bucket(cluster), ROLE, ttl=jobs.lease_ttl, replicas=replicas)

            async def build(cluster: str = cluster, lease: Lease = lease) -> list[Feed]:
                store, state = await KvStore.load(FencedStore(lease), cluster, delivery.durable)
                stream = clusters.streams[cluster].name
                catch_up = CatchUp(nc, stream, delivery.durable)
                await catch_up.mark()
                await prepare(writer, "summaries will wait")
                sink = JobsSink(
                    Outlet(nc, cluster, jetstream=True, timeout=jobs.publish_timeout, prefix=prefix),
                    writer,
                    jobs,
                    delivery.durable,
                    state,
                    store,
                    caught_up=catch_up,
                )
                return [
                    Feed(
                        stream,
                        subjects.wildcards(cluster, "metrics", "events", prefix=prefix),
                        delivery,
                        sink,
                    )
                ]

            out.append(Held(lease, build))
        return out

    return await serve_held(bus, delivery.durable, clusters.wanted, held, closing=[writer])


def run(args: argparse.Namespace) -> int:
    return asyncio.run(main(args))
