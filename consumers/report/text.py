"""The report as an operator reads it in a terminal, laid out like Princeton's jobstats: who and what first,
then one bar per resource (overall, then per node and per card when there are several), then the flags in
plain words. Plain ASCII, no line longer than 80 columns, so it survives mail, tickets and `less`: a bar
line's detail goes on the line below when it does not fit beside the bar, and long values (many node names,
a long job name) wrap under their own column."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from datetime import UTC, datetime

from hpcbus.consumers.report.model import Report, duration, percent, size

WIDTH = 80
BAR = 24
LABEL = 18
DETAIL = 2 + LABEL + 1
"""The column where a bar starts, and a detail that did not fit beside it."""

HEADINGS = {
    "slurm": "Slurm Job Statistics",
    "ocs": "OCS Job Statistics",
    "process": "Process Group Statistics",
    "": "Batch Job Statistics",
}
"""The report's heading by scheduler, as jobstats words its own (`Slurm Job Statistics`); a process group is
no batch job, so it is not called one."""


def bar(value: float | None) -> str:
    """`[||||||||        ]` filled in proportion to `value` % (capped at 100), `[  unknown  ]` for None."""
    if value is None:
        return "[" + "unknown".center(BAR) + "]"
    filled = max(0, min(BAR, round(BAR * value / 100.0)))
    return "[" + "|" * filled + " " * (BAR - filled) + "]"


def _when(epoch: int | None) -> str:
    return "?" if epoch is None else datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _heading(title: str) -> list[str]:
    return ["", title.center(WIDTH).rstrip(), "=" * WIDTH]


def fit(line: str, indent: int) -> list[str]:
    """`line` as lines of at most WIDTH columns, continued `indent` columns in (a word longer than a line,
    such as a 253-character host name, is cut)."""
    if len(line) <= WIDTH:
        return [line]
    return textwrap.wrap(
        line, WIDTH, subsequent_indent=" " * indent, break_on_hyphens=False, drop_whitespace=True
    )


def _line(label: str, value: float | None, detail: str) -> list[str]:
    """`  label  [|||   ]  12.5 %  detail`, the detail on the next line under the bar when it would pass
    WIDTH."""
    head = f"  {label:<{LABEL}} {bar(value)} {percent(value):>8}"
    if not detail:
        return [head]
    if len(head) + 2 + len(detail) <= WIDTH:
        return [f"{head}  {detail}"]
    return [head, *fit(" " * DETAIL + detail, DETAIL)]


def _cores(report: Report) -> str:
    if report.cores is not None:
        return str(report.cores)
    return "none allocated (a process group)" if report.scheduler == "process" else "?"
    # (a process group's count, when known, is its cpuset's: the node's cores, not an allocation)


# --- what the report says, for the text and the HTML page alike ----------------------------------------------


@dataclass(frozen=True)
class Row:
    """One resource's line: a bar of `value` % with `detail` beside it, or (no bar) `text` alone.
    `resource` names what the verdict is about (cpu, mem, gpu_util, gpu_mem; "" for a node's rows)."""

    label: str
    value: float | None = None
    detail: str = ""
    resource: str = ""
    text: str = ""


@dataclass(frozen=True)
class Group:
    """The rows under one heading: the job's (`title` ""), a node's or a card's."""

    title: str
    rows: list[Row] = field(default_factory=list)
    level: int = 0
    """0 the job, 1 a node, 2 a card of it."""


def facts(report: Report) -> list[tuple[str, str]]:
    """Who and what, in the order jobstats gives them."""
    return [
        ("Job", report.job + (f" ({report.name})" if report.name else "")),
        ("Cluster", report.cluster),
        ("User", report.user or "?"),
        ("Account", report.account or "?"),
        ("Partition", report.partition or "?"),
        ("State", report.state or "?"),
        ("Nodes", f"{len(report.nodes)} ({', '.join(report.nodes)})" if report.nodes else "?"),
        ("Cores", _cores(report)),
        ("GPUs", str(report.gpus) if report.gpus is not None else "0"),
        ("Start", _when(report.start)),
        ("End", _when(report.end)),
        ("Elapsed", duration(report.elapsed)),
        (
            "Samples",
            f"{report.samples}"
            + (f" (coverage {percent(report.coverage)})" if report.coverage is not None else ""),
        ),
    ]


def overall(report: Report) -> list[Row]:
    """The job's use of each resource."""
    rows = []
    cpu_detail = f"{duration(report.cpu_seconds)} CPU time" if report.cpu_seconds is not None else ""
    if (report.cpu_eff is None or report.scheduler == "process") and report.cores_busy is not None:
        # No allocation (a process group: its cpuset, if any, is the node's): what it kept busy is the number
        # that means something.
        of = f" of {report.cores}" if report.cores else ""
        busy = f"{report.cores_busy:.1f} cores busy on average{of}"
        rows.append(Row("CPU cores busy", detail=cpu_detail, resource="cpu", text=busy))
    else:
        rows.append(Row("CPU utilization", report.cpu_eff, cpu_detail, "cpu"))
    if report.mem_requested:
        detail = f"{size(report.mem_peak)} of {size(report.mem_requested)}"
        rows.append(Row("CPU memory usage", report.mem_eff, detail, "mem"))
    else:
        total = max((n.mem_total or 0 for n in report.per_node), default=0)
        share = 100.0 * report.mem_peak / total if report.mem_peak is not None and total else None
        detail = f"{size(report.mem_peak)} peak" + (
            f" of the node's {size(total)} (no request)" if total else ""
        )
        rows.append(Row("CPU memory usage", share, detail, "mem"))
    if report.gpus:
        rows.append(Row("GPU utilization", report.gpu_util, f"mean of {report.gpus} card(s)", "gpu_util"))
        cards = [g for n in report.per_node for g in n.gpus]
        totals = [g.mem_total for g in cards if g.mem_total]
        share = 100.0 * (report.gpu_mem_peak or 0) / max(totals) if totals else None
        rows.append(Row("GPU memory usage", share, f"{size(report.gpu_mem_peak)} peak", "gpu_mem"))
    return rows


def detailed(report: Report) -> list[Group]:
    """Per node and card, when there are several nodes or any card; [] otherwise."""
    several = len(report.per_node) > 1 or any(len(n.gpus) > 1 for n in report.per_node)
    if not (several or any(n.gpus for n in report.per_node)):
        return []
    groups = []
    for node in report.per_node:
        cores = node.cores if node.cores is not None else "?"
        mem_of = node.mem_requested or node.mem_total
        share = node.mem_eff if node.mem_requested else (100.0 * node.mem_peak / mem_of if mem_of else None)
        rows = [
            Row("CPU", node.cpu_eff, f"{duration(node.cpu_seconds)} CPU time"),
            Row(
                "memory", share, f"{size(node.mem_peak)} of {size(mem_of)}" if mem_of else size(node.mem_peak)
            ),
        ]
        groups.append(Group(f"{node.hostname}  ({cores} cores, {node.samples} samples)", rows, 1))
        for gpu in node.gpus:
            of = (
                f"{size(gpu.mem_peak)} of {size(gpu.mem_total)}"
                if gpu.mem_total
                else f"{size(gpu.mem_peak)} peak"
            )
            card = [Row("utilization", gpu.util), Row("memory", gpu.mem_eff, of)]
            groups.append(Group(f"GPU {gpu.card}", card, 2))
    return groups


def notes(report: Report) -> list[str]:
    """The flags in plain words, and where the numbers come from when no summary was found."""
    out = [f.text for f in report.flags] or ["Nothing to flag."]
    if not report.from_summary:
        out.append(
            "No job summary from `hpcbus consume jobs` for this job: the numbers above are computed from the "
            f"stored series ({report.step} s per point)."
        )
    return out


def heading(report: Report) -> str:
    return HEADINGS.get(report.scheduler, f"{report.scheduler} Job Statistics")


# --- the text -------------------------------------------------------------------------------------------------


def _rows(rows: list[Row], indent: int) -> list[str]:
    lines = []
    for row in rows:
        label = " " * indent + row.label
        if row.text:
            lines += fit(f"  {label:<{LABEL}} {row.text}  {row.detail}".rstrip(), DETAIL)
        else:
            lines += _line(label, row.value, row.detail)
    return lines


def render(report: Report) -> str:
    lines = ["=" * WIDTH, heading(report).center(WIDTH).rstrip(), "=" * WIDTH]
    for name, value in facts(report):
        lines += fit(f"{name:>12}: {value}", 14)
    lines += _heading("Overall Utilization")
    lines += _rows(overall(report), 0)
    groups = detailed(report)
    if groups:
        lines += _heading("Detailed Utilization")
        for group in groups:
            pad = 2 * group.level
            lines += fit(" " * pad + group.title, pad + 2)
            lines += _rows(group.rows, pad + 2 * (group.level - 1))
    lines += _heading("Notes")
    for note in notes(report):
        lines += textwrap.wrap(note, WIDTH - 2, initial_indent="  * ", subsequent_indent="    ")
    return "\n".join(lines) + "\n"
