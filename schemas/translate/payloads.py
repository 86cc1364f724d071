"""Sonar envelope -> NATS payloads per subject, writing a sample's metric lines as text directly.

Why: `route(envelope_to_lines(env))` + `batch` builds one `Line` per metric (~3,000 for a busy node) and then
formats each; most of that work is the same for every line of one object (its sorted, escaped tags) or of
one job (the tags its processes share). Here a sample is walked once (`walk_sample`, the same walk
`sample_to_lines` makes) by `_TextWriter`: the tag text of a job's processes and of the hwthreads is written
from one template per job or sample, and an object whose values are all plain gets its lines from the walk's
`%` template in one step. The text goes into `_Chunks` of UTF-8 whole lines, cut into messages at the same
line boundaries `batch` chooses (`split_chunks`: each message joined once). The result is byte for byte that
of the `Line` path (a test and `make bench` hold the two equal): objects whose values are not plain are
written as `format_shared`, the `Line` path's own writer, writes them, and tag values that would need escaping
go through `tag_set`. Other envelope kinds take the `Line` path.

Compiled (issue 24): where `_write.c` is built (and `HPCBUS_PURE=1` is not set), it writes the jobs and
processes of a sample (`jobs`: every job it is sure of, `_JobWalk.step` the others, in order; the skeleton's
processes of a job it writes as their JSON, `msgspec.Raw`, where the pure path builds a struct per process),
the lines of one object (`lines`) and of the hwthreads (`numbered`), reads the node's and GPUs' values
(`values`, `read_values`: `field_values` of sample_fields), quotes the skeleton event's JSON
(`string_field`) and joins each message (`join`: its pages faulted in at once, not one fault per page);
anything it is not sure of goes to the code below, which stays the reference (tests/test_compiled_write.py
compares the two and the `Line` path).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypedDict, Unpack

import msgspec

from hpcbus.schemas import subjects
from hpcbus.schemas.lineprotocol import Line, format_line
from hpcbus.schemas.lineprotocol.format import plain_tag_text, plain_value, tag_set
from hpcbus.schemas.native import extension
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.sonar.types import SampleEnvelope, SampleJob, SampleProcess
from hpcbus.schemas.translate.bus import (
    MAX_PAYLOAD,
    format_shared,
    route,
    split_chunks,
    split_payloads,
    subject_of,
)
from hpcbus.schemas.translate.common import Envelope, epoch_of, tag_value
from hpcbus.schemas.translate.events import MAX_PART_BYTES
from hpcbus.schemas.translate.registry import REGISTRY, disk_stat_name
from hpcbus.schemas.translate.sample_fields import PROCESS_FIELDS, PROCESS_GPU_FIELDS, Level, Values
from hpcbus.schemas.translate.sample_to_lp import (
    JobStep,
    PutProcess,
    each_job,
    process_tags,
    unplaceable,
    walk_sample,
)
from hpcbus.schemas.translate.to_lines import envelope_to_lines

__all__ = ["envelope_payloads", "envelope_texts"]

_write = extension("hpcbus.schemas.translate._write")
"""The compiled writer (`_write.c`): a sample's job and process lines, the lines of one object, the quoted
skeleton; None on the pure path."""

# Every measurement a sample writes needs no escaping: the text below relies on it.
assert all(m.name.isidentifier() for m in REGISTRY) and all(
    disk_stat_name(i).isidentifier() for i in range(40)
)

_SLOT = "\x01"
"""Stands for a tag value in `_slotted` (`tag_set` writes it as it is, and no tag dict here holds it)."""
_PROCESS_LAYOUT = (
    SampleProcess,
    tuple(
        (f.name, f.default, f.default_factory is list)
        for f in msgspec.structs.fields(SampleProcess)
        if f.encode_name == f.name  # (asserted below: the JSON names are the attributes)
    ),
    msgspec.structs.astuple,
    msgspec.Raw,
    msgspec.json.encode,
)
"""What the compiled writer needs to write the JSON of a skeleton's process itself (`_write.c`, `jobs`): the
struct, each field's name, default and whether that is an empty list, in order; how to read all fields in one
call; how to hand JSON to `msgspec.json.encode` as it is; the encoder (for a process' GPUs)."""
assert len(_PROCESS_LAYOUT[1]) == len(msgspec.structs.fields(SampleProcess))
assert SampleProcess.__struct_config__.omit_defaults and all(
    f.default_factory is list
    or (f.default_factory is msgspec.NODEFAULT and f.default is not msgspec.NODEFAULT)
    for f in msgspec.structs.fields(SampleProcess)
)
_NO_PROCESS = SampleProcess()
"""A process without pid, cmd and ppid: `process_tags` of it are the tags every process of a job shares."""


class Context(TypedDict, total=False):
    """What `envelope_to_lines` and `route` take besides the envelope: `cluster` and `now` stand in for an
    envelope that does not say them, `problems` collects warnings, `prefix` goes in front of subjects,
    `max_event_bytes` bounds the envelope JSON in one jobs or cluster event."""

    cluster: str
    now: int
    problems: list[Problem] | None
    prefix: str
    max_event_bytes: int


def envelope_payloads(
    env: Envelope, *, max_bytes: int = MAX_PAYLOAD, **context: Unpack[Context]
) -> dict[str, list[bytes]]:
    """The messages of one envelope by subject, in publishing order: exactly
    `{s: list(batch(g, max_bytes)) for s, g in route(envelope_to_lines(env, ...), cluster, prefix=prefix)}`
    (`context` as `envelope_to_lines` and `route` take it), computed without building metric `Line`s for a
    sample. A message's line count is `payload.count(b"\\n")`."""
    join = b"".join if _write is None else _write.join
    return {
        s: split_chunks(t, max_bytes, join)
        if isinstance(t, _Chunks)
        else split_payloads("".join(t).encode(), max_bytes)
        for s, t in _texts(env, **context).items()
    }


def envelope_texts(env: Envelope, **context: Unpack[Context]) -> dict[str, list[str]]:
    """The text of every line of one envelope (newline-terminated, as `format_shared` writes them) by
    subject, in publishing order, before cutting into messages: what `envelope_payloads` cuts, and what a
    publisher that adds lines of its own to the same subjects (the node agent's ClusterCockpit lines)
    appends to before cutting. `context`: as `envelope_payloads` takes it."""
    texts = _texts(env, **context)
    return {s: [b"".join(t).decode()] if isinstance(t, _Chunks) else t for s, t in texts.items()}


def _texts(
    env: Envelope,
    *,
    cluster: str = "",
    now: int = 0,
    problems: list[Problem] | None = None,
    prefix: str = "",
    max_event_bytes: int = MAX_PART_BYTES,
) -> dict[str, list[str] | _Chunks]:
    """`envelope_texts`, with a sample's metric lines as the UTF-8 chunks the writer wrote them in (`_Chunks`):
    what `envelope_payloads` cuts without joining and encoding half a megabyte first."""
    if not isinstance(env, SampleEnvelope):
        lines = envelope_to_lines(
            env, cluster=cluster, now=now, problems=problems, max_event_bytes=max_event_bytes
        )
        return {s: format_shared(g) for s, g in route(lines, cluster, prefix=prefix).items()}
    head = unplaceable(env, cluster, now, problems)
    if head is not None:  # a skeleton alone (and a warning in `problems`, once)
        return {subject_of(head, cluster, prefix=prefix): format_shared([head])}
    assert env.data is not None
    a = env.data.attributes
    writer = _TextWriter(epoch_of(a.time))
    head = walk_sample(env, writer)
    out: dict[str, list[str] | _Chunks] = {subject_of(head, cluster, prefix=prefix): _event_text(head)}
    if writer.chunks:  # every metric line of a sample carries the sample's own (non-empty) cluster tag
        # the skeleton went to `<cluster>.events.sample`: the metrics subject is the chunks' alone
        out[subjects.metrics(a.cluster, prefix=prefix)] = writer.chunks
    return out


def _slotted(tags: dict[str, str], slots: Sequence[str]) -> str | None:
    """The tag set of `tags` plus the keys `slots` as a `%` template of the slots' values, given in sorted
    key order (as `tag_set` sorts); None when `tags` holds `_SLOT` itself. The values put in must be ones
    `tag_set` writes as they are (`plain_tag_text`)."""
    text = tag_set({**tags, **dict.fromkeys(slots, _SLOT)})
    if text.count(_SLOT) != len(slots):
        return None
    return text.replace("%", "%%").replace(_SLOT, "%s")


def _event_text(head: Line) -> list[str] | _Chunks:
    """`format_shared([head])` of a sample's skeleton event; the compiled writer quotes its JSON (tens of
    kilobytes, full of quotes) in one pass where `format_line` makes four."""
    if _write is not None and head.measurement == "sample" and len(head.fields) == 1:
        event = head.fields.get("event")
        if type(event) is str:
            quoted = _write.string_field(event)
            stamp = f" {head.time}\n".encode()
            if quoted is not None:
                return _Chunks([b"".join((f"sample{tag_set(head.tags)} event=".encode(), quoted, stamp))])
    return format_shared([head])


class _Chunks(list[bytes]):
    """A sample's metric lines as UTF-8 text, in pieces of whole lines (a type of its own: `_texts` tells
    them from a list of str texts by it)."""


class _TextWriter:
    """The `Writer` (schemas.translate.sample_to_lp) that appends the lines' text to `chunks`, in UTF-8."""

    def __init__(self, time: int) -> None:
        self.chunks = _Chunks()
        add = self.chunks.append
        self.add = lambda text: add(text.encode())
        self.time = time
        self.stamp = f" {time}\n"

    def put(self, tags: dict[str, str], names: tuple[str, ...], values: Values, template: str | None) -> None:
        if _write is not None and type(values) is tuple:  # all of them as written below, or None
            text = _write.lines(names, tag_set(tags), values, self.stamp)
            if text is not None:
                self.chunks.append(text)
                return
        if template is not None:
            self.add((template % values).replace("\0", tag_set(tags)))
            return
        # values converted or to check (the node's own, or not plain): as `format_shared` writes them, a
        # plain value (`plain_value`) after the tag set written once, any other by `format_line`
        ts = self.time
        tag_text = tag_set(tags)
        self.add(
            "".join(
                f"{name}{tag_text} value={text} {ts}\n"
                if (text := plain_value(v)) is not None
                else format_line(Line(name, tags, {"value": v}, ts)) + "\n"
                for name, v in zip(names, values, strict=True)
            )
        )

    def read_values(
        self, obj: object, level: Level
    ) -> tuple[tuple[str, ...], Values, dict[str, object]] | None:
        return None if _write is None else _write.values(obj, level.coded)

    def hwthreads(self, tags: dict[str, str], values: Sequence[int], plain: bool) -> None:
        if plain and _write is not None and type(values) is list:  # what the template below writes
            pieces = tag_set({**tags, "type": "hwthread", "type-id": _SLOT}).split(_SLOT)
            lines = _write.numbered("cpu_time", *pieces, values, self.stamp) if len(pieces) == 2 else None
            if lines is not None:
                self.chunks.append(lines)
                return
        text = _slotted({**tags, "type": "hwthread"}, ("type-id",)) if plain else None
        if text is not None:  # the index and the value of each: `%s` writes an int as `str` does
            self.add("".join(map(f"cpu_time{text} value=%si{self.stamp}".__mod__, enumerate(values))))
            return
        for i, v in enumerate(values):
            self.put({**tags, "type": "hwthread", "type-id": str(i)}, ("cpu_time",), (v,), None)

    def processes(self, job: dict[str, str]) -> PutProcess:
        """Tag text from a template per job and shape (which of pid, cmd, ppid the process has), filled with
        the process' own values; a process whose values need escaping gets its tags from `process_tags`."""
        shapes: dict[tuple[bool, bool, bool], str | None] = {}
        cmds: dict[str, str | None] = {}  # cmd -> its tag value, None when that needs escaping
        add = self.add

        def put_process(
            p: SampleProcess, key: str, names: tuple[str, ...], values: Values, template: str | None
        ) -> None:
            pid, cmd, ppid = p.pid, p.cmd, p.ppid
            if template is not None and type(pid) is int and type(ppid) is int and type(cmd) is str:
                tag_cmd = cmds.get(cmd, "")
                if tag_cmd == "" and cmd:
                    tag_cmd = cmds[cmd] = tag_value(cmd)
                    if not plain_tag_text(tag_cmd):
                        tag_cmd = cmds[cmd] = None
                shape = (bool(cmd), bool(pid), bool(ppid))
                tag_template = shapes.get(shape, "")
                if tag_template == "":
                    slots = [k for k, present in zip(("cmd", "pid", "ppid"), shape, strict=True) if present]
                    tag_template = shapes[shape] = _slotted(
                        process_tags(job, _NO_PROCESS, _SLOT), [*slots, "stype-id"]
                    )
                if tag_template is not None and tag_cmd is not None and plain_tag_text(key):
                    # the slots in sorted key order: cmd < pid < ppid < stype-id
                    if cmd and pid and ppid:
                        tag_text = tag_template % (tag_cmd, pid, ppid, key)
                    else:
                        tag_text = tag_template % (*(v for v in (tag_cmd, pid, ppid) if v), key)
                    add((template % values).replace("\0", tag_text))
                    return
            self.put(process_tags(job, p, key), names, values, template)

        return put_process

    def jobs(
        self,
        cluster: str,
        host: str,
        jobs: Sequence[SampleJob],
        seen_jobs: set[str],
        seen_procs: set[str],
        step: JobStep,
    ) -> tuple[list[SampleJob], int]:
        """`each_job(jobs, step)`; with the compiled writer, the jobs it is sure of are written by it
        (`_write.c` says which), byte for byte as `step` writes them, the others by `step`. The jobs returned
        encode as `each_job`'s (a job the C wrote holds its skeleton processes as JSON, `msgspec.Raw`)."""
        if _write is None or type(jobs) is not list or type(cluster) is not str or type(host) is not str:
            return each_job(jobs, step)
        return _write.jobs(
            jobs,
            cluster,
            host,
            seen_jobs,
            seen_procs,
            PROCESS_FIELDS,
            PROCESS_GPU_FIELDS,
            _PROCESS_LAYOUT,
            self.chunks,
            self.stamp,
            msgspec.structs.replace,
            step,
        )
