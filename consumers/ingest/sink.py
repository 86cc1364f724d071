"""The ingest sink: a node's message is forwarded only with what that node may say about itself.

The broker says who sent a message (a node credential may publish on `<cluster>.ingest.<own host>.>` only,
`hpcbus deploy nats-auth`); this sink applies the node allow-list of `schemas.trust` to it: what a node may
send at all (metrics, its logs, the event classes and Sonar kinds listed there: never `events.job`,
`events.slurm`, Sonar job and cluster records), and that every host the message names, in a tag or inside an
event's JSON or a Sonar envelope, is that host and every cluster the subject's. What passes goes to the subject it stands for
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

import msgspec
from nats.aio.msg import Msg

from hpcbus.counters import Counters
from hpcbus.outlet import Outlet
from hpcbus.retry import Stopping
from hpcbus.runner import BadInput, SinkBase
from hpcbus.schemas import subjects
from hpcbus.schemas.lineprotocol.timestamps import DEFAULT_MAX_FUTURE
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.translate import msg_id
from hpcbus.schemas.trust import Sender, check_envelope, check_lines, subject_problem

log = logging.getLogger("hpcbus.ingest")


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
        sender = Sender.node(ingest.host, target.cluster)
        refused = subject_problem(target.category, target.detail, ingest.host)
        if refused is not None:
            raise BadInput([Problem(refused, place, 0, "ingest")], 1)
        if target.category == "sonar":
            problems = check_envelope(msg.data, place, sender)
            if problems:
                raise BadInput(problems, 1)
            self._forward(str(target), msg.data)
            return 1
        good, problems, reformed = check_lines(
            msg.data,
            place,
            sender,
            target.category,
            target.detail,
            now=int(time.time()),
            max_future=DEFAULT_MAX_FUTURE,
        )
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

    async def deliver(self, batch: object, stopping: Stopping) -> None:
        """Forward the batch; a publish that fails raises (the runtime retries or dead-letters), and what
        was forwarded is not forwarded again (`Batch.done`)."""
        assert isinstance(batch, Batch)
        while batch.done < len(batch.forward):
            item = batch.forward[batch.done]
            headers = {"Nats-Msg-Id": msg_id(item.subject, item.payload)}
            await self.outlet.publish(item.subject, item.payload, headers)
            batch.done += 1
            self.counters.forwarded_messages += 1

    # -- helpers ----------------------------------------------------------------------------------------
    def _forward(self, subject: str, payload: bytes) -> None:
        self._batch.forward.append(Forward(subject, payload))
