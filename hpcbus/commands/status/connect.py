"""A connection for one-shot commands (`status`, `tail`): one try per server with a short timeout, no
reconnecting, and a plain sentence instead of a traceback when no server answers.

Long-running processes use `hpcbus.bus.connect`, which waits for NATS forever; a command a person (or cron,
or Nagios) runs must answer instead."""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse

from nats.aio.client import Client as NATS

from hpcbus.retry import describe
from hpcbus.settings import BusSettings, SettingsError, nats_connect_options

SCHEMES = frozenset({"nats", "tls", "ws", "wss"})


class Unreachable(Exception):
    """No server of `--nats` could be reached: the message says which and why."""


def check_urls(urls: list[str]) -> None:
    """`SettingsError` (exit 2) for a URL nats-py would misread (`http//bad` taken as a host name, a port
    that is no port) before anything connects."""
    for url in urls:
        text = url if "://" in url else f"nats://{url}"
        parsed = urllib.parse.urlparse(text)
        try:
            port = parsed.port
        except ValueError:
            raise SettingsError(f"--nats {url!r}: the port is not a number from 1 to 65535") from None
        bad_port = port is not None and not 0 < port < 65536
        if parsed.scheme not in SCHEMES or not parsed.hostname or parsed.path not in ("", "/") or bad_port:
            raise SettingsError(f"--nats {url!r}: not a NATS URL (nats://HOST:PORT)")


async def connect_once(bus: BusSettings, name: str, timeout: float, *, reconnect: bool = False) -> NATS:
    """Connected, or `Unreachable` within about `timeout` seconds per server. `reconnect`: once connected,
    nats-py reconnects by itself after a loss (the live view lives on through a broker restart)."""
    check_urls(bus.nats)
    nc = NATS()

    causes: list[Exception] = []

    async def quiet(exc: Exception) -> None:  # failures are said below, once, in words
        causes.append(exc)

    try:  # nats-py reads max_reconnect_attempts=0 as "forever": 1 is one more try per server
        await asyncio.wait_for(
            nc.connect(
                name=name,
                connect_timeout=max(1, round(timeout)),
                allow_reconnect=reconnect,
                max_reconnect_attempts=-1 if reconnect else 1,
                reconnect_time_wait=0,
                error_cb=quiet,
                **nats_connect_options(bus),  # type: ignore[arg-type]
            ),
            2 * timeout * len(bus.nats) + 1,
        )
    except Exception as exc:
        with contextlib.suppress(Exception):
            await nc.close()
        cause = (
            causes[-1] if causes else exc
        )  # nats-py's NoServersError hides the why (refused, timeout, auth)
        detail = describe(cause) or type(cause).__name__
        if isinstance(cause, TimeoutError) and not str(cause):
            detail = f"no answer within {timeout:g} s"
        raise Unreachable(f"NATS at {', '.join(bus.nats)} not reachable: {detail}") from None
    return nc
