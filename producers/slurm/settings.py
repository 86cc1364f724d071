"""Options of `hpcbus produce slurm` (flags > `[slurm]` table of `--config` > defaults)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from hpcbus.keys import LEASE_TTL, STATE_MOVED, LeaseTtl
from hpcbus.options import Section
from hpcbus.outbox import outbox_section
from hpcbus.schemas.slurm.sacct import SACCT_STATES
from hpcbus.schemas.slurm.values import TERMINAL_STATES
from hpcbus.settings import STREAM_METAVARS, PublisherSettings

DEFAULT_STATES: tuple[str, ...] = (
    *SACCT_STATES,
    *sorted(TERMINAL_STATES.difference(SACCT_STATES)),
    "PENDING",
    "RUNNING",
    "SUSPENDED",
    "REQUEUED",
)
"""Sonar's `-s` list plus the end states Sonar does not ask for (BOOT_FAIL, NODE_FAIL, PREEMPTED, REVOKED:
without them such a job would never get its stop_job) and SUSPENDED/REQUEUED, so a job is followed through
every state."""


class SlurmSettings(PublisherSettings, kw_only=True, forbid_unknown_fields=True):
    """How often and how far back to ask Slurm, where to remember what was sent, and how nodes are named
    (`hostname_form`, `hostname_domain`: those of `produce node` and `consume sonar`, applied to every node
    name published: job records' `nodes`, start_job `resources`, the cluster envelope, node states). The
    backlog while NATS is away is `[slurm_outbox]` (`SLURM_OUTBOX`)."""

    interval: Annotated[float, msgspec.Meta(gt=0.0)] = 60.0
    """Seconds between polls. A minute keeps cc-backend's list of running jobs current while costing
    slurmdbd one query per minute (the window is short, so the query is cheap)."""
    overlap: Annotated[float, msgspec.Meta(ge=0.0)] = 300.0
    """Seconds each sacct window reaches back before the end of the previous one. slurmctld hands job
    records to slurmdbd asynchronously (minutes behind under load), so a job that ended just before the
    last poll may reach the database only after it; the state makes the re-read rows cost nothing."""
    lookback: float = 3600.0
    """Seconds the first window reaches back when there is no state file (a fresh install, or the file
    was lost): jobs that ended earlier are not published."""
    state: Literal["file", "jetstream"] = "file"
    """Where what was sent is kept. `file`: `state_file` on this host (one producer per cluster). `jetstream`:
    entries of the cluster's roles bucket (`HPCBUS_ROLES_<cluster>`, replicated like the streams) that only
    the holder of the cluster's `slurm` lease may write: run a second producer on the other master; one
    polls, the other stands by and takes over within `lease_ttl` plus a few seconds (docs/deploy.md, "Two
    masters"). Before this setting, `state` was the file's path: that is `state_file` now."""
    lease_ttl: LeaseTtl = LEASE_TTL
    state_file: str = ""
    """State file (JSON, `state = "file"`): the fields sent per job step, the end of the last sacct window,
    the last cluster envelope. "" keeps it in memory only, so a restart resends everything in `lookback`."""
    tz: str = ""
    """Time zone of the Slurm commands' times: an IANA name (`Europe/Oslo`), `UTC`, or `+hh:mm`.
    The commands are run with `TZ` set to it, so their output and our parsing agree by construction.
    "" = this process's own zone (`TZ`, else /etc/localtime), which the commands use anyway."""
    timeout: Annotated[float, msgspec.Meta(gt=0.0)] = 120.0
    """Seconds a Slurm command may take before it is killed and the poll goes on without it."""
    states: list[str] = msgspec.field(default_factory=lambda: list(DEFAULT_STATES))
    """Job states passed to `sacct -s` (with `-S`/`-E`: jobs that were in one of them in the window)."""
    use_squeue: bool = True
    """Also run `squeue --json` and publish the pending/running jobs sacct did not list: held jobs (never
    eligible, so outside every sacct window) and, while slurmdbd is down, every queued job."""
    cluster_every: float = 3600.0
    """Seconds after which an unchanged cluster envelope is published again, so a consumer that started
    late learns the partitions within this time."""
    forget_after: float = 2 * 86400.0
    """Seconds after a step was last listed by Slurm before it is dropped from the state. Ended jobs leave
    the sacct window after `overlap`; the margin covers a slurmdbd that was down for a while."""


SLURM = Section(
    "slurm",
    SlurmSettings,
    hints={"state": STATE_MOVED},
    metavars={
        "interval": "S",
        "overlap": "S",
        "lookback": "S",
        "state_file": "FILE",
        "tz": "ZONE",
        "timeout": "S",
        "states": "STATE,STATE",
        "cluster_every": "S",
        "forget_after": "S",
        **STREAM_METAVARS,
    },
)
SLURM_OUTBOX = outbox_section("slurm_outbox")
"""The outbox's keys (`hpcbus.outbox.OutboxSettings`); before they were declared again in `[slurm]`
(`spill_dir`, `max_messages`), where they now stop the command with the table they belong in."""
