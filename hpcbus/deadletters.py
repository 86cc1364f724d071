"""Refused input to the dead-letter stream: a message a sink refused in `take` (`Reject`), reported on the log
subject and the Python log and stored, each once, before its batch is acknowledged (`dead_letter`)."""

from __future__ import annotations

import msgspec
from nats.aio.msg import Msg

from hpcbus.counters import Counters
from hpcbus.outlet import Outlet, dedup_id
from hpcbus.retry import Stopping
from hpcbus.schemas.problems import Problem

__all__ = ["Reject", "dead_letter"]


class Reject(msgspec.Struct):
    """A refused message and its problems, waiting to be reported and dead-lettered."""

    msg: Msg
    problems: list[Problem]
    reported: bool = False
    """Its problems are on the log subject (its dead letter may still be pending)."""


async def dead_letter(outlet: Outlet, rejects: list[Reject], counters: Counters, stopping: Stopping) -> bool:
    """Report each refused message's problems (the log subject and the Python log) and store it in the
    dead-letter stream, in order, each once: a stored one leaves `rejects`, so a step resumed after a stop
    does not repeat it. Counted in `deadlettered` when stored (retried until it is: a message is acknowledged
    only once its dead letter is stored). False when the stop deadline came first (the rest stays,
    unacknowledged). The one
    place a worker's bad input goes."""
    while rejects:
        reject = rejects[0]
        if not reject.reported:
            await outlet.report_problems(reject.problems)  # best effort: also on the Python log
            reject.reported = True
        msg = reject.msg
        if not await outlet.store_deadletter(msg.subject, msg.data, reject.problems, dedup_id(msg), stopping):
            return False
        counters.deadlettered += 1
        rejects.pop(0)
    return True
