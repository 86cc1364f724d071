"""Retrying, stopping and reporting trouble: the three things every hpcbus loop does the same way.

- `Stopping` is the stop event of a process with the deadline that came with it: SIGTERM sets it, and from
  then on every loop has `grace` seconds to finish what it holds. Every wait of every loop is bounded by it,
  which is how a process exits within 5 s of SIGTERM in any state.
- `Trouble` is one condition that stops the flow (NATS away, a stream unavailable, InfluxDB refusing, a
  publish failing): one WARNING when it starts (and one per new cause), a summary while it lasts, one line
  when it ends. Retrying every second must not write a log line every second, nor hide that it is happening.
- `retry` calls an operation until it works, backing off from `base` to `cap` seconds, honouring a server's
  wait hint (Retry-After), reporting through a `Trouble`, and giving up with `Stopped` once the stop deadline
  leaves no time for another try: the caller then keeps its input (unacked, queued, spilled).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class Stopped(Exception):
    """The process is stopping and the deadline came before the operation worked."""


class Stopping(asyncio.Event):
    """The process-wide stop event; setting it starts the `grace` seconds everything has left."""

    def __init__(self, grace: float = 3.5) -> None:
        super().__init__()
        self.grace = grace
        self.deadline = math.inf
        """`time.monotonic()` by which every loop must have returned (inf until set)."""

    def set(self) -> None:
        if not self.is_set():
            self.deadline = time.monotonic() + self.grace
        super().set()

    def remaining(self) -> float:
        """Seconds left before the deadline (inf while not stopping)."""
        return self.deadline - time.monotonic()

    async def sleep(self, seconds: float) -> bool:
        """Sleep `seconds`, or less when stopping starts meanwhile; True when stopping."""
        if not self.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wait(), max(0.0, seconds))
        return self.is_set()


def describe(cause: BaseException | str) -> str:
    """`TypeName: message` (or the text itself): one stable string per cause, so it is reported once."""
    if isinstance(cause, str):
        return cause
    text = str(cause)
    if getattr(cause, "worded", False):  # says its cause itself (`hpcbus.permanent.Outcome`)
        return text
    return f"{type(cause).__name__}: {text}" if text else type(cause).__name__


class Trouble:
    """A condition that stops the flow, reported as an episode: start, summaries, end.

    `failed(cause)` on every failed attempt, `ok()` on every success. The log shows one WARNING when an
    episode starts, one more per new cause, a summary every `summary_seconds` while it lasts, and one INFO
    line with its length when it ends.
    """

    def __init__(self, log: logging.Logger, what: str, *, summary_seconds: float = 60.0) -> None:
        self.log = log
        self.what = what
        self.summary_seconds = summary_seconds
        self.since: float | None = None
        """`time.monotonic()` the episode began (None: all is well)."""
        self.cause = ""
        self.failures = 0
        """Failed attempts in this episode."""
        self.episodes = 0
        """Episodes since start (a counter for self-telemetry)."""
        self._causes: set[str] = set()
        self._summarised = 0.0

    @property
    def active(self) -> bool:
        return self.since is not None

    def failed(self, cause: BaseException | str) -> None:
        text = describe(cause)
        now = time.monotonic()
        self.failures += 1
        self.cause = text
        if self.since is None:
            self.since = self._summarised = now
            self.episodes += 1
            self._causes = {text}
            self.log.warning("%s: %s; retrying", self.what, text)
        elif text not in self._causes:
            if len(self._causes) < 100:
                self._causes.add(text)
            self.log.warning("%s: %s; still retrying", self.what, text)
        elif now - self._summarised >= self.summary_seconds:
            self._summarised = now
            self.log.warning(
                "%s: still failing after %.0f s (%d attempts): %s",
                self.what,
                now - self.since,
                self.failures,
                text,
            )

    def ok(self) -> None:
        if self.since is None:
            return
        self.log.info(
            "%s: working again after %.1f s (%d failed attempts)",
            self.what,
            time.monotonic() - self.since,
            self.failures,
        )
        self.since = None
        self.failures = 0
        self.cause = ""


async def retry(
    op: Callable[[], Awaitable[T]],
    *,
    trouble: Trouble,
    stopping: Stopping | None = None,
    base: float = 0.5,
    cap: float = 5.0,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = Exception,
    wait_hint: Callable[[BaseException], float] | None = None,
    on_retry: Callable[[], Awaitable[None]] | None = None,
) -> T:
    """`await op()` until it returns; between failures wait `base`, doubling up to `cap` (or longer when
    `wait_hint(exc)` says so). While stopping, an attempt is bounded by the deadline and no new one starts
    after it: then `Stopped` (also when `op` raises it). Exceptions outside `retry_on` propagate at once."""
    delay = base
    while True:
        failure: BaseException
        left = stopping.remaining() if stopping is not None else math.inf
        if left <= 0:
            raise Stopped(trouble.cause or "the stop deadline passed")
        try:
            result = await (op() if left == math.inf else asyncio.wait_for(op(), left))
        except Stopped:
            raise  # the operation saw the stop itself: never retried
        except TimeoutError as exc:
            if stopping is not None and stopping.remaining() <= 0:
                raise Stopped(trouble.cause or "the stop deadline passed") from None
            if not isinstance(exc, retry_on):
                raise
            failure = exc
        except retry_on as exc:
            failure = exc
        else:
            trouble.ok()
            return result
        trouble.failed(failure)
        pause = delay
        if wait_hint is not None:
            pause = max(pause, wait_hint(failure))
        if stopping is not None and stopping.is_set() and stopping.remaining() <= pause:
            raise Stopped(trouble.cause)
        if on_retry is not None:
            await on_retry()
        if stopping is not None:
            await stopping.sleep(pause)
        else:
            await asyncio.sleep(pause)
        delay = min(delay * 2, cap)
