"""`hpcbus pub SUBJECT [BODY]`: publish what a person types, the way `nats pub` does.

Same conventions as the nats CLI so instructions carry over: BODY is sent byte for byte with no added
newline; without BODY, standard input is sent as one message at EOF, or one message per line with
`--send-on newline`; `-H key:value` adds headers. `--validate` checks line protocol first and refuses to
send bad lines (the bus would dead-letter them anyway). `--jetstream` waits for the stream's ack.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time

from hpcbus.settings import SettingsError, bus_settings

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


def _bodies(args: argparse.Namespace) -> list[bytes]:
    if args.body is not None:
        return [args.body.encode()]
    data = sys.stdin.buffer.read()
    if args.send_on == "newline":
        return [line for line in data.split(b"\n") if line.strip()]
    return [data]


async def main(args: argparse.Namespace) -> int:
    from hpcbus.bus import connect
    from schemas.lineprotocol import parse_payload

    headers = {}
    for item in args.header:
        key, sep, value = item.partition(":")
        if not sep:
            raise SettingsError(f"-H {item!r}: expected KEY:VALUE")
        headers[key.strip()] = value.strip()
    bodies = _bodies(args)
    if args.validate:
        bad = 0
        for body in bodies:
            for problem in parse_payload(body, now=int(time.time()), place=args.subject).problems:
                print(problem, file=sys.stderr)
                bad += problem.severity == "error"
        if bad:
            print(f"not sent: {bad} bad line(s)", file=sys.stderr)
            return 1
    nc = await connect(bus_settings(args), "hpcbus-pub")
    try:
        for body in bodies:
            if args.jetstream:
                ack = await nc.jetstream().publish(args.subject, body, headers=headers or None, timeout=10)
                print(
                    f"stored as {ack.stream} #{ack.seq}" + (" (duplicate)" if ack.duplicate else ""),
                    file=sys.stderr,
                )
            else:
                await nc.publish(args.subject, body, headers=headers or None)
        await nc.flush()
    finally:
        await nc.close()
    return 0


def run(args: argparse.Namespace) -> int:
    return asyncio.run(main(args))
