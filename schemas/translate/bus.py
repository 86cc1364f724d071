"""Putting translated lines on the bus: which subject, how many bytes per message, which Nats-Msg-Id.

Pure helpers (no NATS here) so that every publisher — producers, `hpcbus translate`, the Sonar bridge — splits
and names messages the same way, which is what makes JetStream's duplicate detection work across restarts.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterable, Iterator

from schemas import subjects
from schemas.lineprotocol import Line, format_line

__all__ = ["MAX_PAYLOAD", "batch", "format_shared", "msg_id", "route", "subject_of"]

MAX_PAYLOAD = 512 * 1024
"""Bytes per NATS message: half of the server's default `max_payload` (1 MB), leaving room for headers."""


def subject_of(line: Line, cluster: str, *, prefix: str = "") -> str:
    """`<cluster>.metrics`, `<cluster>.events.<measurement>`, `<cluster>.log.<measurement>` or
    `<cluster>.control.<get|put>` (docs/mapping.md section 2). `cluster` is the line's `cluster` tag if any;
    `prefix` the subject prefix the tree sits under (`cc`)."""
    cl = line.tags.get("cluster") or cluster
    fields = line.fields
    if "value" in fields:
        return subjects.metrics(cl, prefix=prefix)
    if "event" in fields:
        return subjects.events(cl, line.measurement, prefix=prefix)
    if "log" in fields:
        return subjects.log(cl, line.measurement, prefix=prefix)
    if "control" in fields:
        return subjects.control(cl, line.tags.get("method", "get"), prefix=prefix)
    return subjects.metrics(cl, prefix=prefix)


def route(lines: Iterable[Line], cluster: str = "", *, prefix: str = "") -> dict[str, list[Line]]:
    """Lines grouped by subject, each group in input order (NATS keeps a publisher's order per subject);
    `prefix` is the subject prefix (`subject_of`)."""
    out: dict[str, list[Line]] = {}
    metrics_subject: dict[str, str] = {}
    for line in lines:
        if "value" in line.fields:  # the common case, without re-validating the cluster name every time
            cl = line.tags.get("cluster") or cluster
            subject = metrics_subject.get(cl)
            if subject is None:
                subject = metrics_subject[cl] = subjects.metrics(cl, prefix=prefix)
        else:
            subject = subject_of(line, cluster, prefix=prefix)
        group = out.get(subject)
        if group is None:
            out[subject] = group = []
        group.append(line)
    return out


_F_MIN_NORMAL = 2.2250738585072014e-308
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1


_SPECIAL = re.compile(r"[,= \\\n\r]")


def _tag_text(tags: dict[str, str]) -> str:
    """`,k=v,...` as `format_line` writes it: sorted by key, empty values left out. Plain tags (no character
    that needs an escape, the usual case) are joined here; any other goes through `format_line` itself."""
    if "" not in tags and _SPECIAL.search("".join(tags) + "".join(tags.values())) is None:
        return "".join(f",{k}={v}" for k, v in sorted(tags.items()) if v)
    return format_line(Line("m", tags, {"v": 0}, 0))[1 : -len(" v=0i 0")]


def format_shared(lines: Iterable[Line]) -> list[str]:
    """Each line as `format_line` writes it, plus a newline — byte for byte — but escaping each tag dict once.

    Why: translated lines share one tag dict per node, device, job or process (~10 lines each), and escaping
    and sorting tags is most of the cost of writing line protocol. The tag text is computed once per dict and
    reused for every line that shares it. Metric values of the two common types are written here with
    `format_line`'s rules; anything else (events, bools, zero/subnormal/non-finite floats, out-of-range
    integers, names that need escapes) goes through `format_line` itself. A test holds the two equal.
    The cache holds the dicts it keys by `id`, so a dict freed mid-stream cannot hand its id (and text) to a
    new one. Returns a list: for an endless stream use `batch`.
    """
    out: list[str] = []
    add = out.append
    prefixes: dict[int, tuple[dict[str, str], str]] = {}
    plain_names: dict[str, bool] = {}
    for line in lines:
        fields = line.fields
        if len(fields) == 1:
            value = fields.get("value")
            kind = type(value)
            if kind is float or kind is int:
                name = line.measurement
                plain = plain_names.get(name)
                if plain is None:
                    plain = plain_names[name] = name.isidentifier()
                if plain:
                    tags = line.tags
                    cached = prefixes.get(id(tags))
                    if cached is not None and cached[0] is tags:
                        prefix = cached[1]
                    else:
                        if len(prefixes) >= 4096:  # a stream of envelopes: keep memory flat
                            prefixes.clear()
                        prefix = _tag_text(tags)
                        # the dict itself is kept with its text: while cached, its id cannot be reused
                        prefixes[id(tags)] = (tags, prefix)
                    if kind is int:
                        if _I64_MIN <= value <= _I64_MAX:  # type: ignore[operator]
                            add(f"{name}{prefix} value={value}i {line.time}\n")
                            continue
                    elif not -_F_MIN_NORMAL < value < _F_MIN_NORMAL and value - value == 0.0:  # type: ignore[operator]
                        add(f"{name}{prefix} value={value!r} {line.time}\n")
                        continue
        add(format_line(line) + "\n")
    return out


def batch(lines: Iterable[Line], max_bytes: int = MAX_PAYLOAD) -> Iterator[bytes]:
    """Message payloads of at most `max_bytes` (a single longer line gets a message of its own), each line
    ending in a newline, never split. Streams: `lines` is read 1024 at a time, so memory stays flat for an
    endless input (`hpcbus translate --to lp`)."""
    buf: list[bytes] = []
    size = 0
    for texts in map(format_shared, _slices(lines, 1024)):
        for text_line in texts:
            text = text_line.encode()
            if buf and size + len(text) > max_bytes:
                yield b"".join(buf)
                buf, size = [], 0
            buf.append(text)
            size += len(text)
    if buf:
        yield b"".join(buf)


def _slices(lines: Iterable[Line], n: int) -> Iterator[list[Line]]:
    it = iter(lines)
    while chunk := list(itertools.islice(it, n)):
        yield chunk


def msg_id(subject: str, payload: bytes) -> str:
    """The `Nats-Msg-Id` header: BLAKE2b-128 of subject and payload, hex. Same message -> same id, so
    JetStream drops a re-published copy within its duplicate window; different content never collides."""
    return hashlib.blake2b(subject.encode() + b"\n" + payload, digest_size=16).hexdigest()
