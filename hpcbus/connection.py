"""Connecting to NATS: for long-running processes, connect and reconnect forever (`connect`); for one-shot
commands, one try per server and a sentence when none answers (`connect_once`, `Unreachable`).

Every process must survive a broker restart. nats-py reconnects an established connection by itself (with
`max_reconnect_attempts=-1`), but a *first* connect that fails raises; `connect` retries that too. Each
connection event is one log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from nats.aio.client import Client as NATS

from hpcbus.bus import PERMISSIONS_VIOLATION
from hpcbus.retry import Trouble, describe
from hpcbus.settings import BusSettings, nats_connect_options

log = logging.getLogger("hpcbus.bus")


async def connect(settings: BusSettings, name: str, trouble: Trouble | None = None) -> NATS:
    """A connection that reconnects forever. With `max_reconnect_attempts=-1` nats-py also retries a first
    connect that fails (every `reconnect_time_wait`) instead of raising, so this returns once connected and
    waits as long as it takes (cancel it to give up). Connection trouble is one episode of `trouble`: a
    WARNING when the connection goes, summaries while it is away, one line when it is back."""
    trouble = trouble or Trouble(log, f"nats ({','.join(settings.nats)})")
    refused: set[str] = set()

    async def on_error(exc: Exception) -> None:
        text = str(exc)
        if PERMISSIONS_VIOLATION in text.lower():  # the connection stays up: not connection trouble
            if text not in refused and len(refused) < 100:
                refused.add(text)
                log.warning(
                    "%s: this identity may not do that (its permissions: hpcbus deploy nats-auth)", text
                )
            return
        trouble.failed(exc)

    async def on_disconnected() -> None:
        if not (nc.is_closed or nc.is_draining):  # a clean close is not news
            trouble.failed("disconnected")

    async def on_reconnected() -> None:
        trouble.ok()
        log.info("nats: reconnected to %s", nc.connected_url.netloc if nc.connected_url else "?")

    nc = NATS()
    await nc.connect(
        name=name,
        error_cb=on_error,
        disconnected_cb=on_disconnected,
        reconnected_cb=on_reconnected,
        max_reconnect_attempts=-1,
        reconnect_time_wait=1,
        connect_timeout=2,
        allow_reconnect=True,
        **nats_connect_options(settings),  # type: ignore[arg-type]
    )
    trouble.ok()
    log.info("nats: connected to %s as %s", nc.connected_url.netloc if nc.connected_url else "?", name)
    return nc


def check_urls(urls: list[str]) -> None:
    """Refuse a NATS URL nats-py would misread before connecting: `http//bad` (taken as host `http`), a port
    out of range (a traceback from deep inside nats-py), a scheme it cannot speak. `SettingsError` names the
    URL and the reason."""
    from urllib.parse import urlsplit

    from hpcbus.settings import SettingsError

    for url in urls:
        text = url if "://" in url else f"nats://{url}"  # nats-py reads `host:port` so too
        try:
            parts = urlsplit(text)
            port = parts.port
        except ValueError as exc:
            raise SettingsError(f"NATS URL {url!r}: {exc}") from None
        scheme = parts.scheme.lower()
        if scheme not in ("nats", "tls", "ws", "wss"):
            raise SettingsError(
                f"NATS URL {url!r}: scheme {scheme!r} is not nats://, tls://, ws:// or wss://"
            )
        if not parts.hostname or parts.path not in ("", "/") or (port is not None and port == 0):
            raise SettingsError(f"NATS URL {url!r}: expected nats://HOST[:PORT], e.g. nats://127.0.0.1:4222")


class Unreachable(ConnectionError):
    """No NATS server answered within a one-shot command's connect timeout."""


async def connect_once(
    settings: BusSettings, name: str, timeout: float = 5.0, *, reconnect: bool = False
) -> NATS:
    """A connection for a one-shot command (`pub`, `status`, `tail`): the URLs checked first, then one try
    per server with about `timeout` seconds each; `Unreachable` (with the servers and the last error, in
    words) instead of waiting forever as a long-running process does. `reconnect`: once connected, nats-py
    reconnects by itself after a loss (`status --watch` lives on through a broker restart)."""
    check_urls(settings.nats)
    errors: list[Exception] = []

    async def on_error(exc: Exception) -> None:  # said below, once, in words
        errors.append(exc)

    nc = NATS()
    try:  # nats-py reads max_reconnect_attempts=0 as "forever": 1 is one more try per server
        await asyncio.wait_for(
            nc.connect(
                name=name,
                error_cb=on_error,
                allow_reconnect=reconnect,
                max_reconnect_attempts=-1 if reconnect else 1,
                reconnect_time_wait=0,
                connect_timeout=max(1, round(timeout)),
                **nats_connect_options(settings),  # type: ignore[arg-type]
            ),
            2 * timeout * len(settings.nats) + 1,
        )
    except Exception as exc:  # nats-py raises its own errors, OSError or a timeout
        with contextlib.suppress(Exception):
            await nc.close()
        cause = (
            errors[-1] if errors else exc
        )  # nats-py's NoServersError hides the why (refused, timeout, auth)
        why = describe(cause) or type(cause).__name__
        if isinstance(cause, TimeoutError) and not str(cause):
            why = f"no answer within {timeout:g} s"
        raise Unreachable(f"NATS {', '.join(settings.nats)}: not reachable ({why})") from None
    return nc


async def close(nc: NATS, timeout: float = 1.0) -> None:
    """Drain when connected (finish what is in flight), else just close; bounded by `timeout` and quiet: a
    stop must be clean whatever state the connection is in (reconnecting, closed by the server, ...)."""
    if nc.is_closed:
        return
    if nc.is_connected:
        try:
            await asyncio.wait_for(nc.drain(), timeout)
            return
        except Exception as exc:
            log.debug("nats: drain failed (%s); closing", describe(exc))
    with contextlib.suppress(Exception):
        await asyncio.wait_for(nc.close(), timeout)
