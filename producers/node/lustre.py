"""Lustre client (llite) statistics per mounted file system (ClusterCockpit lustrestat; Slurm
acct_gather_filesystem/lustre reads the same file for Reads/ReadMB/Writes/WriteMB).

Each line of `llite/<fsname>-<instance>/stats` is `<op> <count> samples [<unit>] [min max sum [sumsq]]`;
`read_bytes`/`write_bytes` carry the byte total in `sum`. The file lives in /proc/fs/lustre on most
versions and in /sys/kernel/debug/lustre on some newer ones; both are looked at.
"""

from __future__ import annotations

import os

import msgspec

from hpcbus.producers.node._io import join_root, list_dir, read_bytes
from hpcbus.producers.node._rates import rate

_DIRS = ("/proc/fs/lustre/llite", "/sys/kernel/debug/lustre/llite")


class LustreStats(msgspec.Struct, frozen=True, kw_only=True):
    """Counters of one Lustre client mount since mount (or since the stats were cleared)."""

    mount: str
    """llite instance, e.g. `scratch-ffff8f2a1b3c4000`."""
    fs: str
    """File system name (the instance name before the last `-`)."""
    read_bytes: int
    """Bytes read through this client."""
    write_bytes: int
    """Bytes written."""
    reads: int
    """Read calls (samples of read_bytes)."""
    writes: int
    """Write calls (samples of write_bytes)."""
    ops: dict[str, int]
    """Sample count of every operation the file lists (open, close, getattr, setattr, statfs, ...)."""


class LustreRate(msgspec.Struct, frozen=True, kw_only=True):
    """Per-second rates of one mount between two readings."""

    mount: str
    fs: str
    read_bytes_per_s: float
    write_bytes_per_s: float
    reads_per_s: float
    writes_per_s: float
    ops_per_s: dict[str, float]


def parse_llite_stats(mount: str, data: bytes) -> LustreStats:
    """Parse one llite stats file."""
    ops: dict[str, int] = {}
    rb = wb = 0
    for line in data.split(b"\n"):
        f = line.split()
        if len(f) < 3 or f[2] != b"samples":
            continue  # snapshot_time, start_time, elapsed_time, blank
        name = f[0].decode("ascii", "replace")
        try:
            ops[name] = int(f[1])
            if name == "read_bytes" and len(f) >= 7:
                rb = int(f[6])
            elif name == "write_bytes" and len(f) >= 7:
                wb = int(f[6])
        except ValueError:
            continue
    return LustreStats(
        mount=mount,
        fs=mount.rsplit("-", 1)[0],
        read_bytes=rb,
        write_bytes=wb,
        reads=ops.get("read_bytes", 0),
        writes=ops.get("write_bytes", 0),
        ops=ops,
    )


class LustreReader:
    """Reads every `llite/*/stats` under `<root>`; no Lustre client -> empty list."""

    def __init__(self, root: str = "/"):
        self.dirs = [join_root(root, d) for d in _DIRS]

    def read(self) -> list[LustreStats]:
        seen: set[str] = set()
        out: list[LustreStats] = []
        for base in self.dirs:
            for mount in list_dir(base):
                if mount in seen:
                    continue
                try:
                    data = read_bytes(os.path.join(base, mount, "stats"))
                except OSError:
                    continue
                seen.add(mount)
                out.append(parse_llite_stats(mount, data))
        return out


def lustre_rates(prev: list[LustreStats], cur: list[LustreStats], dt: float) -> list[LustreRate]:
    """Rates for mounts present in both readings; counters that went down (stats cleared) give none."""
    before = {s.mount: s for s in prev}
    out: list[LustreRate] = []
    for s in cur:
        p = before.get(s.mount)
        if p is None:
            continue
        values = (
            rate(p.read_bytes, s.read_bytes, dt),
            rate(p.write_bytes, s.write_bytes, dt),
            rate(p.reads, s.reads, dt),
            rate(p.writes, s.writes, dt),
        )
        if any(v is None for v in values):
            continue
        rb, wb, r, w = (float(v or 0.0) for v in values)
        ops: dict[str, float] = {}
        for name, count in s.ops.items():
            v = rate(p.ops.get(name), count, dt)
            if v is not None:
                ops[name] = v
        out.append(
            LustreRate(
                mount=s.mount,
                fs=s.fs,
                read_bytes_per_s=rb,
                write_bytes_per_s=wb,
                reads_per_s=r,
                writes_per_s=w,
                ops_per_s=ops,
            )
        )
    return out
