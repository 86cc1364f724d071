"""`hpcbus deadletter list|replay`: inspect and re-inject dead-lettered messages.

A dead-lettered message is the original payload, published to `<cluster>.deadletter.<category>` with the
headers `Hpcbus-Subject` (where it came from) and `Hpcbus-Problems` (JSON list of problems). Replay
publishes the payload to its original subject (after the operator fixed the cause, e.g. InfluxDB's schema
or the producer) and deletes it from the dead-letter stream once JetStream acknowledged the re-publish.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys

from hpcbus.settings import SettingsError, bus_settings

HELP = "list or replay messages the workers dead-lettered"
USES_BUS = True

log = logging.getLogger("hpcbus.deadletter")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["list", "replay"], help="list: print them; replay: re-publish them")
    p.add_argument("--seq", type=int, action="append", help="only this stream sequence (repeatable)")
    p.add_argument("--json", action="store_true", help="list as JSON lines")


async def main(args: argparse.Namespace) -> int:
    from nats.js.errors import NotFoundError

    from hpcbus.bus import connect, deadletter_stream

    bus = bus_settings(args)
    if not bus.cluster:
        raise SettingsError("--cluster (HPCBUS_CLUSTER) is required")
    nc = await connect(bus, "hpcbus-deadletter")
    js = nc.jetstream()
    stream = deadletter_stream(bus.cluster).name
    count = 0
    try:
        try:
            info = await js.stream_info(stream)
        except NotFoundError:
            print(f"no dead-letter stream {stream}: nothing was ever rejected", file=sys.stderr)
            return 0
        seqs = args.seq or range(info.state.first_seq, info.state.last_seq + 1)
        for seq in seqs:
            try:
                msg = await js.get_msg(stream, seq)
            except NotFoundError:
                continue  # deleted (replayed) or expired
            headers = msg.headers or {}
            origin = headers.get("Hpcbus-Subject", "")
            problems = json.loads(headers.get("Hpcbus-Problems", "[]"))
            if args.action == "list":
                record = {"seq": seq, "time": str(msg.time), "subject": origin, "problems": problems}
                if args.json:
                    print(json.dumps(record))
                else:
                    print(f"#{seq} {msg.time} {origin}: {len(problems)} problem(s)")
                    for problem in problems:
                        where = f"line {problem.get('line')}" if problem.get("line") else ""
                        print(f"    {where} {problem.get('path', '')}: {problem.get('reason', '')}".rstrip())
            else:
                if not origin:
                    log.warning("#%d has no Hpcbus-Subject header; left in place", seq)
                    continue
                await js.publish(origin, msg.data or b"", timeout=10)
                await js.delete_msg(stream, seq)
                log.info("#%d replayed to %s", seq, origin)
            count += 1
    finally:
        await nc.close()
    if args.action == "replay":
        print(f"replayed {count} message(s)", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    return asyncio.run(main(args))
