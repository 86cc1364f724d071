"""Retention policies and continuous queries: raw data for a while, 5-minute means for a year.

Pure: `plan` turns what the database has (`SHOW RETENTION POLICIES`, `SHOW CONTINUOUS QUERIES`) and the
settings into the InfluxQL statements that bring it to the wanted state, so running the command twice
changes nothing the second time.

- Metric measurements the dashboards read: one continuous query, `mean("value") AS "value"` per 5 minutes
  and series (`GROUP BY time(5m), *` keeps every tag), `INTO "5m".:MEASUREMENT`. The means keep the field
  name, so a dashboard query reads `"$rp"."cpu_load"` whichever policy `$rp` names.
- The per-job measurements (`influxql.PER_JOB`: `process_*`, `job_processes`, tagged with the job id) are
  not downsampled: a year of their series is 12 times the rest of the year's (docs/scaling.md,
  "Cardinality"); the dashboards read them raw.
- `job_summary`: one point per job, copied with `last()` per field into the `5m` policy (the timestamp
  becomes the start of the job end's 5-minute bucket), so the user view covers a year too.

A continuous query cannot be altered, and InfluxDB rewrites its text, so each query's name carries a hash
of what it does (`hpcbus_5m_<what>_<hash>`): a query whose name is wanted stays, other `hpcbus_5m_*`
queries are dropped, missing ones created.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

from hpcbus.commands.deploy.dashboards.boards import DOWNSAMPLED_RP
from hpcbus.commands.deploy.dashboards.influxql import PER_JOB, ident
from hpcbus.commands.deploy.dashboards.settings import RetentionSettings, duration_seconds

INTERVAL = "5m"
"""The bucket of the downsampled series (the `5m` policy's name says it)."""
CQ_PREFIX = "hpcbus_5m_"

JOB_SUMMARY = "job_summary"
JOB_SUMMARY_FIELDS = (
    "state", "start", "end", "elapsed", "nodes", "cores", "gpus", "samples", "cpu_seconds", "cpu_eff",
    "mem_peak", "mem_avg", "mem_requested", "mem_eff", "gpu_util", "gpu_mem_peak", "energy", "read_bytes",
    "write_bytes", "coverage", "flags", "flag_idle_gpu", "flag_mem_overrequested", "flag_cpu_underused",
    "flag_no_samples", "flag_stop_missing",
)  # fmt: skip
"""The fields of a `job_summary` point (issue 11's shared definition)."""


def regex_of(names: Iterable[str]) -> str:
    """`/^(a|b)$/` matching exactly these measurement names (they hold only [a-z0-9_])."""
    return "/^(" + "|".join(sorted(names)) + ")$/"


def selects(db: str, raw_rp: str, measurements: Iterable[str]) -> dict[str, str]:
    """What each continuous query does: name stem -> `SELECT ... INTO ... GROUP BY ...`."""
    metrics = sorted(set(measurements) - {JOB_SUMMARY} - PER_JOB)
    into = f"{ident(db)}.{ident(DOWNSAMPLED_RP)}"
    raw = f"{ident(db)}.{ident(raw_rp)}"
    group = f"GROUP BY time({INTERVAL}), *"
    last = ", ".join(f"last({ident(f)}) AS {ident(f)}" for f in JOB_SUMMARY_FIELDS)
    return {
        "metrics": f'SELECT mean("value") AS "value" INTO {into}.:MEASUREMENT FROM {raw}.{regex_of(metrics)} {group}',
        "job_summary": f"SELECT {last} INTO {into}.{ident(JOB_SUMMARY)} FROM {raw}.{ident(JOB_SUMMARY)} {group}",
    }


def continuous_queries(
    db: str, raw_rp: str, measurements: Iterable[str], s: RetentionSettings
) -> dict[str, str]:
    """Wanted continuous queries: name -> `CREATE CONTINUOUS QUERY` statement."""
    out = {}
    for stem, select in selects(db, raw_rp, measurements).items():
        resample = f"RESAMPLE EVERY {s.resample_every} FOR {s.resample_for}"
        digest = hashlib.blake2b(f"{resample}\n{select}".encode(), digest_size=4).hexdigest()
        name = f"{CQ_PREFIX}{stem}_{digest}"
        out[name] = f"CREATE CONTINUOUS QUERY {ident(name)} ON {ident(db)} {resample} BEGIN {select} END"
    return out


def plan(
    db: str,
    raw_rp: str,
    measurements: Iterable[str],
    s: RetentionSettings,
    policies: Mapping[str, str],
    queries: Iterable[str],
) -> list[str]:
    """Statements that make `db` hold the wanted policies and queries. `policies`: name -> duration as
    SHOW RETENTION POLICIES gives it (`720h0m0s`, `0s` = for ever); `queries`: names of its continuous
    queries."""
    out = [f"CREATE DATABASE {ident(db)}"]
    for name, duration in ((raw_rp, s.raw_duration), (DOWNSAMPLED_RP, s.downsampled_duration)):
        have = policies.get(name)
        shard = shard_duration(duration)
        if have is None:
            out.append(
                f"CREATE RETENTION POLICY {ident(name)} ON {ident(db)} DURATION {duration} REPLICATION 1 SHARD DURATION {shard}"
            )
        elif not _same(have, duration):
            out.append(
                f"ALTER RETENTION POLICY {ident(name)} ON {ident(db)} DURATION {duration} SHARD DURATION {shard}"
            )
    wanted = continuous_queries(db, raw_rp, measurements, s)
    existing = set(queries)
    out += [
        f"DROP CONTINUOUS QUERY {ident(q)} ON {ident(db)}"
        for q in sorted(existing)
        if q.startswith(CQ_PREFIX) and q not in wanted
    ]
    out += [text for name, text in wanted.items() if name not in existing]
    return out


def shard_duration(duration: str) -> str:
    """InfluxDB's own default shard group duration for a policy of `duration` (below 2 days 1h, up to six
    months 1d, else 7d). Given explicitly because ALTER keeps the old one, and a shard longer than the
    policy is refused (`autogen`'s is 7d)."""
    seconds = duration_seconds(duration)
    if seconds < 2 * 86400:
        return "1h"
    return "1d" if seconds <= 182 * 86400 else "7d"


def _same(shown: str, wanted: str) -> bool:
    have = duration_seconds(shown)
    return (have == 0 and wanted == "INF") or have == duration_seconds(wanted)
