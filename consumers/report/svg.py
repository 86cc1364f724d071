"""A time-series plot as plain inline SVG: lines (one per node or card), dashed reference lines (what the
job was given), axes with ticks, titles with units and UTC times, and a legend.

Drawn here rather than by a plotting library because a report is read once, offline, often as a mail
attachment: a few kB of SVG that any browser shows without running scripts, where plotly.js inline was
4.8 MB. Hovering a point shows its time and value (an SVG `<title>`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

from hpcbus.consumers.report.model import Trace

WIDTH, HEIGHT = 1200, 300
"""The drawing's units; the page scales it to its own width (`svg.plot { width: 100% }`), so these only set
the proportions and the text size at about 1200 px."""
LEFT, RIGHT, TOP, BOTTOM = 72, 40, 14, 56
"""The plot area's margins in SVG units: room for the y ticks and title, the x ticks and title, and half a
time label at the right end."""

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
REFERENCE_COLOUR = "#c62828"
MARKERS_BELOW = 60
"""Series with fewer points than this get a dot on each point (a short job's few samples stay visible)."""

BYTE_UNITS = ((1024**4, "TiB"), (1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB"))


@dataclass(frozen=True)
class Axis:
    """A plot's heading, its y-axis title (with the unit) and the factor from the traces' values to it."""

    name: str
    title: str
    factor: float = 1.0


@dataclass(frozen=True)
class Reference:
    """A dashed horizontal line at `value` (in the axis' unit), labelled."""

    value: float
    label: str


def byte_unit(peak: float) -> tuple[float, str]:
    """The binary unit a plot of bytes up to `peak` reads best in: (bytes per unit, name); MiB for a job of
    a few MiB, never 0.0026 GiB."""
    for factor, name in BYTE_UNITS:
        if peak >= factor:
            return float(factor), name
    return 1.0, "B"


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """0 and round steps (1, 2, 2.5 or 5 times a power of ten) up to at least `top`."""
    if top <= 0 or not math.isfinite(top):
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    n = math.ceil(top / step - 1e-9)
    return [i * step for i in range(n + 1)]


def _number(v: float) -> str:
    return f"{v:.0f}" if abs(v - round(v)) < 1e-9 else f"{v:.3g}"


def _time_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    """Times on round steps (1 s .. 1 day) between lo and hi."""
    span = max(hi - lo, 1.0)
    steps = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
    step = next((s for s in steps if span / s <= count), 86400 * math.ceil(span / 86400 / count))
    first = math.ceil(lo / step) * step
    return [float(t) for t in range(int(first), int(hi) + 1, int(step))]


def _time_label(t: float, span: float) -> str:
    when = datetime.fromtimestamp(t, UTC)
    return when.strftime("%m-%d %H:%M") if span > 86400 else when.strftime("%H:%M:%S")


def plot(
    traces: list[Trace],
    axis: Axis,
    refs: list[Reference],
    step: int = 1,
    window: tuple[float, float] | None = None,
) -> str:
    """The SVG and its legend (an HTML list) for `traces`, in `axis` units, with `refs`; `window` = the time
    axis' range (the page's plots share one), else the traces' own."""
    times = [t for tr in traces for t in tr.times]
    lo, hi = (float(min(times)), float(max(times))) if times else (0.0, 1.0)
    if window is not None:
        lo, hi = window
    if hi - lo < step:  # one bucket: give it its width
        lo, hi = lo - step / 2, hi + step / 2
    values = [v * axis.factor for tr in traces for v in tr.values]
    top = max(values + [r.value for r in refs] + [0.0])
    ticks = nice_ticks(top * 1.05 if top > 0 else 1.0)
    y_max = ticks[-1]
    inner_w, inner_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + (t - lo) / (hi - lo) * inner_w

    def y(v: float) -> float:
        return TOP + inner_h - (v / y_max) * inner_h

    out = [
        f'<svg class="plot" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'role="img" aria-label="{escape(axis.name)}: {escape(axis.title)} over time (UTC)">'
    ]
    # grid and y ticks
    for v in ticks:
        out.append(
            f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
            'stroke="#e0e0e0"/>'
            f'<text class="ytick" x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end" font-size="12">'
            f"{_number(v)}</text>"
        )
    span = hi - lo
    for t in _time_ticks(lo, hi):
        out.append(
            f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{TOP + inner_h}" y2="{TOP + inner_h + 5}" stroke="#333"/>'
            f'<text class="xtick" x="{x(t):.1f}" y="{TOP + inner_h + 18}" text-anchor="middle" font-size="12">'
            f"{_time_label(t, span)}</text>"
        )
    # axes and their titles
    out.append(
        f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{TOP + inner_h}" stroke="#333"/>'
        f'<line class="axis" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{TOP + inner_h}" y2="{TOP + inner_h}" '
        'stroke="#333"/>'
    )
    day = datetime.fromtimestamp(lo, UTC).strftime("%Y-%m-%d")
    x_title = f"time (UTC), from {day}" if span <= 86400 else "date and time (UTC)"
    out.append(
        f'<text class="xtitle" x="{LEFT + inner_w / 2:.1f}" y="{HEIGHT - 8}" text-anchor="middle" '
        f'font-size="13">{escape(x_title)}</text>'
        f'<text class="ytitle" transform="translate(16,{TOP + inner_h / 2:.1f}) rotate(-90)" '
        f'text-anchor="middle" font-size="13">{escape(axis.title)}</text>'
    )
    for ref in refs:
        out.append(
            f'<line class="reference" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(ref.value):.1f}" '
            f'y2="{y(ref.value):.1f}" stroke="{REFERENCE_COLOUR}" stroke-width="1.5" stroke-dasharray="6 4"/>'
            f'<text class="reference-label" x="{WIDTH - RIGHT - 4}" y="{y(ref.value) - 5:.1f}" '
            f'text-anchor="end" font-size="12" fill="{REFERENCE_COLOUR}">{escape(ref.label)}</text>'
        )
    legend = []
    for i, tr in enumerate(traces):
        colour = COLOURS[i % len(COLOURS)]
        points = [(x(t), y(v * axis.factor)) for t, v in zip(tr.times, tr.values, strict=True)]
        if points:
            d = "M" + " L".join(f"{px:.1f},{py:.1f}" for px, py in points)
            out.append(
                f'<path class="series" data-name="{escape(tr.name)}" d="{d}" fill="none" stroke="{colour}" '
                'stroke-width="2"/>'
            )
        if len(points) < MARKERS_BELOW:
            for (px, py), t, v in zip(points, tr.times, tr.values, strict=True):
                when = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
                out.append(
                    f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{colour}">'
                    f"<title>{escape(tr.name)} {when}: {_number(v * axis.factor)}</title></circle>"
                )
        legend.append(
            f'<li><span class="swatch" style="background:{colour}"></span>'
            f'<span class="series-name">{escape(tr.name)}</span></li>'
        )
    for ref in refs:
        legend.append(
            f'<li><span class="swatch" style="background:{REFERENCE_COLOUR}"></span>'
            f'<span class="reference-name">{escape(ref.label)} (dashed)</span></li>'
        )
    out.append("</svg>")
    return "\n".join(out) + '\n<ul class="legend">' + "".join(legend) + "</ul>"
