"""Errors no retry can cure, told from transient ones: the one place that decides (`permanent`).

Retrying forever is right for a service that is down and wrong for a message that can never be delivered (a file name too long, a permission refused, a value the sink can never store):
one such message would halt the worker for good. `permanent` is the one place that tells the two apart (a
sink's `Permanent`, or an `OSError` whose errno no retry changes). A batch that fails permanently is delivered
again message by message, and each message that fails again on its own is dead-lettered with the reason and
acknowledged, so the good messages of that batch are delivered and everything behind them flows. Such
messages are counted (`hpcbus_undeliverable_messages`) and logged once per episode, not once per message.
(The delivering again and the dead letters are `hpcbus.runner`'s part.)
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

from nats.aio.msg import Msg

from hpcbus.retry import describe
from hpcbus.schemas.problems import Problem

PERMANENT_ERRNOS = frozenset(
    {
        errno.ENAMETOOLONG,  # the name is too long for the file system
        errno.EACCES,  # permission refused (each: under a tree root that can be written, see `permanent`)
        errno.EPERM,
        errno.EROFS,  # a read-only file system
        errno.EINVAL,  # a name or argument the file system refuses
        errno.ENOTDIR,  # a file where a directory should be
        errno.EISDIR,
        errno.EEXIST,  # (from mkdir) something that is not a directory in the way
        errno.ELOOP,
        errno.EFBIG,  # the file is at the largest size this system allows
    }
)
"""`OSError` numbers that no retry cures: the name, the path or the permission is wrong, not the moment.
Transient on purpose: ENOSPC and EDQUOT (space comes back), EIO, EMFILE/ENFILE, EAGAIN, EINTR, ENOMEM."""


class Permanent(Exception):
    """An error no retry can cure; a sink raises it from `deliver`.

    `msgs` None: the batch failed as a whole and the sink cannot say which message caused it: the runner
    delivers each message of the batch again on its own and dead-letters the ones that fail again. A list:
    every other message of the batch is delivered, these failed: the runner dead-letters them, each with
    its own reason from `reasons` (by `id(msg)`; `reason` otherwise) and the `problems` the sink found in it
    besides (by `id(msg)`: one dead letter per message, since a second with the same dedup id is dropped)."""

    def __init__(
        self,
        reason: str,
        msgs: list[Msg] | None = None,
        *,
        reasons: dict[int, str] | None = None,
        problems: dict[int, list[Problem]] | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.msgs = msgs
        self.reasons = reasons or {}
        self.problems = problems or {}


def writable(root: Path) -> bool:
    """True when a file can be created in directory `root` (created if missing): a probe file, made and
    removed, since `os.access` says yes to root for an immutable directory or a read-only `/sys`."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=root, prefix=".hpcbus-probe-")
        os.close(fd)
        os.unlink(name)
    except OSError:
        return False
    return True


def permanent(exc: BaseException, root: Path | None = None) -> str | None:
    """The reason why `exc` (or an exception it was raised from) can never succeed on retry; None when
    retrying may help. The one place that tells the two apart.

    `root`: the tree the failed item lives in. Such an error (a permission refused, ENOTDIR, ...) is the
    item's own only when `root` can still be written; otherwise the whole tree is refused (a read-only
    remount, a root owned by someone else or replaced by a file) and every message would fail alike:
    transient, retried (the worker stalls, one WARNING per episode) instead of dead-lettering the whole
    flow. Without `root` such an error is permanent."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, Permanent):
            return seen.reason
        if isinstance(seen, OSError) and seen.errno in PERMANENT_ERRNOS:
            if root is not None and not writable(root):
                return None  # the whole tree refuses (a permission, a read-only remount, a file as root)
            return describe(seen)
        seen = seen.__cause__ or seen.__context__
    return None
