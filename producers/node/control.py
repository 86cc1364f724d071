"""Control requests to a node agent: ClusterCockpit control lines in, a control line back (request/reply).

Request (on `<cluster>.control.get` or `.put`, sent with NATS request/reply so the asker gets the answer):

    config,hostname=<host>,method=GET,type=node,type-id=0 control="interval"        one setting
    config,hostname=<host>,method=GET,type=node,type-id=0 control=""                everything
    config,hostname=<host>,method=PUT,type=node,type-id=0 control="interval=60"     change a setting

Reply, one line per request line addressed to this host, in the same order:

    config,cluster=<c>,hostname=<host>,method=GET,status=ok,type=node,type-id=0 control="<JSON>" <now>
    config,...,method=PUT,status=error,... control="{\"error\": \"interval: ...\"}" <now>

Why these choices: the ClusterCockpit spec names the control class in the measurement (`config` is one of
its classes) and the verb in the `method` tag, and says nothing about replies. Answering with a control
line of the same class keeps the reply valid line protocol (`hpcbus validate` accepts it, the same parser
reads it) while the JSON in the `control` field carries structured values. `status=ok|error` is a tag so a
client can branch without decoding the JSON.

Every agent of the cluster receives every request and answers only lines whose `hostname` is its own, so
the first reply to a request is the addressed node's (nodes that are not addressed stay silent). A PUT that
cannot be applied (unknown key, not a number, out of range, a PUT on the get subject) changes nothing and
gets `status=error` with the reason. A payload that is not line protocol names no host, so nobody answers
it; the requester's timeout says so.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import msgspec

from hpcbus.schemas.lineprotocol import Line, format_lines, parse_payload

__all__ = ["CONTROL_CLASS", "Control", "Setting"]

CONTROL_CLASS = "config"
"""The measurement of control lines this agent answers (a ClusterCockpit control class)."""


class Setting:
    """A value that can be changed at run time: `parse` turns the text into a value or raises ValueError with
    the reason; `apply` takes the parsed value."""

    def __init__(self, parse: Callable[[str], Any], apply: Callable[[Any], None]):
        self.parse = parse
        self.apply = apply


def float_in(lo: float, hi: float) -> Callable[[str], float]:
    """A parser for a number of seconds between `lo` and `hi` (inclusive)."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise ValueError(f"not a number: {text!r}") from None
        if not math.isfinite(v) or not lo <= v <= hi:
            raise ValueError(f"must be between {lo:g} and {hi:g} seconds, got {text}")
        return v

    return parse


class Control:
    """Answers control requests for one host. `snapshot()` returns the configuration and state as a
    JSON-able dict (GET); `settings` are what PUT may change."""

    def __init__(
        self,
        cluster: str,
        hostname: str,
        snapshot: Callable[[], dict[str, Any]],
        settings: dict[str, Setting],
    ):
        self.cluster = cluster
        self.hostname = hostname
        self.snapshot = snapshot
        self.settings = settings
        self.requests = 0
        """Request lines addressed to this host, answered so far."""

    def handle(self, payload: bytes, subject_method: str = "", now: float | None = None) -> bytes | None:
        """The reply payload for a request payload, or None when no line is addressed to this host.
        `subject_method` (`get`/`put`, from the subject) must agree with each line's `method` tag."""
        ts = math.floor(time.time() if now is None else now)
        replies: list[Line] = []
        for line in parse_payload(payload, now=ts).lines:
            if line.kind != "control" or line.tags.get("hostname") != self.hostname:
                continue
            self.requests += 1
            method = line.tags.get("method", "")
            try:
                if subject_method and method.lower() != subject_method.lower():
                    raise ValueError(f"method {method} sent on the control.{subject_method} subject")
                if line.measurement != CONTROL_CLASS:
                    raise ValueError(
                        f"unsupported control class {line.measurement!r} (only {CONTROL_CLASS!r})"
                    )
                body = self._get(str(line.payload)) if method == "GET" else self._put(str(line.payload))
                status = "ok"
            except ValueError as exc:
                body, status = {"error": str(exc)}, "error"
            tags = {
                "cluster": self.cluster,
                "hostname": self.hostname,
                "method": method or "GET",
                "status": status,
                "type": "node",
                "type-id": "0",
            }
            replies.append(Line(line.measurement, tags, {"control": msgspec.json.encode(body).decode()}, ts))
        return format_lines(replies).encode() if replies else None

    def _get(self, what: str) -> dict[str, Any]:
        config = self.snapshot()
        key = what.strip()
        if key in ("", "*"):
            return config
        if key not in config:
            raise ValueError(f"unknown setting {key!r} (known: {', '.join(sorted(config))})")
        return {key: config[key]}

    def _put(self, what: str) -> dict[str, Any]:
        key, sep, text = what.partition("=")
        key, text = key.strip(), text.strip()
        if not sep or not key:
            raise ValueError(f"expected <setting>=<value>, got {what!r}")
        setting = self.settings.get(key)
        if setting is None:
            raise ValueError(f"{key!r} cannot be changed (changeable: {', '.join(sorted(self.settings))})")
        try:
            value = setting.parse(text)
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from None
        setting.apply(value)
        return {key: value}
