"""InfluxQL over HTTP: the report's only way to InfluxDB, with every failure turned into one sentence.

The report reads with InfluxDB 1.x's `/query` (InfluxQL), which InfluxDB 2.x and 3.x also answer (their v1
compatibility endpoint, token in the `Authorization` header, the bucket as `db`): one query language for
every server `consume influx` writes to. Reading needs no client library beyond aiohttp, which the writer
already uses. Tag values and regular expressions that come from the user are quoted here, nowhere else.
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import msgspec

from hpcbus.influx.settings import InfluxSettings


class QueryError(Exception):
    """InfluxDB could not be asked, or refused the question: the message says which and why."""


class Series(msgspec.Struct):
    """One series of an answer: its measurement, GROUP BY tags, columns and rows."""

    name: str = ""
    tags: dict[str, str] = msgspec.field(default_factory=dict)
    columns: list[str] = msgspec.field(default_factory=list)
    values: list[list[Any]] = msgspec.field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        """Each row as column -> value."""
        return [dict(zip(self.columns, v, strict=False)) for v in self.values]


class _Result(msgspec.Struct):
    series: list[Series] = msgspec.field(default_factory=list)
    error: str = ""


class _Answer(msgspec.Struct):
    results: list[_Result] = msgspec.field(default_factory=list)
    error: str = ""


def literal(text: str) -> str:
    """An InfluxQL string literal: `'it''s'` is not InfluxQL, `'it\\'s'` is."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def ident(name: str) -> str:
    """An InfluxQL identifier in double quotes (measurement, tag and field names)."""
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def regex(pattern: str) -> str:
    """An InfluxQL regular expression literal: `/.../` with the slashes inside escaped."""
    return "/" + pattern.replace("/", "\\/") + "/"


def exact(text: str) -> str:
    """`text` matched literally inside a regular expression."""
    return re.escape(text)


class Influx:
    """A read-only InfluxQL client for one database; `await close()` when done."""

    def __init__(self, settings: InfluxSettings) -> None:
        self.settings = settings
        self.db = settings.db if settings.api == "v1" else settings.bucket
        headers = {"Authorization": f"Token {settings.token}"} if settings.token else {}
        auth = aiohttp.BasicAuth(settings.username, settings.password) if settings.username else None
        self._session = aiohttp.ClientSession(
            auth=auth, headers=headers, timeout=aiohttp.ClientTimeout(total=max(settings.timeout, 30.0))
        )
        self.queries = 0
        """Statements sent so far (for the progress line and tests)."""

    async def close(self) -> None:
        await self._session.close()

    async def query(self, statement: str) -> list[Series]:
        """The series of one statement (epoch seconds for time); [] when it matched nothing."""
        url = self.settings.url.rstrip("/") + "/query"
        form = {"db": self.db, "q": statement, "epoch": "s"}
        if self.settings.rp:
            form["rp"] = self.settings.rp
        self.queries += 1
        try:
            async with self._session.post(url, data=form) as response:
                body = await response.read()
                status = response.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            reason = str(exc) or type(exc).__name__
            raise QueryError(f"InfluxDB at {self.settings.url} is not reachable: {reason}") from None
        try:
            answer = msgspec.json.decode(body, type=_Answer)
        except msgspec.DecodeError:
            text = body.decode(errors="replace").strip()[:200]
            raise QueryError(f"InfluxDB at {self.settings.url} answered HTTP {status}: {text}") from None
        errors = [answer.error] + [r.error for r in answer.results]
        error = next((e for e in errors if e), "")
        if error or status >= 300:
            raise QueryError(f"InfluxDB at {self.settings.url} (db {self.db!r}): {error or f'HTTP {status}'}")
        return [s for r in answer.results for s in r.series]
