"""`hpcbus status --watch`: the screen refreshed every `--refresh` seconds until Ctrl-C or SIGTERM.

Rates come from a core subscription to each cluster's tree (`traffic`), so they are what flows now (lines/s
per subject and per cluster, the busiest hosts); lag per durable from a consumer look each refresh (its ack
rate between two refreshes); silent nodes from one full `status` look at start, kept current by the
skeletons as they come; errors from `.log.>` as they come. The screen is plain text redrawn from the top
(`ESC[H ESC[2J`), every line cut to the terminal's width and the whole to its height, read again at each
refresh: a resized or tiny window (over ssh, in tmux) is drawn again, never a crash (no curses)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import sys
import time
from typing import Any

from hpcbus.commands.status import facts
from hpcbus.commands.status.health import ago
from hpcbus.commands.status.nodes import Seen, judge
from hpcbus.commands.status.render import size
from hpcbus.commands.status.settings import STATUS, UNREACHABLE, wanted_clusters
from hpcbus.commands.status.traffic import Traffic
from hpcbus.options import read_section
from hpcbus.schemas import subjects
from hpcbus.settings import bus_settings

RATE_WINDOW = 10.0
"""Seconds the rates are averaged over (fewer right after the start)."""
BUSIEST = 5
CLEAR = "\x1b[H\x1b[2J"


def window_size() -> tuple[int, int]:
    """The terminal's size now. Asked of the terminal itself: `COLUMNS`/`LINES` (which `shutil` prefers)
    are a snapshot of the size when a shell exported them, wrong after a resize."""
    for fd in (1, 2, 0):
        try:
            size = os.get_terminal_size(fd)
        except OSError:
            continue
        return size.columns, size.lines
    return shutil.get_terminal_size((80, 24))


def fit(lines: list[str], width: int, height: int) -> str:
    """The lines cut to the window: at least one column and one row, whatever the terminal says."""
    width, height = max(width, 1), max(height, 1)
    shown = [line if len(line) <= width else line[: max(width - 1, 0)] + "…" for line in lines[:height]]
    if len(lines) > height and height > 1:
        shown[-1] = f"… {len(lines) - height + 1} more lines"[:width]
    return "\n".join(shown)


def frame(
    traffic: Traffic,
    clusters: list[str],
    prefix: str,
    durables: list[facts.Durable],
    nodes: facts.Nodes,
    now: float,
    refresh: float,
) -> list[str]:
    """The lines of one screen (pure)."""
    rates = traffic.rates(now, RATE_WINDOW)
    lines = [
        f"hpcbus status --watch  {time.strftime('%H:%M:%S', time.gmtime(now))}Z  every {refresh:g} s (Ctrl-C stops)"
    ]
    for cluster in clusters:
        root = subjects.metrics(cluster, prefix=prefix).removesuffix("metrics")
        mine = {s: r for s, r in rates.items() if s.startswith(root)}
        total_lines = sum(r[1] for r in mine.values())
        total_bytes = sum(r[2] for r in mine.values())
        lines.append(f"cluster {cluster}: {total_lines:.0f} lines/s, {size(total_bytes)}/s")
        for subject, (msgs, per_s, nbytes) in sorted(mine.items(), key=lambda kv: -kv[1][1]):
            lines.append(f"  {subject:<40} {per_s:>9.0f} lines/s {msgs:>7.1f} msgs/s {size(nbytes):>10}/s")
    lines.append("durables:")
    for d in durables:
        rate = f"{d.acks_per_s:g} acks/s" if d.acks_per_s is not None else "-"
        drain = f", drains in {ago(d.drain_s)}" if d.drain_s is not None else ""
        lines.append(f"  {d.name} on {d.stream}: lag {d.pending + d.ack_pending} ({rate}{drain})")
    busiest = traffic.busiest(now, RATE_WINDOW, BUSIEST)
    if busiest:
        lines.append("busiest nodes: " + ", ".join(f"{h} {r:.0f} lines/s" for h, r in busiest))
    silent = ", ".join(
        f"{n.host} ({'' if n.exact else 'over '}{ago(now - n.last_sample if n.exact else nodes.window_s)})"
        for n in nodes.silent[:20]
    )
    more = f" and {len(nodes.silent) - 20} more" if len(nodes.silent) > 20 else ""
    lines.append(
        f"nodes: {nodes.seen} seen, {len(nodes.silent)} silent" + (f": {silent}{more}" if silent else "")
    )
    if traffic.errors:
        lines.append("latest errors:")
        lines += [f"  {e}" for e in list(traffic.errors)[-5:]]
    return lines


async def watch(args: argparse.Namespace) -> int:
    from hpcbus.commands.status.gather import ApiError, durable_facts, durables_of, gather
    from hpcbus.connection import Unreachable, check_urls, connect_once

    bus = bus_settings(args)
    settings = read_section(args, STATUS)
    check_urls(bus.nats)
    try:
        report = await gather(bus, settings, wanted_clusters(bus.cluster))
        nc = await connect_once(bus, "hpcbus-status-watch", settings.timeout, reconnect=True)
    except (Unreachable, ApiError, TimeoutError) as exc:
        print(f"hpcbus status: {exc or 'NATS did not answer in time'}", file=sys.stderr)
        return UNREACHABLE
    clusters = [c.name for c in report.clusters]
    seen = Seen()
    for c in report.clusters:
        for n in c.nodes.hosts:
            if n.interval_s:
                seen.add(n.host, n.last_sample - n.interval_s, exact=n.exact)
            seen.add(n.host, n.last_sample, exact=n.exact)
            if n.silent and n.interval_s and not n.exact:
                seen.outside.add(n.host)
    seen.window = max((c.nodes.window_s for c in report.clusters), default=0.0)
    started = time.time()
    traffic = Traffic(started, seen)
    for c in report.clusters:
        traffic.errors.extend(c.errors)

    async def on_msg(msg: Any) -> None:
        traffic.add(msg.subject, msg.data or b"", time.time())

    for cluster in clusters:
        root = subjects.metrics(cluster, prefix=bus.subject_prefix).removesuffix(".metrics")
        await nc.subscribe(f"{root}.>", cb=on_msg, pending_msgs_limit=1_000_000, pending_bytes_limit=1 << 30)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    streams = [s.name for c in report.clusters for s in c.streams]
    previous: dict[tuple[str, str], dict[str, Any]] = {}
    looked = time.monotonic()
    try:
        while not stop.is_set():
            try:
                current = await durables_of(nc, streams, settings.timeout)
            except Exception:  # NATS away for a moment: the rates go on, the lag comes back with it
                current = {}
            gap = time.monotonic() - looked
            looked = time.monotonic()
            durables = [
                durable_facts(previous.get(key, info), info if key in previous else None, gap)
                for key, info in sorted(current.items())
            ]
            previous = current
            now = time.time()
            nodes = judge(traffic.seen, now, settings.silent_intervals, "bus")
            traffic.forget(now, 2 * RATE_WINDOW)
            columns, rows = window_size()
            shown = frame(traffic, clusters, bus.subject_prefix, durables, nodes, now, settings.refresh)
            if not nc.is_connected:
                shown.insert(1, "NATS: not connected, reconnecting (rates pause, lag is not current)")
            shown = frame(traffic, clusters, bus.subject_prefix, durables, nodes, now, settings.refresh)
            if not nc.is_connected:
                shown.insert(1, "NATS: not connected, reconnecting (rates pause, lag is not current)")
            text = fit(shown, columns, rows - 1)
            sys.stdout.write(CLEAR + text + "\n")
            sys.stdout.flush()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), settings.refresh)
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
    return 0
