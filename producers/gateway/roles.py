"""What a gateway credential's role lets a request post: the node allow-list of `schemas.trust`, applied to a
node credential's lines and envelopes exactly as `consume ingest` applies it to a node's ingest subject, so the
gateway is no second door. A master credential's requests pass as they are (the batch-system master sends
job and cluster records; its NATS identity still cannot send cc-backend's `events.job`), but for the job
summaries, which no credential may post (`schemas.trust.summary_lines`: the jobs worker's alone).

Pure steps on what the handlers read (`influx_api.py`, `sonar_api.py`): a refused line or envelope becomes a
problem beside the others of the request (a partial write, 400), a Sonar kind a node may not send at all is
refused whole (403) before its body is read.
"""

from __future__ import annotations

from hpcbus.producers.gateway.answers import Refusal
from hpcbus.producers.gateway.auth import Identity
from hpcbus.schemas.foreign import Envelopes, Normalised
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.trust import Sender, allowed_lines, check_envelope, subject_problem, summary_lines


def sender_of(who: Identity) -> Sender | None:
    """The node sender a credential proves, or None for a master (nothing to check)."""
    if who.role != "node":
        return None
    return Sender(who.hosts, who.cluster, who.name)


def check_kind(who: Identity, kind: str) -> None:
    """403 when `who` may not post Sonar envelopes of `kind` at all (a node posting job or cluster records)."""
    if who.role != "node":
        return
    reason = subject_problem("sonar", kind, who.name)
    if reason is not None:
        raise Refusal(403, reason, code="forbidden")


def keep_allowed_lines(result: Normalised, who: Identity, place: str) -> tuple[Normalised, list[Problem]]:
    """`result` without the lines `who` may not send, and a problem for each, one per refused line: from
    every credential, a job summary (`summary_lines`: only the jobs worker writes them, and `consume influx`
    writes a `job_summary` point of each `jobsummary` event), and from a node credential a line that names
    another host, another cluster, or a class only the master sends."""
    if not result.lines:
        return result, []
    sender = sender_of(who)
    refused = {i: (path, reason) for i, path, reason in summary_lines(result.lines)}
    if sender is not None:
        for i, path, reason in allowed_lines(result.lines, sender):
            refused.setdefault(i, (path, reason))
    if not refused:
        return result, []
    gone = set(refused)
    problems = [Problem(reason, place, 0, "gateway", path) for _, (path, reason) in sorted(refused.items())]
    lines = [line for i, line in enumerate(result.lines) if i not in gone]
    texts = [text for i, text in enumerate(result.texts) if i not in gone]
    return Normalised(lines, texts, result.problems, result.received), problems


def keep_allowed_envelopes(found: Envelopes, who: Identity, place: str) -> Envelopes:
    """`found` without the envelopes `who` may not send (a node credential's envelope about another node
    or cluster), each with its problems."""
    sender = sender_of(who)
    if sender is None:
        return found
    kept: list[bytes] = []
    problems = list(found.problems)
    for payload in found.payloads:
        refused = check_envelope(payload, place, sender)
        if refused:
            problems += [Problem(p.reason, place, 0, "gateway", p.path, code=p.code) for p in refused]
        else:
            kept.append(payload)
    return Envelopes(kept, problems, found.received)
