"""Which stream sequences were already reported as discarded unread, shared by every worker of a durable.

Workers bound to one durable all see the same discard (the stream's first sequence past the durable's last
delivered one); counted by each, a loss of 238 messages read as 476. The reported ranges therefore live in a
JetStream key-value entry (bucket `<stream>_discards`, key: the durable) that every worker updates with
compare-and-set on its revision: of two workers claiming the same range, exactly one gets it. Where the
bucket cannot be used (an identity without its permissions, a server without JetStream KV) the ranges are
kept in this process only, said once as a WARNING: each worker of the durable then counts a shared discard.
"""

from __future__ import annotations

import logging

import msgspec
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import (
    BucketNotFoundError,
    KeyDeletedError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
)
from nats.js.kv import KeyValue

from hpcbus.bus import discards_bucket

log = logging.getLogger("hpcbus.runner")

KEPT_RANGES = 32
"""Ranges kept per durable: a discard is reported within seconds, so only the latest can be claimed again."""

Range = tuple[int, int]


def subtract(ranges: list[Range], lo: int, hi: int) -> list[Range]:
    """The parts of `lo..hi` (inclusive) that no range of `ranges` (sorted, disjoint) covers."""
    out: list[Range] = []
    at = lo
    for a, b in ranges:
        if b < at:
            continue
        if a > hi:
            break
        if a > at:
            out.append((at, a - 1))
        at = max(at, b + 1)
        if at > hi:
            return out
    if at <= hi:
        out.append((at, hi))
    return out


def merge(ranges: list[Range], new: list[Range]) -> list[Range]:
    """`ranges` with `new` added, sorted, adjacent ones joined, only the latest `KEPT_RANGES`."""
    out: list[Range] = []
    for a, b in sorted([*ranges, *new]):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out[-KEPT_RANGES:]


class Ledger:
    """The ranges of stream `stream` reported for durable `durable` (see the module docstring)."""

    def __init__(self, js: JetStreamContext, stream: str, durable: str, replicas: int = 1) -> None:
        self.js = js
        self.stream = stream
        self.durable = durable
        self.replicas = replicas
        self._kv: KeyValue | None = None
        self._local: list[Range] = []
        self._shared = True

    async def _bucket(self) -> KeyValue:
        if self._kv is None:
            name = discards_bucket(self.stream)
            try:
                self._kv = await self.js.key_value(name)
            except BucketNotFoundError:
                config = KeyValueConfig(
                    bucket=name, history=1, replicas=self.replicas, storage=StorageType.FILE
                )
                try:
                    self._kv = await self.js.create_key_value(config)
                except Exception:  # another worker created it meanwhile (with other settings)
                    self._kv = await self.js.key_value(name)
        return self._kv

    async def claim(self, lo: int, hi: int, last_seq: int | None = None) -> list[Range]:
        """Mark `lo..hi` as reported and return the parts no worker of the durable had reported before.
        `last_seq`: the stream's last sequence now; a kept range beyond it means the stream was recreated
        (its sequences restarted), and the old ranges are dropped."""
        if self._shared:
            try:
                return await self._claim_shared(lo, hi, last_seq)
            except Exception as exc:
                self._shared = False
                log.warning(
                    "stream %s, durable %s: the key-value bucket %s that lets workers of one durable report a "
                    "discard once cannot be used (%s); this worker keeps its own record, so each worker of "
                    "the durable counts a discard they share",
                    self.stream,
                    self.durable,
                    discards_bucket(self.stream),
                    exc,
                )
        self._local, new = self._apply(self._local, lo, hi, last_seq)
        return new

    @staticmethod
    def _apply(
        ranges: list[Range], lo: int, hi: int, last_seq: int | None
    ) -> tuple[list[Range], list[Range]]:
        if last_seq is not None and ranges and ranges[-1][1] > last_seq:
            ranges = []  # the stream was recreated: its sequences start again at 1
        new = subtract(ranges, lo, hi)
        return merge(ranges, new), new

    async def _claim_shared(self, lo: int, hi: int, last_seq: int | None) -> list[Range]:
        kv = await self._bucket()
        for _ in range(20):
            try:
                entry = await kv.get(self.durable)
                ranges = [(int(a), int(b)) for a, b in msgspec.json.decode(entry.value or b"[]")]
                revision = entry.revision or 0
            except KeyDeletedError as exc:
                ranges, revision = [], exc.entry.revision if exc.entry else 0
            except KeyNotFoundError:
                ranges, revision = [], 0
            ranges, new = self._apply(ranges, lo, hi, last_seq)
            if not new:
                return []
            try:
                await kv.update(self.durable, msgspec.json.encode(ranges), last=revision)
            except KeyWrongLastSequenceError:
                continue  # another worker reported meanwhile: read again
            return new
        raise RuntimeError("the entry kept changing under 20 attempts")
