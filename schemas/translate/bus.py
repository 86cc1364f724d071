"""Putting translated lines on the bus: which subject, how many bytes per message, which Nats-Msg-Id.

Pure helpers (no NATS here) so that every publisher — producers, `hpcbus translate`, the Sonar bridge — splits
and names messages the same way, which is what makes JetStream's duplicate detection work across restarts.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Iterable, Iterator

from hpcbus.schemas import subjects
from hpcbus.schemas.lineprotocol import Line, format_line
from hpcbus.schemas.lineprotocol.format import plain_value, tag_set

__all__ = [
    "MAX_PAYLOAD",
    "batch",
    "format_shared",
    "line_route",
    "msg_id",
    "route",
    "split_chunks",
    "split_payloads",
    "subject_of",
]

MAX_PAYLOAD = 512 * 1024
"""Bytes per NATS message: half of the server's default `max_payload` (1 MB), leaving room for headers."""


def line_route(line: Line) -> tuple[str, str]:
    """(category, detail) of the subject a line travels on, by its field (docs/mapping.md section 2):
    `("metrics", "")`, `("events", <measurement>)`, `("log", <measurement>)`, `("control", <method>)`."""
    fields = line.fields
    if "value" in fields:
        return "metrics", ""
    if "event" in fields:
        return "events", line.measurement
    if "log" in fields:
        return "log", line.measurement
    if "control" in fields:
        return "control", line.tags.get("method", "get")
    return "metrics", ""


def subject_of(line: Line, cluster: str, *, prefix: str = "") -> str:
    """`<cluster>.metrics`, `<cluster>.events.<measurement>`, `<cluster>.log.<measurement>` or
    `<cluster>.control.<get|put>` (`line_route`). `cluster` is the line's `cluster` tag if any; `prefix` the
    subject prefix the tree sits under (`cc`)."""
    cl = line.tags.get("cluster") or cluster
    category, detail = line_route(line)
    if category == "metrics":
        return subjects.metrics(cl, prefix=prefix)
    if category == "events":
        return subjects.events(cl, detail, prefix=prefix)
    if category == "log":
        return subjects.log(cl, detail, prefix=prefix)
    return subjects.control(cl, detail, prefix=prefix)


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


def format_shared(lines: Iterable[Line]) -> list[str]:
    """Each line as `format_line` writes it, plus a newline — byte for byte — but escaping each tag dict once.

    Why: translated lines share one tag dict per node, device, job or process (~10 lines each), and escaping
    and sorting tags is most of the cost of writing line protocol. The tag text is computed once per dict and
    reused for every line that shares it. Metric values of the two common types are written by
    `plain_value` (`format_line`'s own rules); anything else (events, bools, zero/subnormal/non-finite floats, out-of-range
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
                        prefix = tag_set(tags)
                        # the dict itself is kept with its text: while cached, its id cannot be reused
                        prefixes[id(tags)] = (tags, prefix)
                    text = plain_value(value)
                    if text is not None:
                        add(f"{name}{prefix} value={text} {line.time}\n")
                        continue
        add(format_line(line) + "\n")
    return out


def batch(lines: Iterable[Line], max_bytes: int = MAX_PAYLOAD) -> Iterator[bytes]:
    """Message payloads of at most `max_bytes` (a single longer line gets a message of its own), each line
    ending in a newline, never split. Streams: `lines` is read 1024 at a time, so memory stays flat for an
    endless input (`hpcbus translate --to lp`). Each slice is encoded as one text and cut where the
    greedy packing of whole lines would cut (`split_payloads`), rather than line by line."""
    pending = bytearray()
    for texts in map(format_shared, _slices(lines, 1024)):
        pending += "".join(texts).encode()
        start = 0
        while len(pending) - start > max_bytes:  # what follows cannot change where this message ends
            cut = _cut(pending, start, max_bytes)
            yield bytes(pending[start:cut])
            start = cut
        del pending[:start]
    if pending:
        yield bytes(pending)


def split_payloads(text: bytes, max_bytes: int = MAX_PAYLOAD) -> list[bytes]:
    """Newline-terminated lines cut into messages as `batch` cuts them: as many whole lines as fit in
    `max_bytes`, a longer line alone."""
    out: list[bytes] = []
    start, end = 0, len(text)
    while end - start > max_bytes:
        cut = _cut(text, start, max_bytes)
        out.append(text[start:cut])
        start = cut
    if start < end:
        out.append(text[start:])
    return out


def split_chunks(
    chunks: Iterable[bytes], max_bytes: int = MAX_PAYLOAD, join: Callable[[list[bytes]], bytes] = b"".join
) -> list[bytes]:
    """`split_payloads(b"".join(chunks), max_bytes)`, where each chunk is whole newline-terminated lines,
    without joining them first: each message is joined once from the chunks (and parts of chunks) it holds,
    by `join` (`b"".join`, or one that gives the same bytes faster). Why: a sample's text is half a megabyte;
    joining it and cutting the join copied it twice."""
    out: list[bytes] = []
    group: list[bytes] = []
    size = 0
    for chunk in chunks:
        while size + len(chunk) > max_bytes:
            nl = chunk.rfind(b"\n", 0, max_bytes - size)
            if nl >= 0:  # the message ends within this chunk, after its last line that fits
                group.append(chunk[: nl + 1])
                chunk = chunk[nl + 1 :]
            elif not group:  # a line longer than a message: alone
                nl = chunk.index(b"\n") + 1
                group.append(chunk[:nl])
                chunk = chunk[nl:]
            out.append(join(group))  # (else: the message ends before this chunk)
            group = []
            size = 0
        if chunk:
            group.append(chunk)
            size += len(chunk)
    if group:
        out.append(join(group))
    return out


def _cut(text: bytes | bytearray, start: int, max_bytes: int) -> int:
    """The end of the message starting at `start`: after the last whole line within `max_bytes`, or after
    the first line when that one alone is longer."""
    nl = text.rfind(b"\n", start, start + max_bytes)
    return nl + 1 if nl >= 0 else text.index(b"\n", start) + 1


def _slices(lines: Iterable[Line], n: int) -> Iterator[list[Line]]:
    it = iter(lines)
    while chunk := list(itertools.islice(it, n)):
        yield chunk


def msg_id(subject: str, payload: bytes, part: str = "") -> str:
    """The `Nats-Msg-Id` header: BLAKE2b-128 of subject and payload, hex. Same message -> same id, so
    JetStream drops a re-published copy within its duplicate window; different content never collides.
    `part` (`"2/5"`) names one of several messages made from one input (a Sonar envelope cut by
    `schemas.sonar.split`): two parts with equal bytes then still have ids of their own."""
    text = subject.encode() + b"\n" + payload
    if part:
        text += b"\n#" + part.encode()
    return hashlib.blake2b(text, digest_size=16).hexdigest()
