"""Parsers for the value syntaxes `sacct` prints, one function per syntax.

sacct's text is the only interface to slurmdbd that works without slurmrestd, and each column has its own
little language (`1-04:33:44`, `14:50.006`, `0.01M`, `4000Mc`, `CANCELLED by 2101037`, `123_[1-5%2]`, ...).
Keeping one strict parser per syntax here lets the row parser (`sacct.py`), the event builders and the tests
share them, and lets a caller turn the `ValueError` of any of them into a `Problem` that names the column.

Conventions, shared by every parser below:
- The empty string is never accepted: an empty column means "not reported for this row" (a step has no
  `User`, a job has no `AveRSS`), and deciding that is the row parser's job, not the value parser's.
- `Unknown` and `None` are the two ways sacct spells "no value" inside a column that normally has one.
  `Unknown` is slurmdbd's 0 (the End of a running job, the Start of a pending one); `None` is "never set"
  (the Start of a job cancelled while pending). Both map to `None` for timestamps; see each parser.
- Errors name the syntax that was expected, so `str(error)` alone tells an operator what went wrong.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Final, Literal

import msgspec

# --- ExtendedUint (Sonar's encoding of "unset" and "infinite" inside an unsigned field) -------------------

EXT_UNSET: Final = 0
"""ExtendedUint for "no value"; also what a consumer sees when the field is omitted."""
EXT_INFINITE: Final = 1
"""ExtendedUint for "no limit" (`UNLIMITED`)."""
EXT_BASE: Final = 2
"""Offset added to every real value, so 0 and 1 stay free for the two specials."""

UNLIMITED: Final = "UNLIMITED"
"""The value of a limit that Slurm prints as `UNLIMITED` (e.g. TimelimitRaw)."""

Limit = int | Literal["UNLIMITED"] | None
"""A limit as sacct knows it: a number, `UNLIMITED`, or None when it falls back to the partition's limit."""


def to_extended_uint(value: Limit) -> int:
    """Encode `value` as Sonar's ExtendedUint: None -> 0, `UNLIMITED` -> 1, v -> v + 2."""
    if value is None:
        return EXT_UNSET
    if value == UNLIMITED:
        return EXT_INFINITE
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"ExtendedUint encodes unsigned integers, None or UNLIMITED, not {value!r}")
    return value + EXT_BASE


def from_extended_uint(encoded: int) -> Limit:
    """Decode an ExtendedUint: 0 -> None, 1 -> `UNLIMITED`, v -> v - 2."""
    if encoded < 0:
        raise ValueError(f"ExtendedUint must not be negative, got {encoded}")
    if encoded == EXT_UNSET:
        return None
    if encoded == EXT_INFINITE:
        return UNLIMITED
    return encoded - EXT_BASE


# --- durations ----------------------------------------------------------------------------------------------

# Slurm prints CPU times as `D-HH:MM:SS`, `HH:MM:SS` or (under an hour) `MM:SS.mmm`, and wall times as
# `[D-]HH:MM:SS`. `D-HH:MM` (which time_str2secs would also accept) is refused: sacct never prints it and it
# is ambiguous with `HH:MM:SS` minus a field.
_DURATION: Final = re.compile(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.(\d+))?", re.ASCII)


def parse_duration(text: str) -> int | float:
    """Seconds in a sacct duration: an `int` when sacct printed whole seconds, a `float` when it printed a
    fraction (`MM:SS.mmm`).

    The type carries information on purpose: Sonar loses the whole seconds of exactly the values printed
    with a fraction (`parse_duration_sonar`), and keeping the distinction here means a row is parsed once
    and can still be rendered either way.
    """
    m = _DURATION.fullmatch(text)
    if m is None:
        raise ValueError(f"duration {text!r} is not [D-]HH:MM:SS, HH:MM:SS, MM:SS or MM:SS.mmm")
    days, hours, minutes, seconds, fraction = m.groups()
    if days is not None and hours is None:
        raise ValueError(f"duration {text!r} has days but no HH:MM:SS")
    s = int(seconds)
    mi = int(minutes)
    h = int(hours) if hours is not None else 0
    if s >= 60 or (hours is not None and mi >= 60) or (days is not None and h >= 24):
        raise ValueError(f"duration {text!r} has a field out of range")
    total = ((int(days) * 24 if days is not None else 0) + h) * 3600 + mi * 60 + s
    if fraction is None:
        return total
    try:
        return total + int(fraction) / 10 ** len(fraction)
    except OverflowError:  # hundreds of digits: no float holds it
        raise ValueError(f"duration {text!r} is too large") from None


def parse_duration_sonar(text: str) -> int:
    """Seconds as Sonar computes them: like `parse_duration`, but a seconds part with a fraction counts 0.

    Sonar parses the seconds field as an integer and uses 0 when that fails, so `14:50.006` -> 840 and
    `45:21.005` -> 2700 (see corpus/slurm/PROVENANCE.md). Only for reproducing Sonar's output exactly.
    """
    return sonar_seconds(parse_duration(text))


def sonar_seconds(value: int | float) -> int:
    """A `parse_duration` result as Sonar would have computed it from the text (see `parse_duration_sonar`)."""
    return int(value) // 60 * 60 if isinstance(value, float) else value


def whole_seconds(value: int | float) -> int:
    """A `parse_duration` result as whole seconds, rounded to the nearest (sacct prints milliseconds)."""
    return value if isinstance(value, int) else int(value + 0.5)


# --- sizes ------------------------------------------------------------------------------------------------

_SCALE: Final = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
_SIZE: Final = re.compile(r"(\d+(?:\.\d+)?)([KMGTP]?)", re.ASCII)
_REQMEM: Final = re.compile(r"(\d+(?:\.\d+)?)([KMGTP]?)([nc]?)", re.ASCII)


def _kib(number: str, suffix: str) -> int:
    scale = _SCALE[suffix]
    if "." in number:
        kib = float(number) * scale / 1024
        if not math.isfinite(kib):  # hundreds of digits: math.ceil would raise OverflowError, not ValueError
            raise ValueError(f"size {number}{suffix} is too large")
        return math.ceil(kib)
    return -(-int(number) * scale // 1024)


def parse_size_kib(text: str) -> int:
    """KiB in a sacct size (`1294440K`, `0.01M`, `891.26M`, `0`; a bare number is bytes).

    Rounded up with Sonar's rule `ceil(value * scale / 1024)`, so `0.01M` -> 11: sacct has already rounded
    the value to two decimals, so no rule recovers the exact byte count, and this one matches Sonar.
    """
    m = _SIZE.fullmatch(text)
    if m is None:
        raise ValueError(f"size {text!r} is not a number with an optional K/M/G/T/P suffix")
    return _kib(m[1], m[2])


def parse_reqmem(text: str) -> tuple[int, bool]:
    """(KiB, per_cpu) in a ReqMem value: `4G`, `32000M`, old `4000Mn` (per node), `4000Mc` (per CPU).

    Slurm >= 21.08 prints no suffix and the value is the job's requested `mem` TRES (so the total over all
    nodes: corpus row 1956908 has ReqMem=384G with 2 nodes and AllocTRES mem=384G). Older data still has
    the suffixes, and a per-CPU value is no per-node amount, so the flag is returned rather than folded.
    """
    m = _REQMEM.fullmatch(text)
    if m is None:
        raise ValueError(f"ReqMem {text!r} is not a size with an optional n (per node) or c (per CPU) suffix")
    return _kib(m[1], m[2]), m[3] == "c"


# --- timestamps -------------------------------------------------------------------------------------------


def parse_timestamp(text: str, tz: tzinfo) -> datetime | None:
    """An aware datetime for a sacct `%FT%T` time, read as local time in `tz`; None for `Unknown`/`None`.

    sacct prints local time without an offset, so the caller must say which zone slurmdbd's host used
    (`tz`); with a zone that has DST the offset is the one in force at that instant (in the hour a DST
    change repeats, the earlier one: the text cannot tell). For many values use `timestamp_parser(tz)`,
    which does the per-zone work once.
    """
    return timestamp_parser(tz)(text)


def timestamp_parser(tz: tzinfo) -> Callable[[str], datetime | None]:
    """`parse_timestamp` with `tz` bound, fast for fixed offsets (`datetime.timezone`, e.g. TZ=CET-2).

    Why: attaching a zone with `datetime.replace` costs several times more than parsing; for a fixed offset
    the offset text is appended instead and C's `fromisoformat` does all the work.
    """
    suffix = ""
    if isinstance(tz, timezone):
        offset = tz.utcoffset(None)
        if not offset.microseconds and not offset.seconds % 60:
            minutes = offset // timedelta(minutes=1)
            sign = "-" if minutes < 0 else "+"
            suffix = f"{sign}{abs(minutes) // 60:02}:{abs(minutes) % 60:02}"

    def parse(text: str) -> datetime | None:
        if text == "Unknown" or text == "None":
            return None
        if len(text) != 19 or text[10] != "T":
            raise ValueError(f"timestamp {text!r} is not YYYY-MM-DDTHH:MM:SS")
        try:
            if suffix:
                return datetime.fromisoformat(text + suffix)
            return datetime.fromisoformat(text).replace(tzinfo=tz)
        except ValueError:
            raise ValueError(f"timestamp {text!r} is not a valid YYYY-MM-DDTHH:MM:SS") from None

    return parse


def epoch_seconds(when: datetime | None) -> int:
    """Unix seconds of an aware datetime; 0 for None (slurmdbd's own spelling of "no time")."""
    return 0 if when is None else int(when.timestamp())


def format_timestamp(when: datetime) -> str:
    """Sonar's timestamp form: `YYYY-MM-DDTHH:MM:SS+hh:mm` (never `Z`, no fraction)."""
    if when.tzinfo is None:
        raise ValueError("a Sonar timestamp needs an aware datetime")
    return when.replace(microsecond=0).isoformat()


# --- states and exit codes ----------------------------------------------------------------------------------

TERMINAL_STATES: Final = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "TIMEOUT",
    }
)
"""Slurm's end states: after one of them a job (or step) never runs again and changes no more, apart from
late accounting. The base states Slurm's `IS_JOB_FINISHED` counts (everything above SUSPENDED in
`enum job_states`: COMPLETE, CANCELLED, FAILED, TIMEOUT, NODE_FAIL, PREEMPTED, BOOT_FAIL, DEADLINE, OOM, in
sacct's spelling), plus REVOKED, which sacct shows for a federation sibling removed because another cluster
runs the job. Not in it: REQUEUED, RESIZING and SPECIAL_EXIT (the job comes back, held or pending), and
PENDING, RUNNING, SUSPENDED. The one list for the Slurm producer's state, cc-backend's stop_job
(`schemas.ccbackend.cc_job_state`) and the local Slurm service's waits."""

_STATE: Final = re.compile(r"([A-Z][A-Z_]*)(?: by (\d+))?", re.ASCII)


def parse_state(text: str) -> tuple[str, int | None]:
    """(STATE, uid) from a sacct State: `CANCELLED by 2101037` -> ("CANCELLED", 2101037), `RUNNING` -> (.., None).

    The uid is kept apart because the spec's `job_state` is the bare word, while who cancelled is still
    worth keeping for accounting.
    """
    m = _STATE.fullmatch(text)
    if m is None:
        raise ValueError(f"State {text!r} is not an upper-case state word optionally followed by 'by <uid>'")
    uid = m[2]
    return m[1], int(uid) if uid is not None else None


_EXIT: Final = re.compile(r"(\d+):(\d+)", re.ASCII)


def parse_exit_code(text: str) -> tuple[int, int]:
    """(status, signal) from an ExitCode `status:signal` (`1:0`, `0:15`)."""
    m = _EXIT.fullmatch(text)
    if m is None:
        raise ValueError(f"ExitCode {text!r} is not status:signal")
    return int(m[1]), int(m[2])


# --- limits -----------------------------------------------------------------------------------------------


def parse_timelimit_raw(text: str) -> Limit:
    """Minutes in a TimelimitRaw: digits, `UNLIMITED`, or `Partition_Limit` (-> None: the partition decides)."""
    if text.isascii() and text.isdigit():
        return int(text)
    if text == UNLIMITED:
        return UNLIMITED
    if text == "Partition_Limit":
        return None
    raise ValueError(f"TimelimitRaw {text!r} is not minutes, UNLIMITED or Partition_Limit")


def parse_timelimit(text: str) -> Limit:
    """Minutes in a formatted Timelimit (`19:50:00`, `1-05:50:00`, `UNLIMITED`, `Partition_Limit`)."""
    if text == UNLIMITED:
        return UNLIMITED
    if text == "Partition_Limit":
        return None
    try:
        seconds = parse_duration(text)
    except ValueError:
        raise ValueError(f"Timelimit {text!r} is not [D-]HH:MM:SS, UNLIMITED or Partition_Limit") from None
    return int(seconds) // 60


# --- job ids ------------------------------------------------------------------------------------------------


class JobId(msgspec.Struct, frozen=True, gc=False):
    """A parsed sacct JobID: `A`, `A_T` (array task), `A_[1-5%2]` (pending array), `H+O` (het component),
    each optionally followed by `.step` (`batch`, `extern`, `interactive`, `0`, ...).

    The leading number is the *displayed* id: for an array task it is the array's id, not the task's own
    job id (that one is only in JobIDRaw, see the spec's "Slurm Job ID structure").
    """

    base: int
    """The number before `_`/`+`/`.`: plain job id, array job id, or het job leader id."""
    step: str = ""
    """Step name after the `.`; empty for the job (allocation) record itself."""
    array_task_id: int | None = None
    """T of `A_T`."""
    array_tasks: str = ""
    """The task expression of a pending array, `1-5%2` for `A_[1-5%2]`."""
    het_offset: int | None = None
    """O of `H+O`."""

    @property
    def is_array(self) -> bool:
        return self.array_task_id is not None or self.array_tasks != ""

    @property
    def is_het(self) -> bool:
        return self.het_offset is not None


_STEP: Final = r"(?:\.([0-9A-Za-z_+]+))?"
_JOBID: Final = re.compile(r"(\d+)(?:_(\d+)|_\[([^\[\]]+)\]|\+(\d+))?" + _STEP, re.ASCII)
_JOBIDRAW: Final = re.compile(r"(\d+)" + _STEP, re.ASCII)


def parse_job_id(text: str) -> JobId:
    """Parse a sacct JobID (see `JobId`)."""
    m = _JOBID.fullmatch(text)
    if m is None:
        raise ValueError(f"JobID {text!r} is not N, N_T, N_[tasks] or N+O, optionally followed by .step")
    base, task, tasks, offset, step = m.groups()
    return JobId(
        int(base),
        step or "",
        int(task) if task is not None else None,
        tasks or "",
        int(offset) if offset is not None else None,
    )


def parse_job_id_raw(text: str) -> tuple[int, str]:
    """(job id, step) from a JobIDRaw `N` or `N.step`: the job's own id, also for array tasks and het parts."""
    m = _JOBIDRAW.fullmatch(text)
    if m is None:
        raise ValueError(f"JobIDRaw {text!r} is not N or N.step")
    return int(m[1]), m[2] or ""


# --- node lists and TRES ------------------------------------------------------------------------------------

_NODE_ELEMENT: Final = re.compile(r"(?:[^\[\],]+|\[\d+(?:-\d+)?(?:,\d+(?:-\d+)?)*\])+", re.ASCII)


def split_nodelist(text: str) -> list[str]:
    """Split a Slurm hostlist at its top-level commas without expanding it: `c1-[9-10],gpu-1` ->
    [`c1-[9-10]`, `gpu-1`].

    This is what Sonar puts in `nodes` (each element a NodeRange), and it is cheap: expanding a 1000-node
    allocation per row would dominate the parse. Brackets are checked for the range syntax, so a mangled
    list is refused here rather than downstream. Use `schemas.noderange.expand` for host names.
    """
    if "[" not in text:
        parts = text.split(",")
        if "" in parts or "]" in text:
            raise ValueError(f"node list {text!r} has an empty element or a stray ']'")
        return parts
    out = []
    pos = 0
    end = len(text)
    while True:
        m = _NODE_ELEMENT.match(text, pos)
        if m is None:
            raise ValueError(f"node list {text!r} is malformed at offset {pos}")
        out.append(m.group())
        pos = m.end()
        if pos == end:
            return out
        if text[pos] != ",":
            raise ValueError(f"node list {text!r} is malformed at offset {pos}")
        pos += 1


def parse_tres(text: str) -> dict[str, str]:
    """A TRES string (`billing=32,cpu=32,gres/gpu:a100=1,mem=128G,node=1`) as {name: value}."""
    out: dict[str, str] = {}
    if not text:
        return out
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"TRES {text!r} has an item {item!r} that is not name=value")
        out[name] = value
    return out
