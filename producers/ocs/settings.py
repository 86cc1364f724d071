"""Options of `hpcbus produce ocs` (flags > `[ocs]` table of `--config` > defaults)."""

from __future__ import annotations

from typing import Literal

from hpcbus.keys import LEASE_TTL, STATE_MOVED, STATS_SECONDS, LeaseTtl, StatsSeconds
from hpcbus.options import Section
from hpcbus.settings import STREAM_METAVARS, PublisherSettings


class OcsSettings(PublisherSettings, kw_only=True, forbid_unknown_fields=True):
    """`[ocs]` table of the `--config` file; the flags of the same name override it. `hostname_form` and
    `hostname_domain` are those of `produce node` and `consume sonar`, applied to every node name published
    (job records' `nodes`, start_job `resources`, the `hostname` of problem log lines)."""

    accounting: str = ""
    """The accounting file to follow (required): `accounting.jsonl` (OCS >= 9.0) or the colon-format
    `accounting`."""
    state: Literal["file", "jetstream"] = "file"
    """Where the offset is kept. `file`: `state_file` on this host (one producer per cluster). `jetstream`:
    entries of the cluster's roles bucket that only the holder of the cluster's `ocs` lease may write: run a
    second producer on the other master, reading the same accounting file (a shared file system); one
    follows the file, the other stands by and takes over within `lease_ttl` plus a few seconds
    (docs/deploy.md, "Two masters"). Before this setting, `state` was the file's path: that is `state_file`
    now."""
    lease_ttl: LeaseTtl = LEASE_TTL
    state_file: str = ""
    """State file keeping the acknowledged offset across restarts (`state = "file"`; "" = none: a restart
    reads it all again)."""
    interval: float = 10.0
    """Seconds between polls of the file."""
    from_end: bool = False
    """Without a saved state, start at the current end of the file instead of publishing its history."""
    start_jobs: bool = True
    """Send cc-backend a start_job right before each stop_job, in the same message (start first). On by
    default: the accounting file only has finished jobs, cc-backend rejects a stop_job for a job it never
    saw start, and this producer is cc-backend's authority for Grid Engine jobs (every host of the job in
    `resources`). Off only where something else already gives cc-backend these jobs' starts with the same
    start time; node producers must not (their `cc_job_events` stays false)."""
    max_chunk_bytes: int = 4 << 20
    """Bytes read per chunk (one jobs envelope per chunk)."""
    max_inflight: int = 8
    """Chunks published but not yet acknowledged before reading pauses."""
    max_jobs: int = 4096
    """Jobs whose records are remembered for merging with later records (PE tasks, running, requeued)."""
    stats_seconds: StatsSeconds = STATS_SECONDS


OCS = Section(
    "ocs",
    OcsSettings,
    files=("accounting",),
    hints={"state": STATE_MOVED},
    metavars={
        "accounting": "FILE",
        "state_file": "FILE",
        "interval": "S",
        "max_chunk_bytes": "BYTES",
        "stats_seconds": "S",
        **STREAM_METAVARS,
    },
)
