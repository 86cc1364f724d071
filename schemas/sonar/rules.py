"""The spec's rules that no field type can express, as small pure functions.

Both checkers use them: `schemas.sonar.validate` on decoded structs (the fast path) and
`schemas.sonar.diagnose` on plain JSON values (the path that lists every problem of a rejected envelope), so
a rule and its wording exist once. Each function returns the reason as text, or None when the value is fine.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from hpcbus.schemas.lineprotocol.timestamps import window_problem
from hpcbus.schemas.names import JOB_NAME_MAX, safe_text
from hpcbus.schemas.noderange import MAX_HOSTS, expand, is_placeholder, is_valid
from hpcbus.schemas.sonar.types import TIMESTAMP_PATTERN

TIMESTAMP = re.compile(TIMESTAMP_PATTERN)
"""Compiled once; `TIMESTAMP.search(text)` is the whole Timestamp check (see `types.TIMESTAMP_PATTERN`)."""

# The shapes sinfo and Sonar actually write (`c1-29`, `gpu-[1-2,4-5,7-9]`), recognised without the general
# parser, which costs ~15 us per bracketed range and made cluster envelopes 20x slower to validate than to
# decode. Only a *sufficient* condition: anything else goes to `schemas.noderange`. Labels as `schemas.names`
# has them: none empty, none starting with `-`.
_PLAIN_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*(?:\.[A-Za-z0-9_][A-Za-z0-9_-]*)*")
_ONE_BRACKET = re.compile(
    r"((?:[A-Za-z0-9_][A-Za-z0-9_-]*\.)*[A-Za-z0-9_][A-Za-z0-9_-]*\.?)"
    r"\[([0-9]+(?:-[0-9]+)?(?:,[0-9]+(?:-[0-9]+)?)*)\]"
    r"([A-Za-z0-9_-]*(?:\.[A-Za-z0-9_][A-Za-z0-9_-]*)*)"
)

SUPPORTED_FORMAT = 0
"""The data format version the spec describes. It changes only when "semantics of existing fields change in
some incompatible way", so data of any other version cannot be read correctly by this decoder."""


def exclusive(has_data: bool, has_errors: bool) -> tuple[str, str] | None:
    """`(path, reason)` unless exactly one of `data` and `errors` is present ("exclusive of each other")."""
    if has_data and has_errors:
        return "errors", "`data` and `errors` are exclusive: an envelope carries one or the other"
    if not has_data and not has_errors:
        return "", "envelope has neither `data` nor `errors` (exactly one is required)"
    return None


def data_format(version: int) -> str | None:
    """Reason to reject `meta.format`: none. The spec's version 0 is what this code implements, but Sonar's own
    reader accepts any version (its fixture carries 37), so other versions are read as version 0."""
    return None


def job_epoch(job: int, epoch: int) -> str | None:
    """The spec: "If epoch is 0 then job is never 0" (a Slurm job has a real job ID, others an epoch)."""
    if job == 0 and epoch == 0:
        return "job 0 with epoch 0: a Slurm job (epoch 0) must have a non-zero job ID"
    return None


def timestamp(text: str, optional: bool = False) -> str | None:
    """Reason why `text` is not a Timestamp (an OptionalTimestamp may also be empty)."""
    if TIMESTAMP.search(text) is not None or (optional and text == ""):
        return None
    if text == "":
        return "must not be empty (Timestamp)"
    want = "yyyy-mm-ddThh:mm:ss+hh:mm or ...Z (RFC 3339, whole seconds, a date that exists)"
    return f"not a valid Timestamp: {text!r}; want {want}" + (" or empty" if optional else "")


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)


def epoch_seconds(text: str) -> int:
    """The epoch seconds of a valid Timestamp (`TIMESTAMP`), also of year 0001 or 9999 (where `datetime`'s
    own `timestamp()` may overflow)."""
    return (datetime.fromisoformat(text) - _EPOCH) // _SECOND


def time_window(text: str, latest: int) -> str | None:
    """Reason why the valid Timestamp `text` lies outside the window line protocol has
    (`lineprotocol.timestamps`: from 2000-01-01 to `latest`, the reader's now + max_future), None inside.
    Why: a sample dated 0001 or 9999 would be filed in the Sonar tree and in InfluxDB under that year, and
    translated into a line protocol timestamp every reader refuses."""
    reason = window_problem(epoch_seconds(text), latest)
    return None if reason is None else f"{text!r} is {reason}"


def node_range(text: str) -> str | None:
    """Reason why `text` is not a valid NodeRange, in `schemas.noderange`'s words (it names the bad part).

    `is_valid` first: it checks the syntax without building the list of names (`n[1-1000000]` is valid and
    would otherwise be expanded just to be thrown away); `expand` only runs to explain a failure.
    """
    if _plainly_valid(text) or is_valid(text):
        return None
    try:
        expand(text)
    except ValueError as exc:
        return str(exc)
    return None  # pragma: no cover - is_valid and expand agree


def job_nodes(text: str) -> str | None:
    """Reason why `text` is not an entry of `slurm_jobs[].nodes`: a NodeRange (Sonar's HostnameRange: bracket
    groups of numbers and ranges that multiply out, first <= second, no number repeated; Sonar 0.19 sends
    `c1-[5-6,8-9],gpu-[10-12]`), or Slurm's placeholder `None assigned` of a job without nodes. Checked here
    so that a record with `c[3-1]` is refused (alone) with the reason rather than translated without its hosts."""
    if is_placeholder(text):
        return None
    return node_range(text)


def safe_job_name(text: str) -> str:
    """`text` as a job name that is safe to show (`schemas.names.safe_text`: control characters become
    spaces, at most 1024 characters). Never a reason to refuse: the name is any user's `sbatch -J`, and a
    refusal would cost the whole poll of jobs around it."""
    return safe_text(text, JOB_NAME_MAX)


def _plainly_valid(text: str) -> bool:
    """True for a host name, or one bracket group of strictly ascending numbers and ranges (so no number is
    repeated and no range is reversed) after a non-empty prefix; False means "ask `schemas.noderange`"."""
    if _PLAIN_HOST.fullmatch(text):
        return True
    match = _ONE_BRACKET.fullmatch(text)
    if match is None:
        return False
    last, total = -1, 0
    for part in match[2].split(","):
        low, _, high = part.partition("-")
        first = int(low)
        end = int(high) if high else first
        if first <= last or end < first:
            return False
        last = end
        total += end - first + 1
    return total <= MAX_HOSTS
