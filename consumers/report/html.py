"""The report as one self-contained HTML file: the text report's facts, bars and flags, and interactive
time-series plots of CPU, memory, GPU utilisation and GPU memory per node and card over the job's lifetime.

Plots are plotly's (`plotly` on PyPI, maintained by Plotly Inc., MIT): the figure is described in Python
and drawn by plotly.js in the browser, which the file carries inline, so it opens anywhere without a
network (a cluster's login node often has none) and still zooms, pans and shows values on hover, which is
what one does with a job's time line. The cost is ~4.7 MB of JavaScript per file; a static matplotlib SVG
would be smaller but cannot be zoomed into a week-long job's bad hour.
"""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape

from consumers.report.model import Report, Trace
from consumers.report.text import render as render_text

PANELS = (
    ("cpu", "CPU (cores busy)", 1.0),
    ("mem", "Memory (GiB)", 1.0 / 1024**3),
    ("gpu_util", "GPU utilisation (%)", 1.0),
    ("gpu_mem", "GPU memory (GiB)", 1.0 / 1024**3),
)
"""metric -> panel title, and the factor from the trace's unit to the panel's."""


def figure_html(report: Report) -> str:
    """The plots as an HTML fragment with plotly.js inline; "" when the job has no series."""
    from plotly import graph_objects as go
    from plotly.subplots import make_subplots

    panels = [
        (metric, title, factor)
        for metric, title, factor in PANELS
        if any(t.metric == metric for t in report.series)
    ]
    if not panels:
        return ""
    fig = make_subplots(
        rows=len(panels),
        cols=1,
        shared_xaxes=True,
        subplot_titles=[title for _, title, _ in panels],
        vertical_spacing=0.08,
    )
    for row, (metric, _, factor) in enumerate(panels, 1):
        traces: list[Trace] = [t for t in report.series if t.metric == metric]
        for t in traces:
            fig.add_trace(
                go.Scatter(
                    x=[datetime.fromtimestamp(s, UTC) for s in t.times],
                    y=[v * factor for v in t.values],
                    mode="lines+markers" if len(t.times) < 50 else "lines",
                    name=t.name,
                    legendgroup=metric,
                ),
                row=row,
                col=1,
            )
    fig.update_yaxes(rangemode="tozero")  # a flat line near its top must not look like a swing
    fig.update_layout(
        height=300 * len(panels) + 80, margin={"l": 60, "r": 20, "t": 40, "b": 40}, hovermode="x unified"
    )
    html: str = fig.to_html(full_html=False, include_plotlyjs=True, config={"displaylogo": False})
    return html


def render(report: Report) -> str:
    title = f"Job {report.job} on {report.cluster}"
    plots = figure_html(report) or "<p>No time series were recorded for this job.</p>"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 1.5em; }}
pre {{ background: #f6f6f6; padding: 1em; overflow-x: auto; }}
</style>
</head>
<body>
<h1>{escape(title)}</h1>
<pre id="report">{escape(render_text(report))}</pre>
<div id="plots">{plots}</div>
</body>
</html>
"""
