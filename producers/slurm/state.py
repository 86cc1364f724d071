"""What has been sent about each job step, so each poll publishes only what is new or changed.

The Sonar spec asks for exactly this ("Every field should be transmitted with the first record for the step
that is sent after the field acquires a value"; "a stateful client can filter the data effectively") while
consumers must still accept redundant records. So:

* Per step (job_id, job_step) the state keeps a 64-bit digest of each field value last sent. A record goes
  out with the fields whose digest is new or different, plus the fields every record carries: the spec's
  first four (`job_id`, `job_step`, `job_name`, `job_state`) and `submit_time`, which the schema requires in
  every SlurmJob (a `Timestamp`, where empty is an error), so a partial record is still a valid one.
* Digests, not values: a big site ends ~100,000 steps a day, and the state must stay small enough to write
  after every poll. Once a step is in a final state and sent, its digests collapse to one digest of the
  whole record; a late change (slurmdbd filling in accounting afterwards) then resends the whole record,
  which is rare and harmless.
* sacct's ElapsedRaw of a running job is not a change (see `TICKING_STATES`).
* A field that goes back to empty cannot be expressed (an omitted field means "unchanged"); its digest is
  dropped, so if the value comes back it is sent again.
* The cc-backend events are flags on the job's own record: start_job sent, stop_job sent.
* Forgetting: a step not listed by Slurm for `forget_after` seconds is dropped (a running or pending job is
  listed on every poll, an ended one only while its end is inside the sacct window).
* On disk: JSON (readable with `jq` when an admin wonders why something was or was not sent), written
  atomically (temp file, fsync, rename). A lost or unreadable file costs only redundant records: everything
  in the first window is sent again, and cc-backend ignores a second start_job of a job it knows.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Any, Final

import msgspec

from hpcbus.schemas.slurm.values import TERMINAL_STATES
from hpcbus.schemas.sonar.types import SlurmJob
from hpcbus.statefile import write_atomically

__all__ = [
    "ALWAYS",
    "START_SENT",
    "STOP_SENT",
    "SlurmState",
    "StateError",
    "StepEntry",
    "digest_of",
]

log = logging.getLogger("hpcbus.slurm")

ALWAYS: Final = ("job_id", "job_step", "job_name", "job_state", "submit_time")
"""Fields in every record: the spec's first four, and submit_time which the schema requires."""

TICKING_STATES: Final = frozenset({"RUNNING"})
"""States in which sacct's ElapsedRaw grows on every poll. It does not count as a change there (it follows
from start_time and the envelope's time), otherwise every running job would be resent on every poll; the
value that goes out with any other change, and the final one, are the real ones."""

START_SENT: Final = 1
STOP_SENT: Final = 2
WHOLE: Final = "*"
"""Key of the one digest a final step keeps."""

VERSION: Final = 1

_FIELDS: Final = tuple(f.name for f in msgspec.structs.fields(SlurmJob))
_DEFAULTS: Final = {f.name: f.default for f in msgspec.structs.fields(SlurmJob)}
_ENCODE: Final = msgspec.json.Encoder().encode
_PACK: Final = msgspec.msgpack.Encoder().encode

SEEN_STEP: Final = 3600
"""Seconds to which a step's `seen` is rounded down in a pair's entries."""


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


class StepEntry(msgspec.Struct, array_like=True, gc=False):
    """One step: when Slurm last listed it, the digests of what was sent, the cc-backend flags."""

    seen: int
    """Epoch seconds of the last poll that listed the step."""
    digests: dict[str, int] = {}
    """Field name -> digest of the value last sent; `{"*": digest}` once the step is final."""
    cc: int = 0
    """`START_SENT` | `STOP_SENT` (job records only)."""


class StateFile(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The file's layout. Steps are keyed `<job_id>.<step>` (`123.` for the job itself)."""

    version: int = VERSION
    cluster: str = ""
    window_end: int = 0
    """Epoch seconds at which the last successful sacct window ended."""
    cluster_digest: int = 0
    cluster_sent: int = 0
    """Epoch seconds of the last published cluster envelope."""
    steps: dict[str, StepEntry] = {}


class StateError(ValueError):
    """The state file belongs to another cluster or another format version."""


class SlurmState:
    """In-memory state; `changes` is the only way records get filtered, `save`/`load` the only I/O."""

    def __init__(self, cluster: str = "") -> None:
        self.cluster = cluster
        self.window_end = 0
        self.cluster_digest = 0
        self.cluster_sent = 0
        self.steps: dict[tuple[int, str], StepEntry] = {}

    def __len__(self) -> int:
        return len(self.steps)

    # --- filtering ---------------------------------------------------------------------------------------

    def changes(self, record: SlurmJob, now: int) -> SlurmJob | None:
        """The part of `record` to publish (None when nothing changed), and remember it as sent."""
        key = (record.job_id, record.job_step)
        entry = self.steps.get(key)
        final = record.job_state in TERMINAL_STATES
        if entry is None:
            entry = self.steps[key] = StepEntry(seen=now)
        else:
            entry.seen = now
        old = entry.digests
        if WHOLE in old:
            whole = _digest(_ENCODE(record))
            if old[WHOLE] == whole:
                return None
            entry.digests = {WHOLE: whole} if final else self._digests(record)
            return record
        digests = self._digests(record)
        send = [name for name, d in digests.items() if old.get(name) != d]
        entry.digests = {WHOLE: _digest(_ENCODE(record))} if final else digests
        if not send:
            return None
        if len(send) == len(digests):
            return record
        wanted = set(send).union(ALWAYS)
        return SlurmJob(**{name: getattr(record, name) for name in _FIELDS if name in wanted})

    @staticmethod
    def _digests(record: SlurmJob) -> dict[str, int]:
        out = {}
        ticking = record.job_state in TICKING_STATES
        for name in _FIELDS:
            value = getattr(record, name)
            if value != _DEFAULTS[name]:
                if ticking and name == "sacct" and value.elapsed_raw:
                    value = msgspec.structs.replace(value, elapsed_raw=0)
                out[name] = _digest(_ENCODE(value))
        return out

    # --- cc-backend flags --------------------------------------------------------------------------------

    def cc(self, job_id: int) -> int:
        entry = self.steps.get((job_id, ""))
        return entry.cc if entry is not None else 0

    def mark(self, job_id: int, flag: int, now: int) -> None:
        entry = self.steps.get((job_id, ""))
        if entry is None:
            entry = self.steps[(job_id, "")] = StepEntry(seen=now)
        entry.cc |= flag

    # --- housekeeping ------------------------------------------------------------------------------------

    def prune(self, now: int, forget_after: float) -> int:
        """Drop steps not listed for `forget_after` seconds; returns how many went."""
        limit = now - forget_after
        stale = [key for key, entry in self.steps.items() if entry.seen < limit]
        for key in stale:
            del self.steps[key]
        return len(stale)

    def to_file(self) -> StateFile:
        return StateFile(
            cluster=self.cluster,
            window_end=self.window_end,
            cluster_digest=self.cluster_digest,
            cluster_sent=self.cluster_sent,
            steps={f"{job}.{step}": entry for (job, step), entry in self.steps.items()},
        )

    @classmethod
    def from_file(cls, data: StateFile) -> SlurmState:
        if data.version != VERSION:
            raise StateError(f"state format version {data.version}, this hpcbus reads {VERSION}")
        state = cls(data.cluster)
        state.window_end = data.window_end
        state.cluster_digest = data.cluster_digest
        state.cluster_sent = data.cluster_sent
        for key, entry in data.steps.items():
            job, _, step = key.partition(".")
            if not job.isdigit():
                raise StateError(f"step key {key!r} is not <job_id>.<step>")
            state.steps[(int(job), step)] = entry
        return state

    # --- as entries of an active/standby pair (`hpcbus.heldsources`) ---------------------------------------

    def entries(self) -> dict[str, bytes]:
        """`meta` (cluster, window, cluster envelope) and one `job.<job_id>` per job (its steps): a poll
        rewrites `meta` and the jobs whose records or flags changed. `seen` goes in at `SEEN_STEP`
        resolution, so a running job's entry is not rewritten at every poll only because it was listed
        again (a standby's `prune` may forget a step that much early: it is sent again if listed again)."""
        meta = StateFile(
            cluster=self.cluster,
            window_end=self.window_end,
            cluster_digest=self.cluster_digest,
            cluster_sent=self.cluster_sent,
        )
        jobs: dict[int, dict[str, StepEntry]] = {}
        for (job, step), entry in self.steps.items():
            seen = entry.seen - entry.seen % SEEN_STEP
            jobs.setdefault(job, {})[step] = StepEntry(seen, entry.digests, entry.cc)
        out = {"meta": _PACK(meta)}
        out.update((f"job.{job}", _PACK(steps)) for job, steps in jobs.items())
        return out

    def restore(self, found: dict[str, bytes]) -> None:
        """Replace this state by what `entries` wrote (nothing: a fresh start, the first window `lookback`
        long); an entry that cannot be read is dropped with a warning (its records are sent again)."""
        self.window_end = self.cluster_digest = self.cluster_sent = 0
        self.steps = {}
        for key, value in found.items():
            try:
                if key == "meta":
                    meta = msgspec.msgpack.decode(value, type=StateFile)
                    self.window_end = meta.window_end
                    self.cluster_digest = meta.cluster_digest
                    self.cluster_sent = meta.cluster_sent
                elif key.startswith("job."):
                    job = int(key[4:])
                    for step, entry in msgspec.msgpack.decode(value, type=dict[str, StepEntry]).items():
                        self.steps[(job, step)] = entry
            except (ValueError, msgspec.DecodeError, msgspec.ValidationError) as exc:
                log.warning("state entry %s unusable (%s); its records may be sent again", key, exc)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write atomically: a crash leaves the old file or the new one, never a torn one."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(target, msgspec.json.encode(self.to_file()) + b"\n")

    @classmethod
    def load(cls, path: str | os.PathLike[str], cluster: str) -> SlurmState:
        """The saved state, or an empty one (with a warning saying why) when the file is missing, unreadable
        or for another cluster: losing it costs redundant records, refusing to start would cost data."""
        target = Path(path)
        try:
            raw = target.read_bytes()
        except FileNotFoundError:
            log.info("state %s does not exist yet; starting empty", target)
            return cls(cluster)
        except OSError as exc:
            log.warning("state %s unreadable (%s); starting empty, records may be sent again", target, exc)
            return cls(cluster)
        try:
            state = cls.from_file(msgspec.json.decode(raw, type=StateFile))
        except (msgspec.DecodeError, msgspec.ValidationError, StateError) as exc:
            log.warning("state %s unusable (%s); starting empty, records may be sent again", target, exc)
            return cls(cluster)
        if state.cluster and cluster and state.cluster != cluster:
            log.warning("state %s is for cluster %s, not %s; starting empty", target, state.cluster, cluster)
            return cls(cluster)
        state.cluster = cluster or state.cluster
        return state


def digest_of(value: Any) -> int:
    """The digest `SlurmState` keeps for a value (also used for the cluster envelope)."""
    return _digest(_ENCODE(value))
