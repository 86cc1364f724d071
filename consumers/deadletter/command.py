"""`hpcbus deadletter list|replay`: inspect and re-inject dead-lettered messages.

A dead-lettered message is the original payload, published to `<cluster>.deadletter.<category>` with the
headers `Hpcbus-Subject` (where it came from) and `Hpcbus-Problems` (JSON list of problems); one too large
for the server's `max_payload` with those headers is stored in parts (`Hpcbus-Part: i/n`, `Hpcbus-Original`)
and shown and replayed as the one message it was. Replay
publishes the payload to its original subject (after the operator fixed the cause, e.g. InfluxDB's schema
or the producer) and deletes it from the dead-letter stream once JetStream acknowledged the re-publish.

With a subject prefix (`--subject-prefix cc`) the dead letters are under it (`cc.<cluster>.deadletter.>`,
stream named by the cluster alone, `HPCBUS_DLQ_<cluster>`), and so are the subjects they replay to; a dead
letter from before the prefix was turned on (`<cluster>.metrics`) is replayed under it (`cc.<cluster>.metrics`),
where the consumers now read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys

from hpcbus.settings import BUS_CLIENT, add_connect_timeout, bus_settings
from hpcbus.settings import clusters as cluster_names

HELP = "list or replay messages the workers dead-lettered"
USES_BUS = True
SECTIONS = (BUS_CLIENT,)

log = logging.getLogger("hpcbus.deadletter")


def replay_subject(origin: str, prefix: str) -> str:
    """Where a dead letter from `origin` is replayed: `origin`, moved under `prefix` when it is a hpcbus
    subject without it."""
    from hpcbus.schemas import subjects

    if not prefix or origin.startswith(prefix + "."):
        return origin
    try:
        parsed = subjects.parse(origin)
    except subjects.SubjectError:
        return origin
    return str(subjects.Subject(parsed.cluster, parsed.category, parsed.detail, prefix))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["list", "replay"], help="list: print them; replay: re-publish them")
    p.add_argument("--seq", type=int, action="append", help="only this stream sequence (repeatable)")
    p.add_argument("--json", action="store_true", help="list as JSON lines")
    add_connect_timeout(p)


async def main(args: argparse.Namespace) -> int:
    from nats.js.errors import NotFoundError

    from hpcbus.bus import Unreachable, connect_once, deadletter_stream

    bus = bus_settings(args)
    (cluster,) = cluster_names(bus)
    try:
        nc = await connect_once(bus, "hpcbus-deadletter", args.connect_timeout)
    except Unreachable as exc:
        print(f"hpcbus deadletter: {exc}", file=sys.stderr)
        return 3  # as `status` and `tail`: NATS not reachable
    js = nc.jetstream()
    stream = deadletter_stream(cluster, prefix=bus.subject_prefix).name
    count = 0
    try:
        try:
            info = await js.stream_info(stream)
        except NotFoundError:
            print(f"no dead-letter stream {stream}: nothing was ever rejected", file=sys.stderr)
            return 0
        seqs = args.seq or range(info.state.first_seq, info.state.last_seq + 1)
        if not info.state.messages:
            seqs = []
        parts: dict[str, dict[int, tuple[int, bytes]]] = {}
        """Hpcbus-Original -> part number -> (sequence, bytes): a dead letter cut to fit max_payload."""
        for seq in seqs:
            try:
                msg = await js.get_msg(stream, seq)
            except NotFoundError:
                continue  # deleted (replayed) or expired
            headers = msg.headers or {}
            origin = headers.get("Hpcbus-Subject", "")
            problems = json.loads(headers.get("Hpcbus-Problems", "[]"))
            data, seqs_of = msg.data or b"", [seq]
            if "Hpcbus-Part" in headers:
                number, _, total = headers["Hpcbus-Part"].partition("/")
                group = parts.setdefault(headers.get("Hpcbus-Original", ""), {})
                group[int(number)] = (seq, data)
                if len(group) < int(total):
                    continue  # the rest of it comes later in the stream
                seqs_of = [group[i][0] for i in sorted(group)]
                data = b"".join(group[i][1] for i in sorted(group))
            if args.action == "list":
                record = {
                    "seq": seq,
                    "time": str(msg.time),
                    "subject": origin,
                    "problems": problems,
                    "bytes": len(data),
                    "parts": seqs_of,
                }
                if args.json:
                    print(json.dumps(record))
                else:
                    cut = f" ({len(seqs_of)} parts)" if len(seqs_of) > 1 else ""
                    print(f"#{seq} {msg.time} {origin}: {len(problems)} problem(s), {len(data)} bytes{cut}")
                    for problem in problems:
                        where = f"line {problem.get('line')}" if problem.get("line") else ""
                        print(f"    {where} {problem.get('path', '')}: {problem.get('reason', '')}".rstrip())
            else:
                if not origin:
                    log.warning("#%d has no Hpcbus-Subject header; left in place", seq)
                    continue
                target = replay_subject(origin, bus.subject_prefix)
                await js.publish(target, data, timeout=10)
                for part in seqs_of:
                    await js.delete_msg(stream, part)
                log.info("#%d replayed to %s", seq, target)
            count += 1
    finally:
        await nc.close()
    if args.action == "replay":
        print(f"replayed {count} message(s)", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    return asyncio.run(main(args))
