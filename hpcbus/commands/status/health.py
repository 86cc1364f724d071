"""The verdict: each unhealthy fact of a `Report` becomes one `Problem` (where, what), and the exit code
follows (0 healthy, 1 something unhealthy; 3, NATS unreachable, is the command's). Dead letters and stream
headroom are shown, not judged: a dead letter is a message already handled, a full stream drops its oldest
by design. A tag nearing InfluxDB's `max-values-per-tag` is a warning (said, exit 0), one at it a problem.
"""

from __future__ import annotations

import time

from hpcbus.commands.status.facts import Problem, Report
from hpcbus.commands.status.settings import StatusSettings

MAX_NAMED = 20
"""Silent hosts named in one problem; the rest are counted (all are in `--json`)."""


def ago(seconds: float) -> str:
    """`42 s`, `7 min`, `3.5 h`, `2.0 d`."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def judge(report: Report, settings: StatusSettings) -> Report:
    """`report` with its problems and `healthy` filled in."""
    now = report.time or time.time()
    problems: list[Problem] = []
    for s in report.servers:
        if not s.reachable:
            problems.append(Problem(where=f"server {s.url}", what=f"not reachable: {s.error}"))
        elif not s.jetstream:
            problems.append(Problem(where=f"server {s.name or s.url}", what="JetStream is not enabled"))
    if report.jetstream_error:
        problems.append(Problem(where="JetStream", what=report.jetstream_error))
    for c in report.clusters:
        if not c.streams:
            problems.append(Problem(where=f"cluster {c.name}", what="; ".join(c.errors) or "no stream"))
        for st in c.streams:
            if st.replicas > 1 and not st.leader:
                problems.append(Problem(where=f"stream {st.name}", what="no leader"))
            for r in st.followers:
                if r.offline or not r.current:
                    state = "offline" if r.offline else f"not current (lag {r.lag})"
                    problems.append(Problem(where=f"stream {st.name}", what=f"replica {r.name} {state}"))
        for d in c.durables:
            waiting = d.pending + d.ack_pending
            idle = d.last_ack_s is None or d.last_ack_s > settings.stalled_after
            # A worker that holds messages on purpose (`consume sonar` waits for an envelope's lines) keeps
            # pulling and is being delivered to: not stalled. A wedged one stops pulling, or gets nothing.
            fetching = (
                d.waiting > 0
                and d.last_delivery_s is not None
                and d.last_delivery_s <= settings.stalled_after
            )
            if waiting and idle and not d.acks_per_s and not fetching:
                last = "never acknowledged" if d.last_ack_s is None else f"last ack {ago(d.last_ack_s)} ago"
                grow = f", growing by {d.growing}" if d.growing else ""
                problems.append(
                    Problem(
                        where=f"durable {d.name} on {d.stream}",
                        what=f"stalled: {waiting} messages waiting, {last}{grow}",
                    )
                )
        for w in c.workers:
            if w.stopped:
                what = f"stopped {ago(now - w.last_report)} ago (its last report said so)"
                problems.append(Problem(where=f"worker {w.name} on {w.host}", what=what))
            elif not w.alive:
                problems.append(
                    Problem(
                        where=f"worker {w.name} on {w.host}",
                        what=f"gone: last report {ago(now - w.last_report)} ago (every {w.interval_s:.0f} s)",
                    )
                )
        for role in c.roles:
            if not role.holder:  # listed: a pair runs or ran it (a standby, or saved state)
                standby = f"{role.standby} stands by" if role.standby else "no standby either"
                problems.append(
                    Problem(
                        where=f"role {role.role} of {c.name}",
                        what=f"nobody holds it ({standby}): a takeover under way, or both down",
                    )
                )
        if c.nodes.influx_error:
            problems.append(Problem(where=f"cluster {c.name}", what=c.nodes.influx_error))
        if c.nodes.silent:
            names = [n.host for n in c.nodes.silent]
            shown = ", ".join(names[:MAX_NAMED]) + (
                f" and {len(names) - MAX_NAMED} more" if len(names) > MAX_NAMED else ""
            )
            problems.append(Problem(where=f"cluster {c.name}", what=f"{len(names)} silent node(s): {shown}"))
    warnings: list[Problem] = []
    if report.tag_values_error:
        warnings.append(Problem(where="InfluxDB", what=report.tag_values_error))
    for t in report.tag_values:
        if not t.limit or t.values < settings.tag_values_warn * t.limit:
            continue
        said = Problem(
            where=f"InfluxDB measurement {t.measurement}",
            what=f"tag {t.tag} holds {t.values} distinct values of max-values-per-tag {t.limit} "
            f"({100 * t.values / t.limit:.0f} %)",
        )
        if t.values >= t.limit:
            said.what += ": InfluxDB refuses the points of every new value (`hpcbus deploy influxdb`)"
            problems.append(said)
        else:
            said.what += (
                "; at the limit InfluxDB refuses the points of every new value (`hpcbus deploy influxdb`)"
            )
            warnings.append(said)
    report.warnings = warnings
    report.problems = problems
    report.healthy = not problems
    return report
