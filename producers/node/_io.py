"""Cheap, exception-light reads of small kernel files, shared by every reader of this package.

Why not `open().read()`: the collector reads several files per process on every node every interval, so
the buffered-file machinery (an io.FileIO, a BufferedReader, a TextIOWrapper and a decode) is the cost that
dominates. One `os.open` + `os.read` + `os.close` on a bytes path does the same work with three syscalls
and one allocation. Files under /proc and /sys are generated on read, so a second read is only needed when
the first one filled the buffer.

psutil reads the same kernel files; where it is as fast as the hand parser (see the figures in each
reader's docstring), a reader calls it inside `psutil_procfs(root)`, so that fixture trees keep working.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache

import psutil

_BUF = 16384


def read_bytes(path: str | bytes, bufsize: int = _BUF, *, dir_fd: int | None = None) -> bytes:
    """The whole content of `path` (relative to the directory `dir_fd` when given: the kernel then skips
    looking up the leading directories); raises OSError like `open` (missing file, vanished pid, EACCES)."""
    fd = os.open(path, os.O_RDONLY, dir_fd=dir_fd)
    try:
        data = os.read(fd, bufsize)
        if len(data) < bufsize:
            return data
        chunks = [data]
        while True:
            more = os.read(fd, 65536)
            if not more:
                return b"".join(chunks)
            chunks.append(more)
    finally:
        os.close(fd)


def read_optional(path: str | bytes) -> bytes | None:
    """Like `read_bytes`, but None when the file cannot be read (absent hardware, no permission)."""
    try:
        return read_bytes(path)
    except OSError:
        return None


def read_text(path: str, default: str = "") -> str:
    """A small sysfs attribute as stripped text, or `default` when it cannot be read."""
    data = read_optional(path)
    if data is None:
        return default
    return data.decode("utf-8", "replace").strip()


def read_int(path: str) -> int | None:
    """A sysfs attribute holding one integer, or None when absent or not a number."""
    data = read_optional(path)
    if data is None:
        return None
    try:
        return int(data)
    except ValueError:
        return None


def list_dir(path: str) -> list[str]:
    """Entries of a directory, sorted; [] when it does not exist (the hardware is simply not there)."""
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def join_root(root: str, path: str) -> str:
    """`path` (absolute, e.g. `/proc/stat`) under the reader's root; `/` keeps it unchanged."""
    if root in ("", "/"):
        return path
    return root.rstrip("/") + path


_PROCFS_LOCK = threading.Lock()


@contextmanager
def psutil_procfs(root: str) -> Iterator[None]:
    """Run psutil's system-wide functions against `<root>/proc` (psutil.PROCFS_PATH), then restore it.

    PROCFS_PATH is a module global of psutil, and the agent reads in worker threads (a sample and the
    daily sysinfo may overlap), so the swap is held under one lock for the duration of the call: psutil
    calls made here never see another reader's root. On a node (`root` `/`) nothing is changed. Only
    psutil functions that read PROCFS_PATH may be called inside (not, e.g., `cpu_freq` or `getloadavg`,
    which read /sys or call the C library directly).
    """
    path = join_root(root, "/proc")
    with _PROCFS_LOCK:
        saved = psutil.PROCFS_PATH
        if path == saved:
            yield
            return
        psutil.PROCFS_PATH = path
        try:
            yield
        finally:
            psutil.PROCFS_PATH = saved


@cache
def clock_ticks() -> int:
    """USER_HZ, the unit of every tick count in /proc (100 on all mainstream architectures)."""
    try:
        value = os.sysconf("SC_CLK_TCK")
    except (ValueError, OSError):
        value = 100
    return value if value > 0 else 100


@cache
def page_size() -> int:
    """Bytes per page, the unit of `rss` in /proc/<pid>/stat."""
    try:
        value = os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        value = 4096
    return value if value > 0 else 4096


def parse_range_list(text: str) -> list[int]:
    """Kernel cpu/node lists such as `0-3,8,10-11` (cpulist format) as a sorted list of ints."""
    out: list[int] = []
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            if sep:
                out.extend(range(int(lo), int(hi) + 1))
            else:
                out.append(int(lo))
        except ValueError:
            continue
    return sorted(set(out))
