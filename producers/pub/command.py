"""`hpcbus pub SUBJECT [BODY]`: publish what a person types, the way `nats pub` does.

Same conventions as the nats CLI so instructions carry over: BODY is sent byte for byte with no added
newline; without BODY, standard input is sent as one message at EOF, or one message per line with
`--send-on newline`; `-H key:value` adds headers. `--validate` checks line protocol first and refuses to
send bad lines (the bus would dead-letter them anyway). `--jetstream` waits for the stream's ack.

With a subject prefix (`--subject-prefix cc`, `HPCBUS_SUBJECT_PREFIX`) SUBJECT is read within the tree:
`fox.metrics` goes to `cc.fox.metrics`, the subject every hpcbus consumer of that bus reads; a SUBJECT that
is already a hpcbus subject under the prefix (`cc.fox.metrics`) is sent as it is.

A Sonar envelope on `<cluster>.sonar.<kind>` goes as the gateway sends it: with a `Nats-Msg-Id` from its
content, and a jobs or cluster envelope larger than the server's `max_payload` in parts (`sonar_messages`);
a sample or a single record too large for one message is not sent, named on stderr, exit status 1.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
from typing import TYPE_CHECKING

from hpcbus.settings import SettingsError, bus_settings
from schemas.lineprotocol.timestamps import DEFAULT_MAX_FUTURE
from schemas.problems import Problem

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

HELP = "publish a message by hand (like `nats pub`), optionally checking line protocol first"
USES_BUS = True

log = logging.getLogger("hpcbus.pub")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("subject", help="e.g. fox.metrics")
    p.add_argument("body", nargs="?", help="message body; standard input when left out")
    p.add_argument("-H", "--header", action="append", default=[], metavar="KEY:VALUE", help="add a header")
    p.add_argument(
        "--send-on", choices=["eof", "newline"], default="eof", help="stdin: one message, or one per line"
    )
    p.add_argument("--validate", action="store_true", help="check line protocol and refuse to send bad lines")
    p.add_argument("--jetstream", action="store_true", help="wait for the JetStream ack")


def full_subject(subject: str, prefix: str) -> str:
    """SUBJECT with the subject prefix in front, unless it already is a hpcbus subject under it."""
    from schemas import subjects

    if not prefix:
        return subject
    try:
        subjects.parse(subject, prefix)
    except subjects.SubjectError:
        return f"{subjects.check_prefix(prefix)}.{subject}"
    return subject


def _bodies(args: argparse.Namespace) -> list[bytes]:
    if args.body is not None:
        return [args.body.encode()]
    data = sys.stdin.buffer.read()
    if args.send_on == "newline":
        return [line for line in data.split(b"\n") if line.strip()]
    return [data]


async def main(args: argparse.Namespace) -> int:
    from hpcbus.bus import TooLarge, check_size, connect, js_publish
    from schemas.lineprotocol import parse_payload
    from schemas.subjects import SubjectError

    headers = {}
    for item in args.header:
        key, sep, value = item.partition(":")
        if not sep:
            raise SettingsError(f"-H {item!r}: expected KEY:VALUE")
        headers[key.strip()] = value.strip()
    bus = bus_settings(args)
    try:
        subject = full_subject(args.subject, bus.subject_prefix)
    except SubjectError as exc:
        raise SettingsError(f"--subject-prefix: {exc}") from None
    bodies = _bodies(args)
    if args.validate:
        bad = 0
        for body in bodies:
            now = int(time.time())
            for problem in parse_payload(
                body, now=now, place=subject, max_future=DEFAULT_MAX_FUTURE
            ).problems:
                print(problem, file=sys.stderr)
                bad += problem.severity == "error"
        if bad:
            print(f"not sent: {bad} bad line(s)", file=sys.stderr)
            return 1
    nc = await connect(bus, "hpcbus-pub")
    refused = 0
    try:
        kind = sonar_kind(subject, bus.subject_prefix)
        for body in bodies:
            messages = [(body, headers)]
            if kind:
                messages, problems = sonar_messages(subject, body, kind, headers, server_limit(nc))
                for problem in problems:
                    print(f"not sent: {problem}", file=sys.stderr)
                refused += len(problems)
            for payload, message_headers in messages:
                if args.jetstream:
                    ack = await js_publish(nc, subject, payload, message_headers or None, 10)
                    print(
                        f"stored as {ack.stream} #{ack.seq}" + (" (duplicate)" if ack.duplicate else ""),
                        file=sys.stderr,
                    )
                else:
                    check_size(nc, subject, payload, message_headers or None)
                    await nc.publish(subject, payload, headers=message_headers or None)
        await nc.flush()
    except TooLarge as exc:
        print(f"not sent: {exc}", file=sys.stderr)
        return 1
    finally:
        await nc.close()
    return 1 if refused else 0


def sonar_kind(subject: str, prefix: str) -> str:
    """The envelope kind when `subject` is `<cluster>.sonar.<kind>`, else ""."""
    from schemas import subjects

    try:
        parsed = subjects.parse(subject, prefix)
    except subjects.SubjectError:
        return ""
    return parsed.detail if parsed.category == "sonar" and parsed.detail in subjects.SONAR_KINDS else ""


def server_limit(nc: NATS) -> int:
    """What the server announced as `max_payload` (the default until it said)."""
    from hpcbus.bus import DEFAULT_MAX_PAYLOAD

    return int(nc.max_payload or DEFAULT_MAX_PAYLOAD)


def sonar_messages(
    subject: str, body: bytes, kind: str, headers: dict[str, str], server: int
) -> tuple[list[tuple[bytes, dict[str, str]]], list[Problem]]:
    """A Sonar envelope as the gateway publishes it: cut to what the server takes (a jobs or cluster
    envelope in parts with the same meta and attributes, a sample never), each message with its
    content-derived `Nats-Msg-Id` (so a repeated `pub` is dropped by JetStream), unless `-H` set one for an
    envelope that goes whole. A body that is not one valid envelope goes as it is when it fits (the bus
    dead-letters it with its problems), and is refused when it does not (it cannot be cut)."""
    from hpcbus.bus import header_bytes, sonar_limit
    from schemas.problems import InvalidInput
    from schemas.sonar import decode_envelope
    from schemas.translate import envelope_messages

    limit = sonar_limit(server, headers)
    try:
        env = decode_envelope(body, expect=kind)
    except InvalidInput as exc:
        if len(body) + header_bytes(headers) <= server:
            return [(body, headers)], []
        reason = f"{len(body)} bytes, more than the server takes ({server}), and not one valid envelope"
        return [], [Problem(f"{reason} ({exc.problems[0]})", subject, kind=f"sonar {kind}")]
    # as the gateway publishes one envelope: without the newline around it (the same bytes, the same id)
    messages, problems = envelope_messages(subject, body.strip(), limit, env=env)
    if len(messages) == 1 and "Nats-Msg-Id" in headers:
        return [(messages[0].payload, headers)], problems
    return [(m.payload, {**headers, "Nats-Msg-Id": m.msg_id}) for m in messages], problems


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(main(args))
    except SettingsError as exc:
        log.error("%s", exc)
        return 2
