"""Small pieces both directions share: timestamps, series keys, tag values, the result type.

Kept in one place because the two directions must agree exactly: a key computed differently on the way back
would put a value into the wrong process.
"""

from __future__ import annotations

import importlib.metadata
import re
import time
from collections.abc import Callable, Iterable
from datetime import datetime

import msgspec

from hpcbus.schemas.names import CONTROL_CHARACTERS, DEVICE_ID_MAX, TAG_VALUE_MAX, device_id_problem
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.sonar.types import (
    ClusterEnvelope,
    ErrorsEnvelope,
    JobsEnvelope,
    KVPair,
    Metadata,
    SampleEnvelope,
    SysinfoEnvelope,
)


def _installed_version() -> str:
    try:
        return importlib.metadata.version("hpcbus")
    except importlib.metadata.PackageNotFoundError:  # a source tree on PYTHONPATH, not installed
        return "0+unknown"


PRODUCER = "hpcbus"
"""`meta.producer` of envelopes the translator builds itself (from ClusterCockpit data)."""
VERSION = _installed_version()
"""`meta.version`: hpcbus' version, from the installed distribution's metadata (schemas imports nothing from
the `hpcbus` package, which holds the same number as `hpcbus.__version__`)."""

Envelope = SampleEnvelope | SysinfoEnvelope | JobsEnvelope | ClusterEnvelope | ErrorsEnvelope


class Assembled(msgspec.Struct, kw_only=True):
    """One envelope rebuilt from line protocol, and how much of it arrived."""

    kind: str
    """`sample`, `sysinfo`, `job` or `cluster` (the `<cluster>.sonar.<kind>` subject word)."""
    envelope: Envelope
    complete: bool = True
    """The skeleton/envelope event arrived and so did every line it announced. False: a partial envelope
    (flushed by the grace window or the memory bound, or built from ClusterCockpit data without one)."""
    followup: bool = False
    """An envelope for the same (cluster, host, time) was emitted before: this one carries late lines."""
    problems: list[Problem] = []
    """Lines that could not be placed, values out of range, ...; the envelope holds everything else."""


def own_meta(source: str = "line-protocol") -> Metadata:
    """`meta` of an envelope built by the translator rather than carried through from Sonar."""
    return Metadata(producer=PRODUCER, version=VERSION, attrs=[KVPair(key="translated-from", value=source)])


def epoch_of(timestamp: str) -> int:
    """Epoch seconds of a Sonar timestamp (`2026-01-28T09:22:48+01:00`; `Z` accepted)."""
    return int(datetime.fromisoformat(timestamp).timestamp())


def utc_timestamp(seconds: int) -> str:
    """Sonar timestamp (`+00:00`, Sonar never writes `Z`) of epoch seconds."""
    return time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(seconds))


def job_key(job: int, epoch: int) -> str:
    """`<job>` for Slurm jobs (epoch 0), `<job>@<epoch>` otherwise: Sonar's (job, epoch) identity as one tag."""
    return str(job) if not epoch else f"{job}@{epoch}"


_UNSAFE = re.compile(f"[{CONTROL_CHARACTERS}\\\\]")


def _replace(m: re.Match[str]) -> str:
    return "/" if m.group() == "\\" else " "


def tag_value(text: str) -> str:
    """`text` as a tag value that reads back exactly and that every entry accepts (`schemas.names`): line
    protocol cannot carry a newline in a tag (escaping only covers `,= `), C parsers stop at NUL, a backslash
    is read differently by InfluxDB and line_protocol_parser (or cannot be written at all, at the end), and
    control characters (an escape sequence in a process name) are refused as tag values. So control
    characters become spaces, `\\` becomes `/`, and the text is cut to `TAG_VALUE_MAX` characters. Only used
    for informative tags (user, cmd) and series keys; the skeleton keeps the original."""
    if _UNSAFE.search(text) is None and len(text) <= TAG_VALUE_MAX:
        return text
    return _UNSAFE.sub(_replace, text)[:TAG_VALUE_MAX]


DEVICE_KEY_MAX = DEVICE_ID_MAX - 8
"""Longest `device_key`: room for a repeat's `#n` (`unique_keys`) within the device id's 64 characters."""
_NOT_DEVICE = re.compile(r"[^A-Za-z0-9_.:#-]")
_DOUBLE_DOT = re.compile(r"\.(?=\.)")


def device_key(text: str) -> str:
    """`text` (a GPU's uuid: free text in a Sonar sample) as a `type-id` every entry accepts
    (`schemas.names.device_id_problem`): as it is when it is one of at most `DEVICE_KEY_MAX` characters (every
    real uuid and PCI bus id), else cut, each character outside `[A-Za-z0-9_.:#-]` and each `.` before
    another made `_`. Only a series key: the skeleton keeps the original uuid."""
    if len(text) <= DEVICE_KEY_MAX and device_id_problem(text) is None:
        return text
    key = _DOUBLE_DOT.sub("_", _NOT_DEVICE.sub("_", text[:DEVICE_KEY_MAX]))
    return "_" if key == "." else key


def unique_keys(
    names: Iterable[str], seen: set[str] | None = None, safe: Callable[[str], str] = tag_value
) -> list[str]:
    """Series keys for `names` in order: the name itself (made safe by `safe`: a tag value, or a `device_key`
    for a `type-id`; `-` when empty), with `#2`, `#3`, ... appended to repeats (also repeats of keys already
    in `seen`, which is updated)."""
    if seen is None:
        seen = set()
    return [unique_key(name, seen, safe) for name in names]


def unique_key(name: str, seen: set[str], safe: Callable[[str], str] = tag_value) -> str:
    """`unique_keys` of one name: called once per process of a sample in both directions, where building a
    tuple and a list around each name was a measurable part of the cost."""
    key = safe(name) or "-"
    if key in seen:
        n = 2
        while f"{key}#{n}" in seen:
            n += 1
        key = f"{key}#{n}"
    seen.add(key)
    return key
