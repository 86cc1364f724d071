"""Files that must survive a crash whole: producer state (offsets, fields sent) and outbox spill.

Written to a temporary file beside the target, fsynced, renamed over the target, and the directory fsynced:
after a crash the file is either the old or the new version, never a torn mix.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def write_atomically(path: str | os.PathLike[str], data: bytes, *, sync: bool = True) -> None:
    """Replace `path` by `data` all at once; `sync=False` skips the fsyncs (cheaper; survives a process
    crash but not a power cut)."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)
    if not sync:
        return
    try:
        dir_fd = os.open(target.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
