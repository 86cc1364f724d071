"""`Message`: one NATS message as producers hand it to the outbox (`hpcbus.outbox`) and JetStream.

The `msg_id` is the `Nats-Msg-Id` header, derived from the content (`schemas.translate.msg_id`, or the OCS
producer's file position), so a message sent again after a lost ack is dropped by the stream's duplicate
window. `array_like` keeps the spill-file form (msgpack) a compact `[subject, payload, msg_id]`.
"""

from __future__ import annotations

import msgspec

__all__ = ["Message"]


class Message(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """One NATS message: where it goes, its bytes, and its `Nats-Msg-Id`."""

    subject: str
    payload: bytes
    msg_id: str
