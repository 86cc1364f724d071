"""Metric lines (+ skeleton events) from any number of NATS messages -> Sonar sample envelopes.

`Assembler` groups by (cluster, hostname, timestamp) — the identity of a Sonar sample — and emits a group when
its skeleton's announced line count is reached (complete), when it is older than the grace window, when too
many groups are open, or when it grew past `max_lines` (partial). Why these rules: a sample's lines may be
split over several messages and subjects (the skeleton travels on `.events.sample`, the values on `.metrics`)
that arrive in any order; waiting for all of them must neither hold memory without bound nor lose data, so
anything that cannot be completed is emitted as it is, flagged, and anything that arrives too late becomes a
follow-up envelope (docs/mapping.md section 4.3).

ClusterCockpit collector lines that have a Sonar meaning only *without* a skeleton (`cpu_user` per hwthread,
`nv_util`, `load_one`, ...: the aliases of section 4.4) never open or extend a group whose (cluster, host, time)
has, or had, a skeleton: the skeleton's own lines already carry those values (hpcbus' node producer sends
both kinds in one message, the CC lines after the Sonar ones). Taken as they were, they were a second,
"follow-up" envelope per sample whose `cpus` were integrated from percentages, zeros between two real samples.

Hot path: `add_lines` does one dict lookup for the measurement and one insert per line (the group is looked
up again only when it changes); all placing and converting happens once per group, when it is emitted.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from hpcbus.schemas.lineprotocol import Line
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.sonar.types import (
    SampleAttributes,
    SampleData,
    SampleEnvelope,
    SampleSystem,
)
from hpcbus.schemas.translate.common import (
    Assembled,
    epoch_of,
    own_meta,
    utc_timestamp,
)
from hpcbus.schemas.translate.lp_placer import Placer, canonical_order, empty_sample
from hpcbus.schemas.translate.lp_targets import (
    BUSY_PARTS,
    COUNTED_TYPE,
    DISKSTAT_N,
    DISPATCH,
    MAX_CPUS,
    MAX_DISK_COLUMN,
    GroupKey,
    LineKey,
    Target,
    to_int,
)
from hpcbus.schemas.translate.sample_to_lp import SampleHeader

__all__ = ["Assembler"]

# What was emitted for a (cluster, host, time) (`Assembler._emitted`), in increasing order of knowledge.
_BARE = 1
"""Emitted without a skeleton (built from tags)."""
_SKELETON = 2
"""Emitted with its skeleton, partial: the CC aliases of a later line have no Sonar meaning for it."""
_COMPLETE = 3
"""Emitted complete: a skeleton arriving again is a duplicate."""


class _Group:
    """The lines of one (cluster, hostname, time) seen so far."""

    __slots__ = ("created", "expected", "extra", "followup", "header", "key", "limit", "lines")

    def __init__(self, key: GroupKey, created: float, followup: bool, limit: int):
        self.key = key
        self.created = created
        self.followup = followup
        self.header: SampleHeader | None = None
        self.expected = -1
        self.limit = limit
        """Emit when `len(lines)` reaches this: the announced count, or what `max_lines` leaves room for."""
        self.lines: dict[LineKey, Line] = {}
        self.extra: dict[LineKey, Line] = {}


class Assembler:
    """Groups metric lines and skeleton events into SampleEnvelopes (see the module docstring).

    Feed it with `add_lines(lines, cluster=..., now=...)` (`cluster` = the subject's cluster, used for lines
    without a `cluster` tag; `now` = a clock in seconds, monotonic or wall, only compared with itself), call
    `flush(now)` periodically and `flush_all()` at the end. Each returns the envelopes that became ready.
    """

    def __init__(
        self,
        *,
        grace: float = 30.0,
        max_groups: int = 4096,
        max_lines: int = 200_000,
        remember: int | None = None,
        max_hosts: int = 65_536,
    ):
        if grace < 0 or max_groups < 1 or max_lines < 1:
            raise ValueError("grace must be >= 0, max_groups and max_lines >= 1")
        self.grace = grace
        self.max_groups = max_groups
        self.max_lines = max_lines
        self.remember = remember if remember is not None else 16 * max_groups
        self.max_hosts = max_hosts
        self._groups: dict[GroupKey, _Group] = {}
        self._emitted: dict[GroupKey, int] = {}
        """Keys already emitted -> the most that any emission of it had: `_BARE`, `_SKELETON` or `_COMPLETE`
        (bounded by `remember`)."""
        self._cpu: dict[tuple[str, str], tuple[int, list[float]]] = {}
        """Per (cluster, host): time of the last integrated group and busy seconds per hwthread."""
        self.ignored = 0
        """Metric lines that have no Sonar field (ClusterCockpit-only metrics), or whose ClusterCockpit alias has
        no Sonar meaning next to a skeleton."""
        self.duplicates = 0
        """Skeletons that arrived again after their complete envelope was emitted (redelivery)."""

    @property
    def open_groups(self) -> int:
        return len(self._groups)

    # --- input ---------------------------------------------------------------------------------------------

    def add_lines(
        self, lines: Iterable[Line], *, cluster: str = "", now: float, others: list[Line] | None = None
    ) -> list[Assembled]:
        """Take lines (metrics of any kind and `sample` skeleton events). Other events are ignored, or appended
        to `others` when given (so that `LpToSonar` routes a mixed stream in this one pass over it).

        The loop is the translator's hot path (~3,000 lines per node sample): a registry line of its own level
        costs two dict lookups, one key tuple and one insert; the current group is found again only when the
        line's (cluster, host, time) differs from the previous line's, compared field by field so that no
        tuple is built for it. Everything else (CC aliases, `diskstat_<k>`, other levels) takes `_add_other`.
        """
        out: list[Assembled] = []
        groups = self._groups
        counted = COUNTED_TYPE
        group: _Group | None = None
        known: dict[LineKey, Line] = {}
        g_cluster = g_host = ""
        g_time = limit = 0
        for line in lines:
            fields = line.fields
            if "value" not in fields:
                if line.measurement == "sample" and "event" in fields:
                    self._add_header(line, cluster, now, out)
                    group = None  # it may have emitted the current group
                elif others is not None:
                    others.append(line)
                continue
            meas = line.measurement
            tags = line.tags
            level_type = counted.get(meas)
            if level_type is None or tags.get("type") != level_type:
                self._add_other(line, cluster, now, out)
                group = None
                continue
            t = line.time
            host = tags.get("hostname", "")
            cl = tags.get("cluster") or cluster
            if group is None or t != g_time or host != g_host or cl != g_cluster:
                gkey = (cl, host, t)
                group = groups.get(gkey)
                if group is None:
                    group = self._open(gkey, now, out)
                g_cluster, g_host, g_time = gkey
                known, limit = group.lines, group.limit  # only headers and `_add_other` change the limit
            known[(meas, tags.get("type-id"), tags.get("stype-id"))] = line
            if len(known) >= limit:
                self._emit(group, out)
                group = None
        return out

    def _add_other(self, line: Line, cluster: str, now: float, out: list[Assembled]) -> None:
        """A metric line that is not a registry measurement at its own level: a ClusterCockpit alias (not
        counted toward the skeleton's total), a `diskstat_<k>` column beyond the registry, or ignored.

        An alias stands for a Sonar field only in a stream without skeletons: next to a skeleton (open, or
        already emitted for the same key) it is ClusterCockpit-only data and ignored, never a group of its
        own."""
        meas = line.measurement
        target = DISPATCH.get(meas)
        if target is None:
            target = self._diskstat_target(meas)
            if target is None:
                self.ignored += 1
                return
        tags = line.tags
        if tags.get("type") != target.type:
            self.ignored += 1  # eg cpu_load per hwthread, cpu_user per node: no Sonar field for them
            return
        gkey = (tags.get("cluster") or cluster, tags.get("hostname", ""), line.time)
        group = self._groups.get(gkey)
        if not target.counted and (
            (group is not None and group.header is not None) or self._emitted.get(gkey, 0) >= _SKELETON
        ):
            self.ignored += 1
            return
        if group is None:
            group = self._open(gkey, now, out)
        lkey = (meas, tags.get("type-id"), tags.get("stype-id"))
        if target.counted:
            group.lines[lkey] = line
        else:
            extra = group.extra  # only in a group without a skeleton (see above): room for the counted lines
            extra[lkey] = line
            group.limit = self.max_lines - len(extra)
        if len(group.lines) >= group.limit:
            self._emit(group, out)

    def _add_header(self, line: Line, cluster: str, now: float, out: list[Assembled]) -> None:
        try:
            header = msgspec.json.decode(str(line.fields["event"]), type=SampleHeader)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # Not placeable, but not silently dropped either: an empty partial result carries the problem.
            problem = Problem(f"skeleton not decodable: {exc}", kind="lp event", path="event sample")
            out.append(
                Assembled(
                    kind="sample", envelope=empty_sample(cluster, line), complete=False, problems=[problem]
                )
            )
            return
        data = header.skeleton.data
        if data is None or not (data.attributes.time and data.attributes.cluster and data.attributes.node):
            # Errors-only, or a sample that could not be placed (`sample_to_lines`): nothing to wait for.
            out.append(Assembled(kind="sample", envelope=header.skeleton))
            return
        a = data.attributes
        gkey = (a.cluster, a.node, epoch_of(a.time))
        if self._emitted.get(gkey, 0) == _COMPLETE and gkey not in self._groups:
            self.duplicates += 1
            return
        group = self._groups.get(gkey)
        if group is None:
            group = self._open(gkey, now, out)
        if group.header is None:
            group.header = header
            group.expected = header.lines
            # ClusterCockpit aliases taken while the skeleton was on its way: CC-only data next to it.
            self.ignored += len(group.extra)
            group.extra.clear()
            group.limit = min(header.lines, self.max_lines)
        if len(group.lines) >= group.limit:
            self._emit(group, out)

    def _diskstat_target(self, meas: str) -> Target | None:
        m = DISKSTAT_N.fullmatch(meas)
        if m is None or not 17 < int(m[1]) <= MAX_DISK_COLUMN:
            return None
        target = Target("disk", "stats", to_int, 0, True, int(m[1]) - 1, "node")
        DISPATCH[meas] = target  # bounded: at most MAX_DISK_COLUMN names
        COUNTED_TYPE[meas] = "node"
        return target

    # --- groups ----------------------------------------------------------------------------------------------

    def _open(self, gkey: GroupKey, now: float, out: list[Assembled]) -> _Group:
        groups = self._groups
        while len(groups) >= self.max_groups:
            self._emit(next(iter(groups.values())), out)
        group = _Group(gkey, now, gkey in self._emitted, self.max_lines)
        groups[gkey] = group
        return group

    def _emit(self, group: _Group, out: list[Assembled]) -> None:
        del self._groups[group.key]
        result = self._build(group)
        emitted = self._emitted
        state = _COMPLETE if result.complete else _SKELETON if group.header is not None else _BARE
        emitted[group.key] = max(state, emitted.pop(group.key, 0))
        while len(emitted) > self.remember:
            del emitted[next(iter(emitted))]
        out.append(result)

    def flush(self, now: float) -> list[Assembled]:
        """Emit every group that has waited `grace` seconds or more (partial envelopes)."""
        out: list[Assembled] = []
        limit = now - self.grace
        groups = self._groups
        while groups:
            group = next(iter(groups.values()))  # insertion order = creation order
            if group.created > limit:
                break
            self._emit(group, out)
        return out

    def flush_all(self) -> list[Assembled]:
        """Emit every open group (end of input)."""
        out: list[Assembled] = []
        while self._groups:
            self._emit(next(iter(self._groups.values())), out)
        return out

    # --- building --------------------------------------------------------------------------------------------

    def _build(self, group: _Group) -> Assembled:
        cluster, host, ts = group.key
        header = group.header
        problems: list[Problem] = []
        if header is not None and header.skeleton.data is not None:
            env = header.skeleton
            attrs = env.data.attributes  # type: ignore[union-attr]
            degraded = False
        else:
            attrs = SampleAttributes(
                time=utc_timestamp(ts),
                cluster=cluster or "unknown",
                node=host or "unknown",
                system=SampleSystem(),
            )
            env = SampleEnvelope(meta=own_meta(), data=SampleData(attributes=attrs))
            degraded = True
        place = Placer(attrs, problems)
        place.put_all(group.lines.items())
        busy: dict[int, dict[str, float]] = {}
        for (meas, tid, sid), line in group.extra.items():
            target = DISPATCH[meas]
            if target.level == "busy":
                if tid is not None and tid.isdigit():
                    busy.setdefault(int(tid), {})[meas] = float(line.fields["value"])
            else:
                place.put(target, line, tid, sid)
        if busy and not attrs.system.cpus:
            self._integrate(cluster, host, ts, busy, attrs.system)
        if degraded:
            canonical_order(attrs)
        complete = header is not None and len(group.lines) >= group.expected
        return Assembled(
            kind="sample", envelope=env, complete=complete, followup=group.followup, problems=problems
        )

    def _integrate(
        self, cluster: str, host: str, ts: int, busy: dict[int, dict[str, float]], system: SampleSystem
    ) -> None:
        """Sonar's cumulative busy seconds per hwthread from ClusterCockpit's per-interval percentages."""
        state = self._cpu.pop((cluster, host), None)
        last, acc = state if state is not None else (ts, [])
        n = max(busy) + 1
        if n > MAX_CPUS:
            return
        if len(acc) < n:
            acc.extend([0.0] * (n - len(acc)))
        dt = ts - last
        if 0 < dt <= 3600:  # a gap longer than an hour (or time going back) adds nothing rather than a guess
            for i, parts in busy.items():
                pct = (
                    sum(parts[p] for p in BUSY_PARTS if p in parts)
                    if any(p in parts for p in BUSY_PARTS)
                    else parts.get("cpu_used", 0.0)
                )
                if pct > 0:
                    acc[i] += pct / 100.0 * dt
        self._cpu[(cluster, host)] = (max(ts, last), acc)
        while len(self._cpu) > self.max_hosts:
            del self._cpu[next(iter(self._cpu))]
        system.cpus = [int(x) for x in acc]
