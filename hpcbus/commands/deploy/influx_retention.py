"""`hpcbus deploy influx-retention`: keep raw data for `raw_duration` and 5-minute means for a year.

Creates (or corrects) the raw retention policy (`[influx] rp`, else `autogen`) and the `5m` policy, and the
continuous queries that fill `5m` from the raw data for every measurement the Grafana dashboards read
(`hpcbus.commands.deploy.dashboards.downsampling`). Idempotent: a second run with the same settings executes
nothing but `CREATE DATABASE`. InfluxDB 1.x only (continuous queries are a 1.x feature); InfluxDB settings
as `consume influx` takes them. Exit 2 for a settings error, 1 when InfluxDB refuses or cannot be reached.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

import msgspec

from hpcbus.commands.deploy.dashboards.settings import RETENTION, RetentionSettings, duration_seconds
from hpcbus.influx.settings import INFLUX, InfluxSettings
from hpcbus.options import SettingsError, add_section_arguments, read_section

HELP = "create InfluxDB retention policies and continuous queries for downsampling"
SECTIONS = (INFLUX, RETENTION)

log = logging.getLogger("hpcbus.retention")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_section_arguments(p, INFLUX)
    add_section_arguments(p, RETENTION)
    p.add_argument("--dry-run", action="store_true", help="print the statements instead of executing them")


def settings(args: argparse.Namespace) -> tuple[InfluxSettings, RetentionSettings]:
    influx = read_section(args, INFLUX)
    retention = read_section(args, RETENTION)
    if influx.api != "v1":
        raise SettingsError(
            "--influx-api v2: continuous queries and retention policies are InfluxDB 1.x (`v1`)"
        )
    if duration_seconds(retention.resample_for) < 300:
        raise SettingsError(
            f"resample_for = {retention.resample_for!r}: must cover one 5m bucket (at least 5m)"
        )
    if duration_seconds(retention.resample_every) <= 0:
        raise SettingsError(f"resample_every = {retention.resample_every!r}: must be positive")
    return influx, retention


async def apply(influx_settings: InfluxSettings, retention: RetentionSettings, dry_run: bool) -> None:
    """Print the statements the database lacks and (unless `dry_run`) execute them, in order; QueryError
    when InfluxDB refuses one or cannot be reached (the report's InfluxQL client: one client, one wording)."""
    from hpcbus.commands.deploy.dashboards.boards import measurements
    from hpcbus.commands.deploy.dashboards.downsampling import plan
    from hpcbus.influx.query import Influx

    db, raw_rp = influx_settings.db, influx_settings.rp or "autogen"
    influx = Influx(msgspec.structs.replace(influx_settings, rp=""))  # statements name their policies
    try:
        policies: dict[str, str] = {}
        queries: list[str] = []
        if not dry_run:
            await influx.query(f'CREATE DATABASE "{db}"')
            shown = await influx.query(f'SHOW RETENTION POLICIES ON "{db}"')
            policies = {row["name"]: row["duration"] for s in shown for row in s.rows()}
            shown = await influx.query("SHOW CONTINUOUS QUERIES")
            queries = [row["name"] for s in shown if s.name == db for row in s.rows()]
        for statement in plan(db, raw_rp, measurements(), retention, policies, queries):
            print(statement)
            if not dry_run:
                await influx.query(statement)
    finally:
        await influx.close()


def run(args: argparse.Namespace) -> int:
    from hpcbus.influx.query import QueryError

    influx, retention = settings(args)
    try:
        asyncio.run(apply(influx, retention, args.dry_run))
    except QueryError as exc:
        log.error("%s", exc)
        return 1
    return 0
