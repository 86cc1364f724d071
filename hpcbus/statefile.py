"""Files that must survive a crash whole: producer state (offsets, fields sent) and outbox spill.

Written to a temporary file beside the target, fsynced, renamed over the target, and the directory fsynced:
after a crash the file is either the old or the new version, never a torn mix.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
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


def state_directory(environ: Mapping[str, str] | None = None) -> Path:
    """Where a worker keeps its state when no file is named: never the current directory, which is wherever
    the command happened to be started (two runs from one directory for two clusters shared one file).

    systemd's `$STATE_DIRECTORY` first (the units of deploy/systemd/ set `StateDirectory=hpcbus`; systemd
    may pass several, colon-separated: the first is ours), else the user's state directory
    (`$XDG_STATE_HOME/hpcbus`, `~/.local/state/hpcbus`). Not created here: the caller creates it when it
    writes."""
    env = os.environ if environ is None else environ
    given = env.get("STATE_DIRECTORY", "").split(":")[0]
    if given:
        return Path(given)
    xdg = env.get("XDG_STATE_HOME", "")
    base = (
        Path(xdg)
        if xdg and Path(xdg).is_absolute()
        else Path(env.get("HOME") or Path.home()) / ".local/state"
    )
    return base / "hpcbus"
