"""The two metric tables of docs/mapping.md, generated from the registry: one generator per table, and
`render_doc` puts both into the document (a test fails when the document and the registry drift apart)."""

from __future__ import annotations

from hpcbus.schemas.metrics.model import CONV_IDENTITY, CONV_KIB_TO_MIB, CONV_PSTATE, LEVELS
from hpcbus.schemas.metrics.node import NODE
from hpcbus.schemas.metrics.sonar import SONAR

__all__ = ["node_table", "render_doc", "sonar_table"]

_CONV = {CONV_IDENTITY: "", CONV_KIB_TO_MIB: "KiB / 1024", CONV_PSTATE: "value - 1"}


def _kind(kind: type) -> str:
    return "int" if kind is int else "float"


def sonar_table() -> str:
    """Section 4: the Sonar sample's measurements (`SONAR`)."""
    rows = [
        "| Sonar field | level | measurement | unit | type | conversion | writer agg | cc-metric-collector | zero |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for m in SONAR:
        rows.append(
            f"| `{m.source}` | {m.level} | `{m.name}` | {m.unit} | {_kind(m.kind)} | {_CONV[m.conv]} | {m.agg} | "
            f"{m.cc or '-'} | {m.zero} |"
        )
    rows.append(
        "| `system.disks[].stats[k]`, k >= 17 | disk | `diskstat_<k+1>` | count | int |  | sum | - | written |"
    )
    return "\n".join(rows)


def node_table() -> str:
    """Section 10: the node agent's ClusterCockpit lines (`NODE`), one row per measurement."""
    rows = [
        "| measurement | level: tags | unit | type | agg | source | cc-metric-collector |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in NODE:
        levels = "; ".join(f"{level}: {LEVELS[level]}" for level in m.levels)
        rows.append(
            f"| `{m.name}` | {levels} | {m.unit} | {_kind(m.kind)} | {m.agg} | {m.source} | {m.cc or '-'} |"
        )
    return "\n".join(rows)


_SECTIONS = (
    ("<!-- registry:begin -->", "<!-- registry:end -->", sonar_table),
    ("<!-- cc-lines:begin -->", "<!-- cc-lines:end -->", node_table),
)


def render_doc(doc: str) -> str:
    """`doc` with the text between each pair of table markers replaced by the current table."""
    for begin, end, table in _SECTIONS:
        head, found, rest = doc.partition(begin)
        if not found:
            continue
        _, _, tail = rest.partition(end)
        doc = f"{head}{begin}\n{table()}\n{end}{tail}"
    return doc
