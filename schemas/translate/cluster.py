"""Cluster envelopes <-> `cluster` events, and cc-backend `nodestate` events (docs/mapping.md section 7).

The envelope travels whole because its node ranges and their grouping by state set cannot be rebuilt exactly
from per-host data (`compress` finds *a* canonical form, not the one sinfo printed). For cc-backend the states
are also derived per host. Back from ClusterCockpit, `nodestate` (and hpcbus `partition`) events are merged per
cluster, later events winning per host/partition, and flushed after the grace window as a ClusterEnvelope whose
NodeRanges are compressed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from hpcbus.schemas.lineprotocol import Line
from hpcbus.schemas.noderange import compress, expand, is_valid
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.sonar.types import (
    ClusterAttributes,
    ClusterData,
    ClusterEnvelope,
    ClusterNodes,
    ClusterPartition,
)
from hpcbus.schemas.translate.common import Assembled, own_meta, utc_timestamp
from hpcbus.schemas.translate.events import (
    MAX_PART_BYTES,
    envelope_event,
    errors_tags,
    placed,
    sonar_event_parts,
)

__all__ = ["ClusterAssembler", "cluster_to_lines"]


def cluster_to_lines(
    env: ClusterEnvelope,
    *,
    cluster: str = "",
    cc_events: bool = True,
    now: int = 0,
    max_part_bytes: int = MAX_PART_BYTES,
) -> list[Line]:
    """The `cluster` event(s), then (with `cc_events`) cc-backend `nodestate` events with every host expanded.

    An envelope larger than `max_part_bytes` travels as several `cluster` events (`part`/`parts` tags), each a
    valid envelope of its own with some of the partitions and node groups (`schemas.sonar.split`); the
    `nodestate` event is cut the same way by hosts (cc-backend stores each host's states from any of them)."""
    data = env.data
    if data is None:
        tags, ts = errors_tags(env.errors, cluster, node_level=False, now=now)
        return [envelope_event("cluster", env, tags, ts)]
    a = data.attributes
    tags, ts = placed(a.time, a.cluster, cluster, now)
    lines = [
        Line("cluster", part_tags, {"event": payload.decode()}, ts)
        for part_tags, payload in sonar_event_parts(env, tags, max_part_bytes)
    ]
    if cc_events and a.nodes and tags:  # cc-backend's node states need their cluster: none is made up
        head = msgspec.json.encode({"cluster": tags["cluster"], "nodes": []})
        runs: list[list[bytes]] = [[]]
        size = len(head)
        for group in a.nodes:
            states = [s.lower() for s in group.states]
            for rng in group.names:
                try:
                    hosts = expand(rng)
                except ValueError:
                    continue  # the cluster event above still carries it exactly
                for h in hosts:
                    node = msgspec.json.encode({"hostname": h, "states": states})
                    if runs[-1] and size + len(node) + 1 > max_part_bytes:
                        runs.append([])
                        size = len(head)
                    runs[-1].append(node)
                    size += len(node) + 1
        for run in runs:
            payload = head[:-2] + b",".join(run) + b"]}"
            lines.append(Line("nodestate", {**tags, "origin": "sonar"}, {"event": payload.decode()}, ts))
    return lines


class _NodeStates(msgspec.Struct):
    cluster: str = ""
    nodes: list[dict[str, Any]] = []


class _Partition(msgspec.Struct):
    name: str
    nodes: list[str] = []


class _Pending:
    __slots__ = ("created", "hosts", "newest", "partitions")

    def __init__(self, created: float):
        self.created = created
        self.newest = 0
        self.hosts: dict[str, tuple[str, ...]] = {}
        self.partitions: dict[str, set[str]] = {}


def _ranges(hosts: Iterable[str], problems: list[Problem]) -> list[str]:
    """NodeRanges of `hosts`; a name no NodeRange can hold (eg non-ASCII) is reported, not emitted invalid."""
    good: list[str] = []
    bad: list[str] = []
    for host in sorted(set(hosts)):
        (good if is_valid(host) else bad).append(host)
    for host in bad:
        problems.append(
            Problem(
                f"host name {host!r} cannot be written as a Sonar NodeRange; left out",
                kind="nodestate",
                severity="warning",
            )
        )
    return compress(good) if good else []


class ClusterAssembler:
    """`cluster`/`nodestate`/`partition` events -> ClusterEnvelopes (see the module docstring)."""

    def __init__(self, *, grace: float = 30.0, max_hosts: int = 1_000_000):
        self.grace = grace
        self.max_hosts = max_hosts
        self._pending: dict[str, _Pending] = {}

    @property
    def waiting(self) -> bool:
        """Something is held for a later envelope."""
        return bool(self._pending)

    def add_lines(self, lines: Iterable[Line], *, cluster: str = "", now: float) -> list[Assembled]:
        out: list[Assembled] = []
        for line in lines:
            payload = line.fields.get("event")
            if not isinstance(payload, str):
                continue
            meas, tags = line.measurement, line.tags
            try:
                if meas == "cluster" and tags.get("function") == "sonar":
                    out.append(
                        Assembled(kind="cluster", envelope=msgspec.json.decode(payload, type=ClusterEnvelope))
                    )
                elif meas == "nodestate" and tags.get("origin") != "sonar":
                    states = msgspec.json.decode(payload, type=_NodeStates)
                    pending = self._get(states.cluster or tags.get("cluster") or cluster, line.time, now)
                    for node in states.nodes:
                        host = node.get("hostname")
                        if isinstance(host, str) and host:
                            pending.hosts[host] = tuple(str(s).upper() for s in node.get("states") or [])
                    self._check_size(states.cluster or tags.get("cluster") or cluster, out)
                elif meas == "partition":
                    part = msgspec.json.decode(payload, type=_Partition)
                    hosts: set[str] = set()
                    for rng in part.nodes:
                        hosts.update(expand(rng))
                    self._get(tags.get("cluster") or cluster, line.time, now).partitions[part.name] = hosts
            except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
                out.append(_problem_only(tags.get("cluster") or cluster, line, f"{meas} event: {exc}"))
        return out

    def _get(self, cluster: str, time: int, now: float) -> _Pending:
        pending = self._pending.get(cluster)
        if pending is None:
            pending = self._pending[cluster] = _Pending(now)
        pending.newest = max(pending.newest, time)
        return pending

    def _check_size(self, cluster: str, out: list[Assembled]) -> None:
        if len(self._pending[cluster].hosts) >= self.max_hosts:
            out.append(self._envelope(cluster, self._pending.pop(cluster)))

    @staticmethod
    def _envelope(cluster: str, pending: _Pending) -> Assembled:
        problems: list[Problem] = []
        by_states: dict[tuple[str, ...], list[str]] = {}
        for host, states in pending.hosts.items():
            by_states.setdefault(states, []).append(host)
        nodes = []
        for states, hosts in sorted(by_states.items()):
            names = _ranges(hosts, problems)
            if names:  # a ClusterNodes needs at least one NodeRange
                nodes.append(ClusterNodes(names=names, states=list(states)))
        partitions = [
            ClusterPartition(name=name, nodes=_ranges(hosts, problems))
            for name, hosts in sorted(pending.partitions.items())
        ]
        attrs = ClusterAttributes(
            time=utc_timestamp(pending.newest),
            cluster=cluster or "unknown",
            slurm=True,
            partitions=partitions,
            nodes=nodes,
        )
        env = ClusterEnvelope(meta=own_meta("clustercockpit"), data=ClusterData(attributes=attrs))
        return Assembled(kind="cluster", envelope=env, complete=False, problems=problems)

    def flush(self, now: float) -> list[Assembled]:
        limit = now - self.grace
        return [
            self._envelope(cl, self._pending.pop(cl))
            for cl in [c for c, p in self._pending.items() if p.created <= limit]
        ]

    def flush_all(self) -> list[Assembled]:
        return self.flush(float("inf"))


def _problem_only(cluster: str, line: Line, reason: str) -> Assembled:
    attrs = ClusterAttributes(time=utc_timestamp(line.time), cluster=cluster or "unknown")
    env = ClusterEnvelope(meta=own_meta(), data=ClusterData(attributes=attrs))
    return Assembled(
        kind="cluster",
        envelope=env,
        complete=False,
        problems=[Problem(reason, kind="lp event", path="event")],
    )
