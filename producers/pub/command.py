"""`hpcbus pub SUBJECT [BODY]`: publish what a person types, the way `nats pub` does.

Same conventions as the nats CLI so instructions carry over: BODY is sent byte for byte with no added
newline; without BODY, standard input is sent as one message at EOF, or one message per line with
`--send-on newline`; `-H key:value` adds headers.

Unlike `nats pub`, what goes to a hpcbus subject is checked first (line protocol, or Sonar JSON on
`.sonar.*`) and a bad message is not sent (exit 1; the bus would dead-letter it anyway); `--raw` sends the
bytes unchecked, on purpose. A message a stream stores is published through JetStream and its place is
printed (`stored as HPCBUS_fox #42`); `--jetstream` insists on that (exit 1 when no stream stores the
subject). A stream that would acknowledge the message and keep nothing (`stream_discard = "new"` before any
worker created its durable: `hpcbus.interest`) is said as such, nothing is sent, exit 1. When the server cannot say which stream stores it (no JetStream, no `$JS.API` rights, no answer
in time), that is said as such, not as "no stream stores it": the message goes with core NATS (and a
stream may still store it), or, with `--jetstream`, is not sent. The server gets `--connect-timeout`
seconds to answer and URLs are checked before connecting: exit 1 when NATS is unreachable, 2 for a bad URL
or setting.

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
import sys
import time
from typing import TYPE_CHECKING

from hpcbus.schemas.lineprotocol.timestamps import DEFAULT_MAX_FUTURE
from hpcbus.schemas.problems import Problem
from hpcbus.settings import BUS_CLIENT, SettingsError, add_connect_timeout, bus_settings

if TYPE_CHECKING:
    from nats.aio.client import Client as NATS

HELP = "publish a message by hand (like `nats pub`), checked first; prints where it was stored"
USES_BUS = True
SECTIONS = (BUS_CLIENT,)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("subject", help="e.g. fox.metrics")
    p.add_argument("body", nargs="?", help="message body; standard input when left out")
    p.add_argument("-H", "--header", action="append", default=[], metavar="KEY:VALUE", help="add a header")
    p.add_argument(
        "--send-on", choices=["eof", "newline"], default="eof", help="stdin: one message, or one per line"
    )
    p.add_argument(
        "--validate",
        action="store_true",
        help="check the message first (the default for hpcbus subjects; kept for old scripts)",
    )
    p.add_argument("--raw", action="store_true", help="send the bytes as they are, unchecked")
    p.add_argument(
        "--jetstream", action="store_true", help="require a stream's ack (exit 1 when no stream stores it)"
    )
    add_connect_timeout(p)


def full_subject(subject: str, prefix: str) -> str:
    """SUBJECT with the subject prefix in front, unless it already is a hpcbus subject under it."""
    from hpcbus.schemas import subjects

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


def problems(subject: str, prefix: str, bodies: list[bytes]) -> list[Problem]:
    """What is wrong with `bodies` as messages on `subject`: line protocol on a hpcbus subject, Sonar JSON on
    `.sonar.*`; nothing is checked on a subject that is not hpcbus's (it is the sender's business)."""
    from hpcbus.commands.validate import sonar_problems
    from hpcbus.schemas import subjects
    from hpcbus.schemas.lineprotocol import parse_payload

    try:
        kind = subjects.parse(subject, prefix).category
    except subjects.SubjectError:
        return []
    found: list[Problem] = []
    for body in bodies:
        now = int(time.time())
        if kind == "sonar":
            found += sonar_problems([body], subject, now + DEFAULT_MAX_FUTURE)
        else:
            found += parse_payload(body, now=now, place=subject, max_future=DEFAULT_MAX_FUTURE).problems
    return found


async def main(args: argparse.Namespace) -> int:
    from nats import errors as nats_errors

    from hpcbus.bus import TooLarge, Unasked, check_size, js_publish, refused_publish, round_trip, stored_by
    from hpcbus.connection import Unreachable, check_urls, connect_once
    from hpcbus.retry import describe
    from hpcbus.schemas.subjects import SubjectError

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
    check_urls(bus.nats)  # before reading stdin: a typo in the URL is said at once
    bodies = _bodies(args)
    if args.validate and args.raw:
        raise SettingsError("--validate and --raw: choose one")
    if not args.raw:
        found = problems(subject, bus.subject_prefix, bodies)
        for problem in found:
            print(problem, file=sys.stderr)
        if any(p.severity == "error" for p in found):
            print(f"hpcbus pub: not sent: {subject}: a bad message (--raw sends it anyway)", file=sys.stderr)
            return 1
    try:
        nc = await connect_once(bus, "hpcbus-pub", args.connect_timeout)
    except Unreachable as exc:
        print(f"hpcbus pub: not sent: {exc}", file=sys.stderr)
        return 1
    refused = 0
    try:
        unasked = ""
        try:
            stream = await stored_by(nc, subject)
        except Unasked as exc:
            stream, unasked = None, str(exc)
        if stream is None and args.jetstream:
            why = f"could not ask the server which stream stores {subject}: {unasked}"
            print(
                f"hpcbus pub: not sent: {why}"
                if unasked
                else f"hpcbus pub: not stored: no stream stores {subject}",
                file=sys.stderr,
            )
            return 1
        if stream is not None and not await kept_by(nc, stream, subject):
            return 1
        core = (
            f"core NATS only: the server could not say whether a stream stores it: {unasked}"
            if unasked
            else "no stream stores it: core NATS only"
        )
        kind = sonar_kind(subject, bus.subject_prefix)
        for body in bodies:
            messages = [(body, headers)]
            if kind:
                messages, refusals = sonar_messages(subject, body, kind, headers, server_limit(nc))
                for problem in refusals:
                    print(f"not sent: {problem}", file=sys.stderr)
                refused += len(refusals)
            for payload, message_headers in messages:
                if stream is None:  # as `nats pub` would: a plain publish, and say that nothing keeps it
                    check_size(nc, subject, payload, message_headers or None)
                    await nc.publish(subject, payload, headers=message_headers or None)
                    await round_trip(nc, args.connect_timeout)  # a refusal comes before the PONG
                    refusal = refused_publish(nc, subject)
                    if refusal is not None:
                        print(
                            f"hpcbus pub: not sent: {subject}: the server refused it: {refusal}",
                            file=sys.stderr,
                        )
                        return 1
                    print(f"sent on {subject} ({core})", file=sys.stderr)
                    continue
                try:
                    ack = await js_publish(nc, subject, payload, message_headers or None, 10)
                except (TimeoutError, ConnectionError, nats_errors.Error) as exc:
                    cause = refused_publish(nc, subject) or exc
                    print(f"hpcbus pub: not stored: {subject}: {describe(cause)}", file=sys.stderr)
                    return 1
                print(
                    f"stored as {ack.stream} #{ack.seq}" + (" (duplicate)" if ack.duplicate else ""),
                    file=sys.stderr,
                )
        await nc.flush()
    except TooLarge as exc:
        print(f"not sent: {exc}", file=sys.stderr)
        return 1
    finally:
        await nc.close()
    return 1 if refused else 0


async def kept_by(nc: NATS, stream: str, subject: str) -> bool:
    """False (said on stderr) when `stream` would acknowledge a message and keep nothing: `interest`
    retention (`stream_discard = "new"`) before any worker created its durable (`hpcbus.interest`). A
    "stored as" would then be untrue."""
    from hpcbus.interest import Interest, NoDurable

    try:
        await Interest().check_stream(nc.jetstream(timeout=2), stream)
    except NoDurable as exc:
        print(f"hpcbus pub: not sent: {subject}: {exc}", file=sys.stderr)
        return False
    return True


def sonar_kind(subject: str, prefix: str) -> str:
    """The envelope kind when `subject` is `<cluster>.sonar.<kind>`, else ""."""
    from hpcbus.schemas import subjects

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
    from hpcbus.schemas.problems import InvalidInput
    from hpcbus.schemas.sonar import decode_envelope
    from hpcbus.schemas.translate import envelope_messages

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
    return asyncio.run(main(args))
