"""Writing batches of line protocol to InfluxDB, with every outcome typed so the worker decides in one place.

- `Retryable`: 429, 5xx, timeouts, connection errors — keep the batch, back off (honouring Retry-After).
- `TooLarge`: 413 — the batch is too large for the server.
- `Partial`: InfluxDB 1.x answers 400 "partial write" when some points are bad: the good ones are stored;
  the bad ones are reported, not retried.
- `Rejected`: any other 4xx (auth, missing database, syntax of the whole batch) — retrying does not help
  (a missing database is created by `V1Writer` and answered `Retryable`).
What each means for a delivery is said in one table, `hpcbus.permanent.outcome`: `Retryable` transient (with
its Retry-After), `TooLarge` delivered message by message, `Rejected` and `Partial` permanent (dead-lettered).
"""

from __future__ import annotations

import gzip as gzip_module
import logging
import re
from typing import Protocol

import aiohttp

from hpcbus.influx.errors import Partial, Rejected, Retryable, TooLarge, WriteError
from hpcbus.influx.settings import InfluxSettings

log = logging.getLogger("hpcbus.influx")

__all__ = [
    "Partial",
    "Rejected",
    "Retryable",
    "TooLarge",
    "WriteError",
    "Writer",
    "classify",
    "make_writer",
    "prepare",
]


class Writer(Protocol):
    async def write(self, body: str, precision: str = "s") -> None:
        """`precision`: `s` (every metric and event line) or `ns` (log lines, see InfluxSink)."""
        ...

    async def close(self) -> None: ...


_DROPPED = re.compile(r"dropped=(\d+)")


def classify(status: int, text: str, retry_after: str | None) -> WriteError | None:
    """The typed outcome of one HTTP answer (None = success)."""
    if status < 300:
        return None
    message = f"HTTP {status}: {text.strip()[:300]}"
    if status == 429 or status >= 500:
        try:
            wait = float(retry_after) if retry_after else 0.0
        except ValueError:
            wait = 0.0
        return Retryable(message, status, wait)
    if status == 413:
        return TooLarge(message, status)
    if status == 400 and "partial write" in text:
        m = _DROPPED.search(text)
        return Partial(message, int(m.group(1)) if m else 0)
    return Rejected(message, status)


def make_writer(settings: InfluxSettings) -> V1Writer | V2Writer:
    return V1Writer(settings) if settings.api == "v1" else V2Writer(settings)


async def prepare(writer: V1Writer | V2Writer, meanwhile: str) -> None:
    """Create the database when missing; InfluxDB away is said (what happens `meanwhile`), not fatal: the
    writes retry."""
    try:
        await writer.ensure_database()
    except Retryable as exc:
        log.warning("InfluxDB not reachable yet (%s); %s", exc, meanwhile)


class V2Writer:
    """`/api/v2/write` through influxdb-client's async API (InfluxDB 2.x/3.x, 1.8+, VictoriaMetrics)."""

    def __init__(self, settings: InfluxSettings) -> None:
        from influxdb_client.client.influxdb_client_async import InfluxDBClientAsync

        self.settings = settings
        self._client = InfluxDBClientAsync(
            url=settings.url,
            token=settings.token or "none",
            org=settings.org or "-",
            timeout=int(settings.timeout * 1000),
            enable_gzip=settings.gzip,
        )
        self._api = self._client.write_api()

    async def write(self, body: str, precision: str = "s") -> None:
        from influxdb_client import WritePrecision
        from influxdb_client.rest import ApiException

        unit = WritePrecision.NS if precision == "ns" else WritePrecision.S
        try:
            await self._api.write(bucket=self.settings.bucket, record=body, write_precision=unit)  # type: ignore[arg-type]
        except ApiException as exc:
            body_text = (
                exc.body.decode(errors="replace") if isinstance(exc.body, bytes) else str(exc.body or "")
            )
            headers: dict[str, str] = dict(exc.headers or {})
            error = classify(int(exc.status or 0), body_text or str(exc.reason), headers.get("Retry-After"))
            raise error or Rejected(str(exc)) from None
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Retryable(f"{type(exc).__name__}: {exc}".rstrip(": ")) from None

    async def ensure_database(self) -> None:
        """Buckets are the operator's business in v2."""

    async def close(self) -> None:
        await self._client.close()


class V1Writer:
    """`/write?db=&rp=&precision=s` with basic auth, gzip — InfluxDB 1.x (1.6 has no /api/v2/write).

    aiohttp directly: 1.x's "partial write" answers and 413s need the raw status and body.
    """

    def __init__(self, settings: InfluxSettings) -> None:
        self.settings = settings
        base = settings.url.rstrip("/")
        self.url = f"{base}/write"
        self.params = {"db": settings.db, "precision": "s"}
        if settings.rp:
            self.params["rp"] = settings.rp
        auth = aiohttp.BasicAuth(settings.username, settings.password) if settings.username else None
        self.headers: dict[str, str] = {"Content-Type": "text/plain; charset=utf-8"}
        if settings.gzip:
            self.headers["Content-Encoding"] = "gzip"
        self._session = aiohttp.ClientSession(
            auth=auth, timeout=aiohttp.ClientTimeout(total=settings.timeout), raise_for_status=False
        )

    async def write(self, body: str, precision: str = "s") -> None:
        data = body.encode()
        if self.settings.gzip:
            data = gzip_module.compress(data, compresslevel=1)
        params = self.params if precision == "s" else {**self.params, "precision": precision}
        try:
            async with self._session.post(self.url, params=params, data=data, headers=self.headers) as resp:
                text = await resp.text()
                error = classify(resp.status, text, resp.headers.get("Retry-After"))
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Retryable(f"{type(exc).__name__}: {exc}".rstrip(": ")) from None
        if error is not None:
            if error.status == 404 and "database not found" in str(error):
                await self.ensure_database()  # e.g. a fresh InfluxDB came up empty
                raise Retryable(f"{error}; database created")
            raise error

    async def ensure_database(self) -> None:
        """`CREATE DATABASE` is idempotent."""
        base = self.settings.url.rstrip("/")
        try:
            async with self._session.post(
                f"{base}/query", params={"q": f'CREATE DATABASE "{self.settings.db}"'}
            ) as r:
                text = await r.text()
                if r.status >= 300:
                    raise classify(r.status, text, r.headers.get("Retry-After")) or Rejected(text)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise Retryable(f"{type(exc).__name__}: {exc}".rstrip(": ")) from None

    async def close(self) -> None:
        await self._session.close()
