"""ClusterCockpit's metric store as far as where a line is stored and what a query returns (for tests).

Written to the rules of the real program, read from its source: cc-backend `pkg/metricstore/lineprotocol.go`
(`DecodeLine`; cc-metric-store 1.5 is a thin wrapper that runs this package), `level.go` (`findBuffers`) and
`metricstore.go` (`Read`), cc-backend at HEAD (2026-06, commit 3bfd3d0):

- Only `cluster`, `hostname` (or `host`), `type`, `type-id`, `stype`, `stype-id` are read; every other tag
  is ignored. A measurement not in the store's `metrics` is skipped.
- The selector below the host is `type`+`type-id` concatenated, where the *word* `node` is skipped but a
  `type-id` is always appended: `type=hwthread,type-id=3` -> `hwthread3`, `type=node,type-id=0` -> `0`,
  `type=node` alone -> nothing (the host itself).
- `stype`+`stype-id` (`disksda`) is appended as a second element only when the first one is not empty: below
  `type=node` without a `type-id` a sub-type is dropped.
- Only the field `value` is accepted; another field aborts the rest of the message (as a bad line does).
- A write at an existing (level, measurement, second) overwrites it.
- A read of a level (host, no type: the node-level query cc-backend makes) takes the level's own value of the
  measurement when it has one, else the values of all its children, recursively (each child: its own value,
  else its children's), aggregated by the metric's `aggregation` (`avg` default here, or `sum`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from line_protocol_parser import LineFormatError, parse_line

Path = tuple[str, ...]
"""(cluster, host, selector...) of a level."""


class MetricStore:
    """Levels and values of the metric store after decoding messages (see the module docstring)."""

    def __init__(self, metrics: dict[str, str] | None = None, *, cluster: str = "") -> None:
        self.metrics = metrics
        """measurement -> aggregation (`avg`, `sum`); None: every measurement is configured, `avg`."""
        self.cluster = cluster
        """The subscription's `cluster-tag`: the cluster of lines without one."""
        self.values: dict[Path, dict[tuple[str, int], float]] = defaultdict(dict)

    def decode(self, payload: bytes | str) -> None:
        """One NATS message, line by line, as `DecodeLine` reads it."""
        text = payload.decode() if isinstance(payload, bytes) else payload
        for raw in text.split("\n"):
            raw = raw.strip()
            if not raw or raw.startswith("#"):
                continue
            try:
                d = parse_line(raw)
            except LineFormatError:
                return  # the real decoder aborts the rest of the message
            name = d["measurement"]
            if self.metrics is not None and name not in self.metrics:
                continue
            path = self.path_of(d["tags"])
            fields = d["fields"]
            if set(fields) != {"value"} or isinstance(fields["value"], bool | str):
                return
            self.values[path][(name, int(d["time"]))] = float(fields["value"])

    def decode_all(self, payloads: Iterable[bytes | str]) -> MetricStore:
        for p in payloads:
            self.decode(p)
        return self

    def path_of(self, tags: dict[str, str]) -> Path:
        """The level a line with these tags is written to."""
        cluster, host = self.cluster, ""
        type_buf = sub_buf = ""
        for key, val in tags.items():
            if key == "cluster":
                cluster = val
            elif key in ("hostname", "host"):
                host = val
            elif key == "type":
                if val != "node":
                    type_buf = val + type_buf  # `reorder`: the type goes before a type-id seen first
            elif key == "type-id":
                type_buf += val
            elif key == "stype":
                sub_buf = val + sub_buf
            elif key == "stype-id":
                sub_buf += val
        selector: tuple[str, ...] = ()
        if type_buf:
            selector = (type_buf, sub_buf) if sub_buf else (type_buf,)
        return (cluster, host, *selector)

    def paths(self, measurement: str) -> set[Path]:
        """Every level that holds a value of `measurement`."""
        return {path for path, vals in self.values.items() if any(m == measurement for m, _ in vals)}

    def read(self, cluster: str, host: str, measurement: str, time: int, *selector: str) -> float | None:
        """What a query for the level (cluster, host, selector...) returns at `time` (None: no data)."""
        top: Path = (cluster, host, *selector)
        found: list[float] = []
        self._find(top, measurement, time, found)
        if not found:
            return None
        if len(found) == 1:
            return found[0]
        how = (self.metrics or {}).get(measurement, "avg")
        return sum(found) / len(found) if how == "avg" else sum(found)

    def _find(self, path: Path, measurement: str, time: int, found: list[float]) -> None:
        vals = self.values.get(path, {})
        if any(
            m == measurement for m, _ in vals
        ):  # the level has a buffer of its own: its children are not read
            if (measurement, time) in vals:
                found.append(vals[(measurement, time)])
            return
        n = len(path)
        children = {p[: n + 1] for p in self.values if len(p) > n and p[:n] == path}
        for child in sorted(children):
            self._find(child, measurement, time, found)
