"""The screen of `hpcbus status`: plain lines (no colours, no cursor tricks), each cut to the terminal's
width, so it reads the same over ssh, in a pipe, in a mail from cron."""

from __future__ import annotations

import time

from hpcbus.commands.status.facts import Cluster, Report
from hpcbus.commands.status.health import MAX_NAMED, ago


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def clock(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(t)) + "Z" if t else "-"


def cluster_lines(c: Cluster, now: float) -> list[str]:
    out = [f"cluster {c.name}"]
    for s in c.streams:
        limit = f" of {size(s.max_bytes)}" if s.max_bytes > 0 else " (no byte limit)"
        headroom = f", {s.headroom_minutes:.0f} min of ingest left" if s.headroom_minutes is not None else ""
        where = f", leader {s.leader}" if s.leader else ""
        current = sum(1 for r in s.followers if r.current and not r.offline)
        replicas = f", replicas {current + 1}/{s.replicas} current" if s.replicas > 1 else ""
        out.append(f"  stream {s.name}: {s.messages} msgs, {size(s.bytes)}{limit}{headroom}{replicas}{where}")
    for d in c.durables:
        rate = f", {d.acks_per_s:g} acks/s" if d.acks_per_s is not None else ""
        drain = f", drains in {ago(d.drain_s)}" if d.drain_s is not None else ""
        grow = f", growing by {d.growing}" if d.growing else ""
        last = f", last ack {ago(d.last_ack_s)} ago" if d.last_ack_s is not None else ", never acked"
        out.append(
            f"  durable {d.name}: pending {d.pending}, ack-pending {d.ack_pending}, redelivered "
            f"{d.redelivered}{rate}{drain}{grow}{last}"
        )
    if c.deadletters is not None:
        dl = c.deadletters
        newest = (
            f", newest {clock(dl.newest_time)} {dl.newest_subject}: {dl.newest_reason}" if dl.count else ""
        )
        out.append(f"  dead letters: {dl.count}{newest}")
    for w in c.workers:
        state = "STOPPED" if w.stopped else "alive" if w.alive else "GONE"
        rates = ", ".join(f"{k} {v:g}/s" for k, v in sorted(w.rates.items()) if v)
        backlog = f", backlog {w.backlog:g}" if w.backlog is not None else ""
        err = f", last error: {w.last_error}" if w.last_error else ""
        out.append(
            f"  worker {w.name}@{w.host}: {state}, reported {ago(now - w.last_report)} ago"
            f"{', ' + rates if rates else ''}{backlog}{err}"
        )
    for r in c.roles:
        standby = (
            f"; standby {r.standby}, seen {ago(r.standby_seen_s or 0.0)} ago" if r.standby else "; NO standby"
        )
        if r.holder:
            out.append(
                f"  role {r.role}: held by {r.holder} since {clock(r.since)}, renewed {ago(r.renewed_s or 0.0)} "
                f"ago (lease {r.ttl_s:g} s){standby}"
            )
        else:
            out.append(f"  role {r.role}: NOBODY holds it (a takeover under way, or both down){standby}")
    n = c.nodes
    if n.seen:
        interval = f", every {n.interval_s:.0f} s" if n.interval_s else ""
        out.append(
            f"  nodes: {n.seen} seen ({n.source}){interval}, newest sample {clock(n.newest)}, "
            f"{len(n.silent)} silent"
        )
        for node in n.silent[:MAX_NAMED]:
            if node.exact:
                out.append(f"    silent {node.host}: last sample {ago(now - node.last_sample)} ago")
            else:
                out.append(
                    f"    silent {node.host}: no sample in the last {ago(n.window_s)}, "
                    f"one {ago(now - node.last_sample)} ago"
                )
        if len(n.silent) > MAX_NAMED:
            out.append(f"    ... and {len(n.silent) - MAX_NAMED} more silent")
    else:
        out.append("  nodes: no node samples on the bus")
    for e in c.errors[-3:]:
        out.append(f"  error: {e}")
    return out


def render(report: Report, width: int = 0) -> str:
    lines = [f"hpcbus status at {clock(report.time)} ({report.took_s:.1f} s)"]
    for s in report.servers:
        if s.reachable:
            js = "JetStream" if s.jetstream else "no JetStream"
            cl = f", cluster {s.cluster}" if s.cluster else ""
            lines.append(f"server {s.name or s.url} ({s.url}): up, {js}, v{s.version}{cl}")
        else:
            lines.append(f"server {s.url}: DOWN ({s.error})")
    if report.jetstream_error:
        lines.append(f"JetStream: {report.jetstream_error}")
    for c in report.clusters:
        lines += cluster_lines(c, report.time)
    if report.warnings:
        lines.append(f"WARNING: {len(report.warnings)} warning(s)")
        lines += [f"  {p.where}: {p.what}" for p in report.warnings]
    if report.problems:
        lines.append(f"UNHEALTHY: {len(report.problems)} problem(s)")
        lines += [f"  {p.where}: {p.what}" for p in report.problems]
    else:
        lines.append("healthy")
    if width > 0:
        lines = [line if len(line) <= width else line[: max(width - 1, 1)] + "…" for line in lines]
    return "\n".join(lines) + "\n"
