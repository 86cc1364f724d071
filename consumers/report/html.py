"""The report as one small, self-contained HTML file: the text report, and a plot per resource (CPU,
memory, GPU utilisation, GPU memory) per node and card over the job's lifetime.

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
from hpcbus.consumers.report.text import render as render_text


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


def plots_html(report: Report) -> str:
    """One `<section class="plot">` per metric the job has series of; "" when it has none."""
    parts = []
    for metric, panel in PANELS:
        traces = [t for t in report.series if t.metric == metric]
        if not traces:
            continue
        axis, refs, verdict = panel(report, traces)
        mark = f' class="verdict {verdict.mark}"' if verdict.mark else ' class="verdict"'
        parts.append(
            f'<section class="plot" id="plot-{metric}">\n<h2>{escape(axis.name)}</h2>\n'
            f"{plot(traces, axis, refs, report.step)}\n<p{mark}>{escape(verdict.text)}</p>\n</section>"
        )
    return "\n".join(parts)


def render(report: Report) -> str:
    title = f"Job {report.job} on {report.cluster}"
    plots = plots_html(report) or "<p>No time series were recorded for this job.</p>"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; max-width: 60em; }}
pre {{ background: #f6f6f6; padding: 1em; overflow-x: auto; }}
h2 {{ font-size: 1.1em; margin: 1.2em 0 0.3em; }}
svg.plot {{ width: 100%; height: auto; max-width: 56em; display: block; }}
svg text {{ font-family: sans-serif; }}
.legend {{ list-style: none; padding: 0; margin: 0.2em 0; }}
.legend li {{ display: inline-block; margin-right: 1.5em; }}
.swatch {{ display: inline-block; width: 1.5em; height: 0.3em; vertical-align: middle; margin-right: 0.4em; }}
.verdict {{ margin: 0.3em 0 1em; }}
.verdict.good::before {{ content: "\\2714  "; color: #1a7f37; }}
.verdict.bad::before {{ content: "\\2716  "; color: #c62828; }}
.verdict.bad {{ color: #c62828; font-weight: bold; }}
.verdict.good {{ color: #1a7f37; }}
</style>
</head>
<body>
<h1>{escape(title)}</h1>
<pre id="report">{escape(render_text(report))}</pre>
<div id="plots">
{plots}
</div>
</body>
</html>
"""
