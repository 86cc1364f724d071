"""`sinfo` output -> Sonar `ClusterAttributes` (partitions with their nodes, nodes grouped by state).

The two commands are Sonar's own (src/linux/system.rs), so hpcbus and Sonar see a cluster the same way:

    sinfo -h -a -O Partition:|,NodeList:|             one line per partition (and node group)
    sinfo -h -a -e -O NodeList:|,StateComplete:|      one line per set of nodes in the same state

`-O` with `type:|` prints each field unpadded with `|` after it, so every line ends with `|`. StateComplete
(not `%T`) is used because it lists every state flag (`idle+drain+not_responding`), where `%T`/`%t` fold
flags into one word or a suffix character; `StateComplete` exists since Slurm 21.08, so 22.05 has it.
The parsers also accept the `%T` form (`idle*`, `drained~`, `-o '%N|%T'`), mapping the suffix characters
of sinfo(1) "NODE STATE CODES" to the flag names StateComplete would print.

Unlike Sonar, which emits one entry per sinfo line, lines are merged: a partition listed on several lines
becomes one `ClusterPartition`, and all nodes with the same *set* of states become one `ClusterNodes`, each
with a canonical compressed node range list (`schemas.noderange.compress`). The information is the same;
the output no longer depends on how sinfo happened to group its lines.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Final

from hpcbus.schemas.noderange import compress, expand
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.slurm.values import format_timestamp
from hpcbus.schemas.sonar.types import ClusterAttributes, ClusterNodes, ClusterPartition

__all__ = [
    "SINFO_NODES_ARGV",
    "SINFO_PARTITIONS_ARGV",
    "cluster_attributes",
    "node_states",
    "parse_node_states",
    "parse_partitions",
]

SINFO_PARTITIONS_ARGV: Final = ("sinfo", "-h", "-a", "-O", "Partition:|,NodeList:|")
"""Partitions and their nodes (`-a`: hidden partitions too); `Partition` marks the default with `*`."""
SINFO_NODES_ARGV: Final = ("sinfo", "-h", "-a", "-e", "-O", "NodeList:|,StateComplete:|")
"""Nodes and their complete state (`-e`: only identical nodes are grouped on one line)."""

KIND: Final = "sinfo"

_SUFFIX_FLAGS: Final = {
    "*": "NOT_RESPONDING",
    "~": "POWERED_DOWN",
    "#": "POWERING_UP",
    "!": "POWER_DOWN",
    "%": "POWERING_DOWN",
    "$": "MAINTENANCE",
    "@": "REBOOT_REQUESTED",
    "^": "REBOOT_ISSUED",
    "-": "PLANNED",
}
"""sinfo(1) NODE STATE CODES: the characters `%T`/`%t` append, as the flag names StateComplete uses."""

_NO_NODES: Final = frozenset({"", "(null)", "n/a"})


def node_states(text: str) -> list[str]:
    """The states in one sinfo state field, upper-case, in order: `mixed+drain` -> [MIXED, DRAIN].

    Also reads `%T`'s forms: a trailing flag character (`idle*` -> [IDLE, NOT_RESPONDING]) and a trailing
    `+` (`allocated+`: allocated with jobs completing -> [ALLOCATED, COMPLETING]).
    """
    text = text.strip()
    flags: list[str] = []
    while text and text[-1] in _SUFFIX_FLAGS:
        flags.append(_SUFFIX_FLAGS[text[-1]])
        text = text[:-1]
    if text.endswith("+"):
        text = text[:-1]
        flags.insert(0, "COMPLETING")
    words = text.split("+") if text else []
    for word in words:
        if not word or not word.replace("_", "").isalpha():
            raise ValueError(f"node state {text!r} is not words joined by '+'")
    if not words:
        raise ValueError("node state is empty")
    return [w.upper() for w in words] + flags[::-1]


def _fields(line: str) -> list[str]:
    """The `|`-separated fields of a line, trimmed, without the empty one after a final `|`."""
    parts = [p.strip() for p in line.split("|")]
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()
    return parts


def _lines(text: str | Iterable[str]) -> Iterable[tuple[int, str]]:
    lines = text.splitlines() if isinstance(text, str) else text
    for lineno, line in enumerate(lines, 1):
        line = line.rstrip("\r\n")
        if line.strip():
            yield lineno, line


def parse_partitions(
    text: str | Iterable[str], *, place: str = ""
) -> tuple[list[ClusterPartition], list[Problem]]:
    """`sinfo -h -a -O Partition:|,NodeList:|` -> one `ClusterPartition` per partition, nodes compressed.

    The default partition's `*` is dropped (Sonar drops it too: it is a property of the partition, not
    part of its name). A bad line is a `Problem`; the other lines still count.
    """
    hosts: dict[str, set[str]] = {}
    problems: list[Problem] = []
    for lineno, line in _lines(text):
        parts = _fields(line)
        if len(parts) != 2:
            problems.append(
                Problem(f"{len(parts)} fields, expected Partition|NodeList|", place, lineno, KIND)
            )
            continue
        name, nodelist = parts
        name = name.removesuffix("*")
        if not name:
            problems.append(Problem("empty partition name", place, lineno, KIND, "Partition"))
            continue
        try:
            names = expand(nodelist) if nodelist not in _NO_NODES else []
        except ValueError as error:
            problems.append(Problem(str(error), place, lineno, KIND, "NodeList"))
            continue
        hosts.setdefault(name, set()).update(names)
    partitions = [ClusterPartition(name=name, nodes=compress(names)) for name, names in hosts.items()]
    return partitions, problems


def parse_node_states(
    text: str | Iterable[str], *, place: str = ""
) -> tuple[list[ClusterNodes], list[Problem]]:
    """`sinfo -h -a -e -O NodeList:|,StateComplete:|` -> one `ClusterNodes` per distinct set of states.

    States are upper-cased and split on `+` (the spec: "the output of sinfo as for the StateComplete
    specifier, split into individual states ... folded to upper case"); the group's states keep the order
    of their first line. A bad line is a `Problem`; the other lines still count.
    """
    groups: dict[frozenset[str], tuple[list[str], set[str]]] = {}
    problems: list[Problem] = []
    for lineno, line in _lines(text):
        parts = _fields(line)
        if len(parts) != 2:
            problems.append(
                Problem(f"{len(parts)} fields, expected NodeList|StateComplete|", place, lineno, KIND)
            )
            continue
        nodelist, state = parts
        try:
            names = expand(nodelist)
        except ValueError as error:
            problems.append(Problem(str(error), place, lineno, KIND, "NodeList"))
            continue
        try:
            states = node_states(state)
        except ValueError as error:
            problems.append(Problem(str(error), place, lineno, KIND, "StateComplete"))
            continue
        key = frozenset(states)
        if key not in groups:
            groups[key] = (list(dict.fromkeys(states)), set())
        groups[key][1].update(names)
    nodes = [ClusterNodes(names=compress(names), states=states) for states, names in groups.values()]
    return nodes, problems


def cluster_attributes(
    partitions_text: str | Iterable[str],
    nodes_text: str | Iterable[str],
    *,
    cluster: str,
    time: datetime,
    place: str = "",
) -> tuple[ClusterAttributes, list[Problem]]:
    """Both sinfo outputs -> the `ClusterAttributes` of a Sonar cluster envelope (`slurm` is true).

    `time` is when sinfo ran (an aware datetime; written as `YYYY-MM-DDTHH:MM:SS+hh:mm`).
    """
    partitions, problems = parse_partitions(partitions_text, place=place)
    nodes, more = parse_node_states(nodes_text, place=place)
    attributes = ClusterAttributes(
        time=format_timestamp(time), cluster=cluster, slurm=True, partitions=partitions, nodes=nodes
    )
    return attributes, problems + more
