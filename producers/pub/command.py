"""`hpcbus pub SUBJECT [BODY]`: publish what a person types, the way `nats pub` does.

Same conventions as the nats CLI so instructions carry over: BODY is sent byte for byte with no added
newline; without BODY, standard input is sent as one message at EOF, or one message per line with
`--send-on newline`; `-H key:value` adds headers. `--validate` checks line protocol (Sonar envelopes on
`<cluster>.sonar.<kind>`) first and refuses to send bad lines (the bus would dead-letter them anyway). `--jetstream` waits for the stream's ack.

With a subject prefix (`--subject-prefix cc`, `HPCBUS_SUBJECT_PREFIX`) SUBJECT is read within the tree:
`fox.metrics` goes to `cc.fox.metrics`, the subject every hpcbus consumer of that bus reads; a SUBJECT that
is already a hpcbus subject under the prefix (`cc.fox.metrics`) is sent as it is.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time

from hpcbus.settings import SettingsError, bus_settings
from schemas.lineprotocol.timestamps import DEFAULT_MAX_FUTURE
from schemas.problems import InvalidInput, Problem

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


def problems_of(body: bytes, subject: str, prefix: str) -> list[Problem]:
    """What `--validate` finds in one message: the Sonar envelopes of a body for `<cluster>.sonar.<kind>` (the
    decoder every worker uses: names, host lists, ...), line protocol for any other subject."""
    from schemas import subjects
    from schemas.lineprotocol import parse_payload

    try:
        parsed = subjects.parse(subject, prefix)
    except subjects.SubjectError:
        parsed = None
    if parsed is None or parsed.category != "sonar":
        return parse_payload(
            body, now=int(time.time()), place=subject, max_future=DEFAULT_MAX_FUTURE
        ).problems
    from schemas.sonar import iter_envelopes

    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return [
            Problem(f"not UTF-8 ({exc.reason} at byte {exc.start})", subject, kind=f"sonar {parsed.detail}")
        ]
    problems: list[Problem] = []
    for _, item in iter_envelopes(text, expect=parsed.detail):
        if isinstance(item, InvalidInput):
            problems.extend(p.located(subject) for p in item.problems)
    return problems


async def main(args: argparse.Namespace) -> int:
    from hpcbus.bus import connect
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
            for problem in problems_of(body, subject, bus.subject_prefix):
                print(problem, file=sys.stderr)
                bad += problem.severity == "error"
        if bad:
            print(f"not sent: {bad} bad line(s)", file=sys.stderr)
            return 1
    nc = await connect(bus, "hpcbus-pub")
    try:
        for body in bodies:
            if args.jetstream:
                ack = await nc.jetstream().publish(subject, body, headers=headers or None, timeout=10)
                print(
                    f"stored as {ack.stream} #{ack.seq}" + (" (duplicate)" if ack.duplicate else ""),
                    file=sys.stderr,
                )
            else:
                await nc.publish(subject, body, headers=headers or None)
        await nc.flush()
    finally:
        await nc.close()
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(main(args))
    except SettingsError as exc:
        log.error("%s", exc)
        return 2
