"""Sonar's directory sink, reproduced: the file tree Jobanalyzer's `sonalyze` reads without any Kafka.

Sonar (`src/datasink/directory.rs`) appends each envelope, one JSON document per line, to

    DIR/<yyyy>/<mm>/<dd>/0+<type>-<attribute>.json

- `<type>` is the envelope kind: `sample`, `sysinfo`, `job`, and `cluzter` for cluster envelopes (Sonar spells
  it so on purpose; Jobanalyzer's reader looks for that name).
- `<attribute>` is the node's host name for `sample` and `sysinfo`, and `slurm` for `job` and `cluzter`.
- `0+` is the data-format version: Jobanalyzer reads a `0+sample-*` file as Sonar JSON format 0 (other
  names in the same tree are its older CSV files).
- Real names from the corpus: `cluster1.uio.no/2025/04/13/0+sample-n1.cluster1.uio.no.json`,
  `.../0+sysinfo-n1.cluster1.uio.no.json`, `.../2025/05/02/0+job-slurm.json`, `.../0+cluzter-slurm.json`.

One difference, on purpose: Sonar dates the directory by the wall clock when it posts; here it is the UTC
date of the envelope's own `time`. Sonar posts seconds after measuring, so the two agree except around
midnight; the bus, though, delivers a backlog hours late after an outage, and Jobanalyzer selects files by
their directory date, so the data's date keeps a replayed backlog findable. Jobanalyzer's own ingest does the
same (sonalyze's `filedb` files a record under its time converted to UTC), and its readers glob exactly
`0+sample-*.json`, `0+sysinfo-*.json`, `0+job-slurm.json` and `0+cluzter-slurm.json` in a day's directory
(tests/test_jobanalyzer_tree.py checks the tree from the real Slurm producer). An errors-only envelope uses
its first error's time, else the clock.

Long host names: a file name component may have at most 255 bytes (`NAME_MAX` on every Linux file system),
and a valid FQDN has up to 253 characters, so `0+sample-<host>.json` can be too long. Such a component is
shortened deterministically (`short_component`): the first characters of the host name, `~`, and the first 16
hex digits of the SHA-256 of the whole host name (as the records give it), so every envelope of that host goes
to the same file and two long names that share a prefix get two files. `~` never occurs in a host name made
safe, so a shortened name never equals a real one. sonalyze reads the host from the records, not from the
file name, so nothing is lost (docs/mapping.md).

Each envelope is one `os.write` of a whole line to a file opened `O_APPEND`, so several writers (or workers)
appending to one file interleave whole lines on a local file system.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import time
from datetime import UTC, datetime
from pathlib import Path

from hpcbus.permanent import Permanent, outcome
from hpcbus.schemas.sonar.types import ClusterEnvelope, JobsEnvelope, SampleEnvelope, SysinfoEnvelope
from hpcbus.schemas.translate import Envelope

log = logging.getLogger("hpcbus.sonar")

FILE_TYPE = {"sample": "sample", "sysinfo": "sysinfo", "job": "job", "cluster": "cluzter"}
"""Envelope kind -> the `<type>` word of Sonar's file names."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

NAME_MAX = 255
"""Bytes a file name component may have (Linux `NAME_MAX`)."""
DIGEST_HEX = 16
"""Hex digits of the SHA-256 of the host name that end a shortened name."""


def _safe(name: str) -> str:
    """A host name as one path component: nothing but `[A-Za-z0-9._-]`, never empty, `.` or `..`."""
    name = _UNSAFE.sub("_", name)
    return name if name.strip(".") else "unknown"


def short_component(type_word: str, attribute: str, node: str) -> str:
    """`0+<type>-<attribute>.json`, or when that is over `NAME_MAX` bytes: `0+<type>-<start>~<digest>.json`,
    `<start>` the longest start of `attribute` that fits and `<digest>` the first `DIGEST_HEX` hex digits of
    the SHA-256 of `node` (the host name as the records give it), exactly `NAME_MAX` bytes in all."""
    head, tail = f"0+{type_word}-", ".json"
    name = f"{head}{attribute}{tail}"
    if len(name.encode()) <= NAME_MAX:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:DIGEST_HEX]
    keep = NAME_MAX - len(head) - len(tail) - 1 - DIGEST_HEX
    return f"{head}{attribute[:keep]}~{digest}{tail}"


def _time_and_node(env: Envelope) -> tuple[str, str]:
    data = getattr(env, "data", None)
    if data is not None:
        attrs = data.attributes
        return attrs.time, getattr(attrs, "node", "")
    for error in env.errors:
        if error.time or error.node:
            return error.time, error.node
    return "", ""


def _kind(env: Envelope, kind: str) -> str:
    if isinstance(env, SampleEnvelope):
        return "sample"
    if isinstance(env, SysinfoEnvelope):
        return "sysinfo"
    if isinstance(env, JobsEnvelope):
        return "job"
    if isinstance(env, ClusterEnvelope):
        return "cluster"
    return kind


def relative_path(env: Envelope, kind: str = "", *, now: float | None = None) -> str:
    """`<yyyy>/<mm>/<dd>/0+<type>-<attribute>.json` of one envelope (`kind` names an `ErrorsEnvelope`'s kind)."""
    kind = _kind(env, kind)
    if kind not in FILE_TYPE:
        raise ValueError(f"no Sonar file name for an envelope of kind {kind!r}")
    stamp, node = _time_and_node(env)
    try:
        when = datetime.fromisoformat(stamp).astimezone(UTC) if stamp else None
    except ValueError:
        when = None
    if when is None:
        when = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    attribute = _safe(node) if kind in ("sample", "sysinfo") else "slurm"
    return f"{when:%Y/%m/%d}/{short_component(FILE_TYPE[kind], attribute, node)}"


class DirectoryWriter:
    """Appends envelopes to Sonar's tree under `root` (created as needed)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.written = 0

    def append(
        self, items: list[tuple[str, bytes]], refused: list[tuple[tuple[str, bytes], str]] | None = None
    ) -> None:
        """Append each `(relative path, compact envelope JSON)` as one line, removing it from `items` once
        written, so that a retry after an `OSError` does not write the earlier ones twice. With `refused`, an
        item that fails with an error no retry cures (`hpcbus.permanent.outcome` with this tree's root: a
        name too long, a permission refused under a tree root that can be written) is moved there with the
        reason and the others are written; any other error (a full disk, a tree that cannot be written at
        all) is raised as that outcome (`Transient`: the runtime retries; the input stays unacknowledged
        until its envelopes are in the files too). Blocking: called in a thread."""
        while items:
            item = items[0]
            try:
                self._write(*item)
            except OSError as exc:
                found = outcome(exc, self.root)
                if refused is None or not isinstance(found, Permanent):
                    raise found from exc
                refused.append((item, f"{self.root / item[0]}: {found.reason}"))
            else:
                self.written += 1
            items.pop(0)

    def _write(self, rel: str, payload: bytes) -> None:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        line = payload if payload.endswith(b"\n") else payload + b"\n"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            view = memoryview(line)
            try:
                while view:
                    view = view[os.write(fd, view) :]
            except OSError:
                if len(view) < len(line):  # part of the line is written: take it back, no half line
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, size)
                raise
        finally:
            os.close(fd)
