"""The outbox's publishing rules, against a stand-in connection (the bus behaviour is in the producer tests)."""

from __future__ import annotations

import pytest

from hpcbus.bus import TooLarge, check_size, header_bytes
from hpcbus.outbox import Outbox, OutboxSettings, split_lines
from hpcbus.schemas.translate import msg_id


class _FakeJs:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes, dict[str, str]]] = []

    async def publish(self, subject, payload, timeout, headers):
        self.sent.append((subject, payload, headers))
        return "ack"


class _FakeNc:
    def __init__(self, max_payload: int) -> None:
        self.max_payload = max_payload
        self.is_connected = True
        self.js = _FakeJs()

    def jetstream(self) -> _FakeJs:
        return self.js


def test_header_bytes_match_the_wire_form():
    # NATS/1.0\r\n + "Nats-Msg-Id: abc\r\n" + \r\n
    assert header_bytes({"Nats-Msg-Id": "abc"}) == len(b"NATS/1.0\r\nNats-Msg-Id: abc\r\n\r\n")
    assert header_bytes(None) == 0


def test_a_message_over_the_limit_with_its_headers_is_refused_before_sending():
    nc = _FakeNc(100)
    check_size(nc, "s", b"x" * 100, None)  # type: ignore[arg-type]
    with pytest.raises(TooLarge, match="over the server's max_payload of 100"):
        check_size(nc, "s", b"x" * 90, {"Nats-Msg-Id": "abc"})  # type: ignore[arg-type]


def test_split_lines_keeps_every_line_and_each_piece_under_the_limit():
    payload = b"a 1\nbb 2\n\nccc 3\n"
    pieces = split_lines(payload, 9)
    assert b"".join(pieces) == b"a 1\nbb 2\nccc 3\n"
    assert all(len(p) <= 9 for p in pieces)


async def test_outbox_cuts_at_line_ends_and_drops_only_a_line_too_long():
    limit = header_bytes({"Nats-Msg-Id": "x" * 64}) + 10
    nc = _FakeNc(limit)
    outbox = Outbox(OutboxSettings())
    payload = b"a 1\nbbbbbbbbbbbbbbbbbbbbbbbb 2\nc 3\nd 4\n"
    queued = outbox._queue
    outbox.put("s", payload, "x" * 64)
    await outbox._publish(nc, queued[0])  # type: ignore[arg-type]
    sent = nc.js.sent
    assert [p for _, p, _ in sent] == [b"a 1\n", b"c 3\nd 4\n"]
    assert [h["Nats-Msg-Id"] for _, p, h in sent] == [msg_id("s", p) for _, p, _ in sent]
    assert outbox.counters.oversized == 1
    sent.clear()
    outbox.put("s", b"a 1\n", "y")
    await outbox._publish(nc, queued[1])  # type: ignore[arg-type]
    assert sent == [("s", b"a 1\n", {"Nats-Msg-Id": "y"})]  # fits: sent as queued, with its own id
    nc.is_connected = False
    with pytest.raises(ConnectionError):  # the outbox keeps it and retries later
        await outbox._publish(nc, queued[1])  # type: ignore[arg-type]


def test_the_sonar_limit_is_one_calculation() -> None:
    """The gateway and `hpcbus pub` cut Sonar envelopes to the same size: `max_payload` less the headers."""
    from hpcbus.bus import DEFAULT_MAX_PAYLOAD, ID_HEADER_BYTES, sonar_limit

    assert sonar_limit(100_000) == 100_000 - ID_HEADER_BYTES
    assert sonar_limit(None) == DEFAULT_MAX_PAYLOAD - ID_HEADER_BYTES
    assert sonar_limit(100_000, {"X-A": "b"}) == 100_000 - header_bytes({"X-A": "b", "Nats-Msg-Id": "0" * 64})
    assert sonar_limit(100_000, {"Nats-Msg-Id": "mine"}) == sonar_limit(100_000)  # room for any id
