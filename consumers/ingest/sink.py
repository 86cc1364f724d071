"""The ingest sink: a node's message is forwarded only with what that node may say about itself.

The broker says who sent a message (a node credential may publish on `<cluster>.ingest.<own host>.>` only,
`hpcbus deploy nats-auth`); this sink checks that each line names that host (`hostname=`, or cc-metric-
store's `host=`) and no other in any host tag (`schemas.names.HOST_TAGS`: `hostname=n001,host=n002` from n001
is refused, whichever tag a reader keys on), that a `cluster=` tag names the subject's cluster, that a Sonar envelope's
`data.attributes.node` is the host and its `cluster` (and those of its errors) the subject's cluster (the
translation tags its lines with them), and that a node does not send what only the batch-system producers send
(`events.job`, Sonar job and cluster records). What passes goes to the subject it stands for
(`<cluster>.metrics`, ...), where every ClusterCockpit subscriber reads it; each refused line is reported on
`<cluster>.log.hpcbus` (who: the credential's host, what: line and reason, when: the report's time) and the
original message goes to the dead-letter stream. A refused line is never forwarded, so never stored.

Forwarded messages keep the bytes the node sent when nothing was refused and every node-level line was in
its bus form (`schemas.lineprotocol.node_level_tags`: an older agent's `type=node,type-id=0` is forwarded
without the `type-id`, or the metric store would keep it below the host), with `Nats-Msg-Id` =
`msg_id(target, payload)`, the id the node computed for the subject it stands for: a node's re-send after a
lost ack and a redelivery to this worker are both dropped by the telemetry stream's duplicate window.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable

import msgspec
from nats.aio.msg import Msg

from hpcbus.counters import Counters
from hpcbus.outlet import Outlet, PublishFailed
from hpcbus.retry import Stopping
from hpcbus.runner import BadInput, SinkBase
from hpcbus.schemas import subjects
from hpcbus.schemas.lineprotocol import format_line, parse_payload
from hpcbus.schemas.lineprotocol.timestamps import DEFAULT_MAX_FUTURE
from hpcbus.schemas.names import HOST_TAGS
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.translate import msg_id

log = logging.getLogger("hpcbus.ingest")

MASTER_ONLY_EVENTS = frozenset({"job"})
"""Event classes only the batch-system producers send: cc-backend creates and stops jobs from them."""
NODE_SONAR_KINDS = frozenset({"sample", "sysinfo"})
"""Sonar envelopes a node sends (job and cluster records come from the batch-system producers)."""


class IngestCounters(Counters):
    """The standard counters (`rejected`: refused lines and envelopes) and what went on."""

    forwarded_messages: int = 0
    forwarded_lines: int = 0


class Forward(msgspec.Struct):
    subject: str
    payload: bytes


class Batch(msgspec.Struct):
    forward: list[Forward] = msgspec.field(default_factory=list)
    done: int = 0
    """Items of `forward` already delivered."""


class _Envelope(msgspec.Struct):
    data: dict[str, object] = msgspec.field(default_factory=dict)
    errors: list[dict[str, object]] = msgspec.field(default_factory=list)


def check_lines(payload: bytes, place: str, host: str, cluster: str) -> tuple[list[str], list[Problem], bool]:
    """The texts of the lines `host` may send, a problem for each line it may not (or that is broken), and
    whether a node-level line was not in its bus form (`type=node,type-id=0` from an older agent or a
    collector, which the metric store would keep below the host): then the texts, not the payload, go on."""
    parsed = parse_payload(payload, now=int(time.time()), place=place, max_future=DEFAULT_MAX_FUTURE)
    problems = list(parsed.errors)
    good: list[str] = []
    reformed = False
    for i, line in enumerate(parsed.lines):
        tags = line.tags
        tag_cluster = tags.get("cluster")
        forged = next((key for key in HOST_TAGS if key in tags and tags[key] != host), "")
        reason = ""
        if "hostname" not in tags:
            reason = f"no hostname tag; a line from the credentials of {host} must say hostname={host}"
        elif forged:
            reason = f"claims {forged}={tags[forged]} but was published with the credentials of {host}"
        elif tag_cluster is not None and tag_cluster != cluster:
            reason = f"claims cluster={tag_cluster} but was published on cluster {cluster}'s ingest subject"
        if reason:
            path = f"tag {forged}" if forged else f"measurement {line.measurement}"
            problems.append(Problem(reason, place, 0, "ingest", path))
            continue
        text = parsed.texts[i] if i < len(parsed.texts) else ""
        if not text:  # the parser put it in canonical form (for a node-level line: its bus form)
            reformed = reformed or line.tags.get("type") == "node"
            text = format_line(line)
        good.append(text)
    return good, problems, reformed


def check_envelope(payload: bytes, place: str, host: str, cluster: str) -> list[Problem]:
    """Problems of a Sonar envelope from `host` on `cluster`'s ingest subject: it must name `host` as its
    node, and no other cluster (the Sonar translation tags its lines with the envelope's cluster, so an
    unchecked one would put them on another cluster's subjects)."""
    try:
        env = msgspec.json.decode(payload, type=_Envelope)
    except msgspec.DecodeError as exc:
        return [Problem(f"not a Sonar envelope: {exc}", place, 0, "ingest")]
    problems: list[Problem] = []

    def claim(path: str, key: str, value: object) -> None:
        reason = f"claims {key}={value} but was published with the credentials of {host}"
        if key == "cluster":
            reason += f" on cluster {cluster}'s ingest subject"
        problems.append(Problem(reason, place, 0, "ingest", path))

    attributes = env.data.get("attributes")
    attrs = attributes if isinstance(attributes, dict) else {}
    if env.data and attrs.get("node") != host:
        claim("data.attributes.node", "node", attrs.get("node"))
    if attrs.get("cluster", cluster) != cluster:
        claim("data.attributes.cluster", "cluster", attrs.get("cluster"))
    for i, error in enumerate(env.errors):
        for key, own in (("node", host), ("cluster", cluster)):
            if error.get(key, own) != own:
                claim(f"errors[{i}].{key}", key, error.get(key))
    return problems


class IngestSink(SinkBase):
    """Check and forward messages of the ingest stream (see the module docstring)."""

    def __init__(self, outlet: Outlet, name: str) -> None:
        self.outlet = outlet
        self.prefix = outlet.prefix
        self.name = name
        self.counters = IngestCounters()
        self._batch = Batch()

    # -- runner interface -------------------------------------------------------------------------------
    def take(self, msg: Msg) -> int:
        """Keep what the node may say for forwarding; `BadInput` names the rest (the runner reports and
        dead-letters the message after the batch is forwarded)."""
        try:
            ingest = subjects.parse_ingest(msg.subject, self.prefix)
        except subjects.SubjectError as exc:
            raise BadInput([Problem(str(exc), msg.subject, 0, "subject")], 1) from None
        target = ingest.target
        place = msg.subject
        if target.category == "events" and target.detail in MASTER_ONLY_EVENTS:
            reason = f"{ingest.host} may not send {target.detail} events (only the batch-system producers do)"
            raise BadInput([Problem(reason, place, 0, "ingest")], 1)
        if target.category == "sonar":
            if target.detail not in NODE_SONAR_KINDS:
                reason = f"{ingest.host} may not send Sonar {target.detail} records"
                raise BadInput([Problem(reason, place, 0, "ingest")], 1)
            problems = check_envelope(msg.data, place, ingest.host, target.cluster)
            if problems:
                raise BadInput(problems, 1)
            self._forward(str(target), msg.data)
            return 1
        good, problems, reformed = check_lines(msg.data, place, ingest.host, target.cluster)
        if problems or reformed:
            if good:
                self._forward(str(target), ("\n".join(good) + "\n").encode())
        else:
            self._forward(str(target), msg.data)
        self.counters.forwarded_lines += len(good)
        if problems:
            raise BadInput(problems, max(1, len(good)))
        return max(1, len(good))

    def cut(self) -> Batch:
        batch, self._batch = self._batch, Batch()
        return batch

    async def deliver(
        self, batch: object, still_working: Callable[[], Awaitable[None]], stopping: Stopping
    ) -> bool:
        assert isinstance(batch, Batch)
        try:
            while batch.done < len(batch.forward):
                item = batch.forward[batch.done]
                headers = {"Nats-Msg-Id": msg_id(item.subject, item.payload)}
                await self.outlet.publish_retrying(
                    item.subject, item.payload, headers, stopping, on_retry=still_working
                )
                batch.done += 1
                self.counters.forwarded_messages += 1
        except PublishFailed:
            return False
        return True

    # -- helpers ----------------------------------------------------------------------------------------
    def _forward(self, subject: str, payload: bytes) -> None:
        self._batch.forward.append(Forward(subject, payload))
