"""What a delivery's failure means, decided in one table (`outcome`): retry it, split it, or give it up.

Retrying forever is right for a service that is down and wrong for a message that can never be delivered (a
file name too long, a permission refused, a value the sink can never store, a subject no stream captures):
one such message would halt the worker for good. A sink's `deliver` (and `tick`, `close`) returns normally
or raises; `hpcbus.runner` hands whatever it raised to `outcome`, the one place that says which of four it is:

- `Transient` (a service down, a full disk, a timeout, anything not known to be permanent): the runner
  retries through `hpcbus.retry.retry`, honouring `retry_after` (a server's Retry-After), counts `retried`
  and keeps the messages alive (`+WPI`).
- `TooLarge` (InfluxDB's 413): the runner delivers the batch's messages one by one; one alone too large is
  permanent.
- `Permanent` (`msgs` None: the batch as a whole; the runner delivers each message alone to find the
  culprits) and `Partial` (a `Permanent` naming the messages that failed, each with its reason and problems:
  the rest is delivered): what fails alone is dead-lettered with the reason and acknowledged
  (`hpcbus_undeliverable_messages`, one WARNING per episode), so everything behind it flows.

The table (`outcome`): OSError numbers in `PERMANENT_ERRNOS` (under a tree root that can still be written, see
`outcome`'s `root`), InfluxDB's answers (`hpcbus.influx.errors`: `Retryable` transient with its Retry-After,
`TooLarge`, `Rejected` permanent, `Partial` permanent: InfluxDB stored the rest of the write and
refuses these points on every retry, e.g. `max-values-per-tag limit exceeded`), and the publish refusals no retry cures (`PUBLISH_REFUSALS`: no stream
for the subject, a permissions violation), faults of the code on one message (`FAULTS`: permanent, so one
message that trips a bug is dead-lettered instead of retried for ever); everything else is transient.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg

from hpcbus.bus import PERMISSIONS_VIOLATION
from hpcbus.influx import errors
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


PUBLISH_REFUSALS = (nats.js.errors.NoStreamResponseError,)
"""nats-py's answers to a publish that no retry cures: no stream captures the subject. (A permissions
violation reaches the client as `nats.errors.Error` naming it: `outcome` reads its text.)"""


FAULTS = (TypeError, ValueError, LookupError, AttributeError, ArithmeticError, RecursionError, AssertionError)
"""Exceptions of code meeting data it does not handle (a bug, or input no check caught): the same message
fails the same way on every retry, so retrying it for ever would halt the worker on one message. Permanent:
the runner delivers the batch's messages one by one and dead-letters the one that fails (`hpcbus deadletter
replay` once the fix is installed). `OSError`, nats-py's and InfluxDB's errors are classified before this."""


class Outcome(Exception):
    """What a sink raises from `deliver`, `tick` or `close` when it did not deliver: one of the four below."""

    worded = True
    """`reason` names its cause already (`hpcbus.retry.describe` says it as it is)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class Transient(Outcome):
    """Not now: the runner retries (after at least `retry_after` seconds, a server's wait hint)."""

    def __init__(self, reason: str, retry_after: float = 0.0) -> None:
        super().__init__(reason)
        self.retry_after = retry_after


class TooLarge(Outcome):
    """The far end refuses the batch for its size: the runner delivers its messages one by one."""


class Permanent(Outcome):
    """An error no retry can cure.

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
        self.msgs = msgs
        self.reasons = reasons or {}
        self.problems = problems or {}


class Partial(Permanent):
    """Part of the batch was delivered and the named messages (`msgs`) never can be, each with its reason
    and problems: the runner dead-letters those and acknowledges the rest."""

    def __init__(
        self,
        reason: str,
        msgs: list[Msg],
        *,
        reasons: dict[int, str] | None = None,
        problems: dict[int, list[Problem]] | None = None,
    ) -> None:
        super().__init__(reason, msgs, reasons=reasons, problems=problems)


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


def outcome(exc: BaseException, root: Path | None = None) -> Outcome:
    """What `exc` (or an exception it was raised from) means: the one table (see the module docstring).

    `root`: the tree the failed item lives in. An `OSError` of `PERMANENT_ERRNOS` (a permission refused,
    ENOTDIR, ...) is the item's own only when `root` can still be written; otherwise the whole tree is
    refused (a read-only remount, a root owned by someone else or replaced by a file) and every message would
    fail alike: transient, retried (the worker stalls, one WARNING per episode) instead of dead-lettering the
    whole flow. Without `root` such an error is permanent."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            break
        if isinstance(seen, Outcome):
            return seen
        if isinstance(seen, OSError) and seen.errno in PERMANENT_ERRNOS:
            if root is not None and not writable(root):
                return Transient(describe(seen))  # the whole tree refuses: not this item's own
            return Permanent(describe(seen))
        if isinstance(seen, errors.Retryable):
            return Transient(describe(seen), seen.retry_after)
        if isinstance(seen, errors.TooLarge):
            return TooLarge(describe(seen))
        if isinstance(seen, errors.Rejected):
            return Permanent(f"InfluxDB refused the batch: {seen}")
        if isinstance(seen, errors.Partial):  # stored the rest, refused these for good (a limit, a type)
            return Permanent(f"InfluxDB refused points: {seen}")
        if isinstance(seen, PUBLISH_REFUSALS):
            return Permanent(f"no stream captures the subject ({describe(seen)})")
        if isinstance(seen, nats.errors.Error) and PERMISSIONS_VIOLATION in str(seen).lower():
            return Permanent(describe(seen))
        seen = seen.__cause__ or seen.__context__
    if isinstance(exc, FAULTS):
        return Permanent(f"a fault in hpcbus on this message ({describe(exc)}); please report it")
    return Transient(describe(exc))


def permanent(exc: BaseException, root: Path | None = None) -> str | None:
    """The reason why `exc` can never succeed on retry (`outcome` says `Permanent`), None when retrying may
    help."""
    found = outcome(exc, root)
    return found.reason if isinstance(found, Permanent) else None
