"""`hpcbus tail SUBJECT`: `nats sub` for machines without the nats CLI.

Messages are printed as they come, one line each, flushed at once (so `hpcbus tail fox.metrics | grep ...`
works): line protocol as it is when it is one line, else summarised (lines, hosts, measurements); Sonar
envelopes summarised; `--host`, `--measurement` and `--job` keep only what matches (`--lines` prints every
matching line). It reads with a plain core subscription, so it never takes or acknowledges anything of a
durable; `--since S` first replays the last S seconds from the stream through an ephemeral consumer that
acknowledges nothing. The read-only `monitor` identity of `hpcbus deploy nats-auth` may run it.

With a subject prefix (`--subject-prefix cc`) SUBJECT is read within the tree, as `hpcbus pub` does.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from hpcbus.commands.status.settings import UNREACHABLE
from hpcbus.settings import BUS_CLIENT, bus_settings

HELP = "print messages on a subject as they come, decoded and filtered (like `nats sub`; never acks)"
USES_BUS = True
SECTIONS = (BUS_CLIENT,)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("subject", help="e.g. fox.metrics, 'fox.events.>', 'fox.>'")
    p.add_argument(
        "--host", action="append", default=[], metavar="HOST", help="only lines of this host (repeatable)"
    )
    p.add_argument(
        "--measurement",
        action="append",
        default=[],
        metavar="NAME",
        help="only this measurement (repeatable)",
    )
    p.add_argument(
        "--job",
        action="append",
        default=[],
        metavar="JOB",
        help="only lines of this job: a job id, or <job>@<epoch> as `report` names a process-group job (repeatable)",
    )
    p.add_argument("--lines", action="store_true", help="print every matching line, not one line per message")
    p.add_argument(
        "--count", type=int, default=0, metavar="N", help="stop after N printed messages (0: never)"
    )
    p.add_argument(
        "--since",
        type=float,
        default=0.0,
        metavar="S",
        help="first replay the last S seconds from the stream (a message arriving meanwhile may show twice)",
    )
    p.add_argument(
        "--timeout", type=float, default=3.0, metavar="S", help="seconds to wait for NATS to answer"
    )


async def main(args: argparse.Namespace) -> int:
    from hpcbus.bus import PERMISSIONS_VIOLATION, round_trip
    from hpcbus.commands.status.scan import read_since
    from hpcbus.commands.tail.decode import Filters, describe
    from hpcbus.connection import Unreachable, connect_once
    from hpcbus.producers.pub.command import full_subject
    from hpcbus.schemas.subjects import SubjectError
    from hpcbus.settings import SettingsError

    bus = bus_settings(args)
    try:
        subject = full_subject(args.subject, bus.subject_prefix)
    except SubjectError as exc:
        raise SettingsError(f"--subject-prefix: {exc}") from None
    filters = Filters(
        hosts=frozenset(args.host), measurements=frozenset(args.measurement), jobs=frozenset(args.job)
    )
    try:
        nc = await connect_once(bus, "hpcbus-tail", args.timeout)
    except Unreachable as exc:
        print(f"hpcbus tail: {exc}", file=sys.stderr)
        return UNREACHABLE
    printed = 0
    done = asyncio.Event()
    out = sys.stdout

    def show(subj: str, data: bytes) -> None:
        nonlocal printed
        if done.is_set():
            return
        texts = describe(subj, data, filters, all_lines=args.lines)
        if not texts:
            return
        out.write("\n".join(texts) + "\n")
        out.flush()
        printed += 1
        if args.count and printed >= args.count:
            done.set()

    live: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()

    async def on_msg(msg: object) -> None:
        live.put_nowait((msg.subject, msg.data or b""))  # type: ignore[attr-defined]

    try:
        sub = await nc.subscribe(subject, cb=on_msg)
        await round_trip(nc, args.timeout)  # the subscription is live on the server before anything is read
        if args.since > 0:
            js = nc.jetstream(timeout=args.timeout)
            try:
                stream = await js.find_stream_name_by_subject(subject)
            except Exception as exc:
                print(f"hpcbus tail: --since: no stream holds {subject} ({exc})", file=sys.stderr)
                return 1
            async for msg in read_since(
                js, stream, subject, time.time() - args.since, limit=10_000_000, timeout=args.timeout
            ):
                show(msg.subject, msg.data or b"")
                if done.is_set():
                    return 0
        while not done.is_set():
            subj, data = await live.get()
            show(subj, data)
        await sub.unsubscribe()
    except Exception as exc:
        if PERMISSIONS_VIOLATION in str(exc).lower():
            print(f"hpcbus tail: this identity may not read {subject}: {exc}", file=sys.stderr)
            return 1
        raise
    finally:
        await nc.close()
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(main(args))
    except KeyboardInterrupt:
        return 130
