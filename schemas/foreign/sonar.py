"""Sonar envelopes as Sonar's HTTP sink POSTs them (one envelope per request; JSONL accepted), checked for
the cluster the request was authenticated for.

Sonar 0.19 POSTs each envelope to `API-ROOT/<topic>` (topic = `sample|sysinfo|job|cluster`, or
`<prefix>.<type>`) with HTTP Basic auth, the cluster name as user. The envelope is validated with the Sonar
structs (`schemas.sonar`, every problem with its JSON path), and every cluster name in it (`data.attributes
.cluster`, `errors[i].cluster`) must be the authenticated one: the body never chooses the cluster. Where a
site sets Sonar's `meta.token` (the spec's field, which Sonar itself leaves empty), it is checked too.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from hpcbus.schemas.problems import FORBIDDEN, InvalidInput, Problem
from hpcbus.schemas.sonar import Envelope, PartlyInvalid, decode_envelope, encode_envelope, iter_envelopes

TOPIC_KINDS = {"sample": "sample", "sysinfo": "sysinfo", "job": "job", "jobs": "job", "cluster": "cluster"}
"""The data types of Sonar's topics (and Jobanalyzer's insert paths) -> the kind of `<cluster>.sonar.<kind>`."""


class Envelopes(msgspec.Struct):
    """The envelopes of one request that may be published (each as its own message), and the refused ones."""

    payloads: list[bytes]
    problems: list[Problem]
    received: int


def topic_kind(topic: str) -> str:
    """The envelope kind of a topic (`sample`, `test.sample` -> `sample`), "" when it is not one."""
    return TOPIC_KINDS.get(topic.rsplit(".", 1)[-1], "")


def clusters_of(env: Envelope) -> list[tuple[str, str]]:
    """(JSON path, cluster name) of every cluster an envelope names."""
    out: list[tuple[str, str]] = []
    data = getattr(env, "data", None)
    attributes = getattr(data, "attributes", None)
    name = getattr(attributes, "cluster", "")
    if name:
        out.append(("data.attributes.cluster", name))
    for i, error in enumerate(env.errors):
        if error.cluster:
            out.append((f"errors[{i}].cluster", error.cluster))
    return out


def _refusals(
    env: Envelope, kind: str, cluster: str, token_ok: Callable[[str], bool] | None
) -> list[Problem]:
    problems = [
        Problem(
            f"{name!r}: this request may publish for {cluster!r} only",
            kind=f"sonar {kind}",
            path=path,
            code=FORBIDDEN,  # a valid name, not the authenticated one: 403, where no Clustername is 400
        )
        for path, name in clusters_of(env)
        if name != cluster
    ]
    if token_ok is not None and not token_ok(env.meta.token):
        problems.append(Problem("wrong or missing token", kind=f"sonar {kind}", path="meta.token"))
    return problems


def read_envelopes(
    body: bytes,
    kind: str,
    cluster: str,
    *,
    place: str = "",
    token_ok: Callable[[str], bool] | None = None,
    latest: int | None = None,
) -> Envelopes:
    """The envelopes of one request body for `<cluster>.sonar.<kind>`. A single envelope (Sonar's HTTP sink)
    is published as it came; several (JSONL, or pretty-printed back to back) are published one per message,
    each as `encode_envelope` writes it (deterministic, so a retried request gets the same message ids).
    `token_ok(meta.token)` is asked when the cluster has a token configured. An envelope some of whose
    records were refused alone (`PartlyInvalid`) is published without them, re-encoded, and their problems
    are returned beside it (a partial refusal). `latest` (the receiver's now + max_future): envelope times
    outside [2000-01-01, latest] are refused (`decode_envelope`)."""
    try:
        env = decode_envelope(body, expect=kind, latest=latest)
    except PartlyInvalid as exc:
        partial = [p.located(place) if not p.place else p for p in exc.problems]
        refused = _refusals(exc.envelope, kind, cluster, token_ok)
        if refused:
            return Envelopes([], [p.located(place) for p in refused], 1)
        return Envelopes([encode_envelope(exc.envelope)], partial, 1)
    except InvalidInput as exc:
        single_problems = [p.located(place) if not p.place else p for p in exc.problems]
    else:
        refused = _refusals(env, kind, cluster, token_ok)
        if refused:
            return Envelopes([], [p.located(place) for p in refused], 1)
        return Envelopes([body.strip()], [], 1)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return Envelopes([], single_problems, 1)
    found = list(iter_envelopes(text, expect=kind, latest=latest))
    if len(found) < 2:
        return Envelopes([], single_problems, 1)
    payloads: list[bytes] = []
    problems: list[Problem] = []
    for line, item in found:
        if isinstance(item, InvalidInput):
            problems.extend(p.located(place) for p in item.problems)
            if not isinstance(item, PartlyInvalid):
                continue
            item = item.envelope
        refused = _refusals(item, kind, cluster, token_ok)
        if refused:
            problems.extend(msgspec.structs.replace(p, place=place, line=line) for p in refused)
            continue
        payloads.append(encode_envelope(item))
    return Envelopes(payloads, problems, len(found))
