"""The report as one small, self-contained HTML file: the report's facts and each resource's use as tables
(each use marked good or bad, in colour and with a mark that survives a black-and-white print), the notes,
and a plot per resource (CPU, memory, GPU utilisation, GPU memory) per node and card over the job's
lifetime, as wide as the page. (Until issue 32 the page showed the 80-column text in a `<pre>`, which a
narrow window cut and scrolled.)

The plots are inline SVG drawn here (`consumers.report.svg`), not a plotting library's JavaScript: a page of
a few kB that opens on a login node without a network and in any mail client or ticket system that shows
HTML (plotly.js inline was 4.8 MB for nine points). Each plot says what its axes are (units, UTC) and
carries the line the job should be held against: the allocated cores, the requested memory, the card's
memory; a verdict under it says in words whether the job used what it was given well.
"""

from __future__ import annotations

from html import escape

from hpcbus.consumers.report.model import Report, Trace, percent, size
from hpcbus.consumers.report.svg import Axis, Reference, byte_unit, plot
from hpcbus.consumers.report.text import Row, detailed, facts, heading, notes, overall

MARKS = {"good": "\u2714", "bad": "\u2716"}
"""The visible mark of a good and a bad verdict (a heavy check mark, a heavy multiplication x)."""


class Verdict:
    """One sentence under a plot, and whether it is good news ("good"), bad ("bad") or just a fact ("")."""

    def __init__(self, text: str, mark: str = "") -> None:
        self.text = text
        self.mark = mark


def _flagged(report: Report, name: str) -> bool:
    return any(f.name == name for f in report.flags)


def _cpu(report: Report, traces: list[Trace]) -> tuple[Axis, list[Reference], Verdict]:
    cores = [n.cores for n in report.per_node if n.cores]
    refs = []
    group = report.scheduler == "process"  # its cpuset, if any, is the node's: no allocation
    if cores:
        label = "cores in its cpuset" if group else "allocated cores"
        label += "" if len(report.per_node) == 1 else " per node"
        refs.append(Reference(float(max(cores)), f"{label}: {max(cores)}"))
    busy = report.cores_busy
    busy_text = f"{busy:.1f} cores busy on average" if busy is not None else "cores busy unknown"
    if report.cpu_eff is None or group:
        verdict = Verdict(f"{busy_text} (no core allocation to hold it against).")
    elif _flagged(report, "cpu_underused"):
        verdict = Verdict(
            f"Under-used: {busy_text}, {percent(report.cpu_eff)} of the allocated cores.", "bad"
        )
    else:
        verdict = Verdict(f"Good: {busy_text}, {percent(report.cpu_eff)} of the allocated cores.", "good")
    return Axis("CPU", "cores busy", 1.0), refs, verdict


def _mem(report: Report, traces: list[Trace]) -> tuple[Axis, list[Reference], Verdict]:
    shares = [n.mem_requested for n in report.per_node if n.mem_requested]
    top = max([max(t.values, default=0.0) for t in traces] + [float(s) for s in shares], default=0.0)
    factor, unit = byte_unit(top)
    refs = []
    if shares:
        label = "requested" if len(report.per_node) == 1 else "requested per node"
        refs.append(Reference(float(max(shares)) / factor, f"{label}: {size(max(shares))}"))
    peak = f"peak {size(report.mem_peak)}"
    if not report.mem_requested:
        verdict = Verdict(f"Peak {size(report.mem_peak)} (no memory request to hold it against).")
    elif _flagged(report, "mem_overrequested"):
        verdict = Verdict(
            f"Over-requested: {peak}, {percent(report.mem_eff)} of the {size(report.mem_requested)} requested.",
            "bad",
        )
    elif report.mem_eff is not None and report.mem_eff > 100.0:
        verdict = Verdict(f"Over the request: {peak} of {size(report.mem_requested)}.", "bad")
    else:
        verdict = Verdict(
            f"Good: {peak}, {percent(report.mem_eff)} of the {size(report.mem_requested)} requested.", "good"
        )
    return Axis("Memory", f"memory ({unit})", 1.0 / factor), refs, verdict


def _gpu_util(report: Report, traces: list[Trace]) -> tuple[Axis, list[Reference], Verdict]:
    refs = [Reference(100.0, "100 %")]
    if _flagged(report, "idle_gpu"):
        verdict = Verdict(f"Idle GPU: mean utilisation {percent(report.gpu_util)}.", "bad")
    else:
        verdict = Verdict(f"Mean utilisation {percent(report.gpu_util)} of {report.gpus} card(s).", "good")
    return Axis("GPU utilisation", "utilisation (%)", 1.0), refs, verdict


def _gpu_mem(report: Report, traces: list[Trace]) -> tuple[Axis, list[Reference], Verdict]:
    totals = [g.mem_total for n in report.per_node for g in n.gpus if g.mem_total]
    top = max([max(t.values, default=0.0) for t in traces] + [float(t) for t in totals], default=0.0)
    factor, unit = byte_unit(top)
    refs = [Reference(float(max(totals)) / factor, f"card memory: {size(max(totals))}")] if totals else []
    return (
        Axis("GPU memory", f"GPU memory ({unit})", 1.0 / factor),
        refs,
        Verdict(f"Peak {size(report.gpu_mem_peak)} on one card."),
    )


PANELS = (("cpu", _cpu), ("mem", _mem), ("gpu_util", _gpu_util), ("gpu_mem", _gpu_mem))
"""metric -> what its plot's axis, reference lines and verdict are."""


def _verdicts(report: Report) -> dict[str, Verdict]:
    """resource -> its verdict, the same sentence as under its plot."""
    return {
        metric: panel(report, [t for t in report.series if t.metric == metric])[2] for metric, panel in PANELS
    }


def _use(row: Row) -> str:
    """The cell with the bar (an HTML meter drawn in CSS) and the number, or the row's words."""
    if row.text:
        return f'<td class="use">{escape(row.text)}</td>'
    if row.value is None:
        return '<td class="use unknown">unknown</td>'
    width = max(0.0, min(100.0, row.value))
    return (
        f'<td class="use"><span class="meter" role="img" aria-label="{escape(percent(row.value))}">'
        f'<span class="fill" style="width:{width:.1f}%"></span></span> '
        f'<span class="number">{escape(percent(row.value))}</span></td>'
    )


def _row(row: Row, verdict: Verdict | None, level: int = 0) -> str:
    mark = verdict.mark if verdict else ""
    words = ""
    if verdict:
        sign = f'<span class="mark" aria-hidden="true">{MARKS[mark]}</span> ' if mark in MARKS else ""
        words = sign + escape(verdict.text)
    cls = " ".join(c for c in ("row", mark, f"level-{level}" if level else "") if c)
    data = f' data-resource="{row.resource}"' if row.resource else ""
    return (
        f'<tr class="{cls}"{data}><th scope="row">{escape(row.label)}</th>{_use(row)}'
        f'<td class="detail">{escape(row.detail)}</td>'
        f'<td class="verdict{" " + mark if mark else ""}">{words}</td></tr>'
    )


def summary_html(report: Report) -> str:
    """The facts, the use of each resource (overall, then per node and card) with its verdict, the notes."""
    out = ['<table class="facts">']
    out += [f'<tr><th scope="row">{escape(k)}</th><td>{escape(v)}</td></tr>' for k, v in facts(report)]
    out.append("</table>")
    verdicts = _verdicts(report)
    out.append('<h2>Overall utilization</h2>\n<table class="summary">')
    out.append(
        '<thead><tr><th scope="col">resource</th><th scope="col">use</th><th scope="col">detail</th>'
        '<th scope="col">verdict</th></tr></thead>\n<tbody>'
    )
    out += [_row(row, verdicts.get(row.resource)) for row in overall(report)]
    for group in detailed(report):
        out.append(
            f'<tr class="group level-{group.level}"><th scope="rowgroup" colspan="4">{escape(group.title)}</th></tr>'
        )
        out += [_row(row, None, group.level) for row in group.rows]
    out.append("</tbody></table>")
    out.append('<h2>Notes</h2>\n<ul class="notes">')
    out += [f"<li>{escape(note)}</li>" for note in notes(report)]
    out.append("</ul>")
    return "\n".join(out)


def plots_html(report: Report) -> str:
    """One `<section class="plot">` per metric the job has series of; "" when it has none."""
    parts = []
    times = [t for trace in report.series for t in trace.times]
    span = (float(min(times)), float(max(times))) if times else None  # one time axis for every plot
    for metric, panel in PANELS:
        traces = [t for t in report.series if t.metric == metric]
        if not traces:
            continue
        axis, refs, verdict = panel(report, traces)
        mark = f' class="verdict {verdict.mark}"' if verdict.mark else ' class="verdict"'
        parts.append(
            f'<section class="plot" id="plot-{metric}">\n<h2>{escape(axis.name)}</h2>\n'
            f"{plot(traces, axis, refs, report.step, span)}\n<p{mark}>{escape(verdict.text)}</p>\n</section>"
        )
    return "\n".join(parts)


def render(report: Report) -> str:
    title = f"{heading(report)}: job {report.job} on {report.cluster}"
    plots = plots_html(report) or "<p>No time series were recorded for this job.</p>"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
h1 {{ font-size: 1.4em; overflow-wrap: anywhere; }}
h2 {{ font-size: 1.1em; margin: 1.2em 0 0.3em; }}
table {{ border-collapse: collapse; }}
th, td {{ text-align: left; vertical-align: top; padding: 0.25em 0.8em 0.25em 0; overflow-wrap: anywhere; }}
table.facts th {{ font-weight: normal; color: #555; }}
table.summary {{ width: 100%; }}
table.summary thead th {{ border-bottom: 1px solid #999; font-weight: normal; color: #555; }}
table.summary tr.row > * {{ border-bottom: 1px solid #e0e0e0; }}
table.summary tr.group th {{ padding-top: 0.8em; font-weight: bold; }}
table.summary tr.level-1 > th {{ padding-left: 1.5em; font-weight: normal; }}
table.summary tr.level-2 > th {{ padding-left: 3em; font-weight: normal; }}
td.use {{ white-space: nowrap; }}
.meter {{ display: inline-block; width: 10em; height: 0.8em; background: #e8e8e8; vertical-align: middle; }}
.meter .fill {{ display: block; height: 100%; background: #1f77b4; }}
tr.bad .meter .fill {{ background: #c62828; }}
tr.good .meter .fill {{ background: #1a7f37; }}
td.verdict.good {{ color: #1a7f37; }}
td.verdict.bad {{ color: #c62828; font-weight: bold; }}
.mark {{ font-size: 1.1em; }}
svg.plot {{ width: 100%; height: auto; display: block; }}
svg text {{ font-family: sans-serif; }}
.legend {{ list-style: none; padding: 0; margin: 0.2em 0; }}
.legend li {{ display: inline-block; margin-right: 1.5em; }}
.swatch {{ display: inline-block; width: 1.5em; height: 0.3em; vertical-align: middle; margin-right: 0.4em; }}
p.verdict {{ margin: 0.3em 0 1em; }}
p.verdict.good::before {{ content: "\\2714  "; color: #1a7f37; }}
p.verdict.bad::before {{ content: "\\2716  "; color: #c62828; }}
p.verdict.bad {{ color: #c62828; font-weight: bold; }}
p.verdict.good {{ color: #1a7f37; }}
</style>
</head>
<body>
<h1>{escape(title)}</h1>
<div id="report">
{summary_html(report)}
</div>
<div id="plots">
{plots}
</div>
</body>
</html>
"""
