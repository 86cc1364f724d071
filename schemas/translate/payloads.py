"""Sonar envelope -> NATS payloads per subject, writing a sample's metric lines as text directly.

Why: `route(envelope_to_lines(env))` + `batch` builds one `Line` per metric (~3,000 for a busy node) and then
formats each; most of that work is the same for every line of one object (its sorted, escaped tags). Here a
sample is walked once (`walk_sample`, the same walk `sample_to_lines` makes), each object's tag text is
written once and each of its values appended to it; the text is encoded once and cut into messages at the
same line boundaries `batch` chooses. The result is byte for byte that of the `Line` path (a test and
`make bench` hold the two equal); anything unusual (a value `format_shared` would not write itself) goes
through `format_line` exactly as there, and the common values are written by `plain_value`, as there. Other envelope kinds take the `Line` path.
"""

from __future__ import annotations

from schemas import subjects
from schemas.lineprotocol import Line, format_line
from schemas.lineprotocol.format import plain_value, tag_set
from schemas.problems import Problem
from schemas.sonar.types import SampleEnvelope
from schemas.translate.bus import MAX_PAYLOAD, batch, route, split_payloads, subject_of
from schemas.translate.common import Envelope, epoch_of
from schemas.translate.registry import REGISTRY, disk_stat_name
from schemas.translate.sample_to_lp import unplaceable, walk_sample

__all__ = ["envelope_payloads"]

# Every measurement a sample writes needs no escaping: the text below relies on it.
assert all(m.name.isidentifier() for m in REGISTRY) and all(
    disk_stat_name(i).isidentifier() for i in range(40)
)


def envelope_payloads(
    env: Envelope,
    *,
    cluster: str = "",
    now: int = 0,
    problems: list[Problem] | None = None,
    prefix: str = "",
    max_bytes: int = MAX_PAYLOAD,
) -> dict[str, list[bytes]]:
    """The messages of one envelope by subject, in publishing order: exactly
    `{s: list(batch(g, max_bytes)) for s, g in route(envelope_to_lines(env, ...), cluster, prefix=prefix)}`
    (arguments as `envelope_to_lines` and `route` take them), computed without building metric `Line`s for a
    sample. A message's line count is `payload.count(b"\\n")`."""
    if not isinstance(env, SampleEnvelope):
        from schemas.translate import envelope_to_lines  # the package imports this module

        lines = envelope_to_lines(env, cluster=cluster, now=now, problems=problems)
        return {s: list(batch(g, max_bytes)) for s, g in route(lines, cluster, prefix=prefix).items()}
    head = unplaceable(env, cluster, now, problems)
    if head is not None:  # a skeleton alone (and a warning in `problems`, once)
        return {s: list(batch(g, max_bytes)) for s, g in route([head], cluster, prefix=prefix).items()}
    assert env.data is not None
    a = env.data.attributes
    ts = epoch_of(a.time)
    stamp = f" {ts}\n"
    texts: list[str] = []
    add = texts.append

    def put(tags: dict[str, str], values: list[tuple[str, float | int]]) -> None:
        tag_text = tag_set(tags)
        for name, v in values:
            text = plain_value(v)
            if text is not None:
                add(f"{name}{tag_text} value={text}{stamp}")
            else:
                add(format_line(Line(name, tags, {"value": v}, ts)) + "\n")

    head = walk_sample(env, put)
    out = {subject_of(head, cluster, prefix=prefix): list(batch([head], max_bytes))}
    if texts:  # every metric line of a sample carries the sample's own (non-empty) cluster tag
        out.setdefault(subjects.metrics(a.cluster, prefix=prefix), []).extend(
            split_payloads("".join(texts).encode(), max_bytes)
        )
    return out
