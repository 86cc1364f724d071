"""Options of `hpcbus gateway` (flags > environment > `[gateway]` table of `--config` > defaults)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from hpcbus.keys import MAX_FUTURE, PUBLISH_TIMEOUT, STATS_SECONDS, MaxFuture, PublishTimeout, StatsSeconds
from hpcbus.options import Section


class GatewaySettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`[gateway]` table of the `--config` file; the flags of the same name override it."""

    listen: str = "127.0.0.1:8086"
    """`HOST:PORT` the HTTP server listens on (8086 is InfluxDB's port, so clients need only the host
    changed; `[::]:8086` or `0.0.0.0:8086` for every interface)."""
    auth_file: str = ""
    """TOML file of per-cluster hashed secrets, each with its role (`[clusters."<name>"] secret =
    "pbkdf2-sha256$..."`, `role = "master"`; a node's own in `[clusters."<name>".credentials.<host>]`; hashes
    from `hpcbus gateway --hash-secret`; docs/gateway.md). With it, every request needs credentials of a
    cluster in the file, publishes for that cluster only and what its role allows; without it, requests are
    accepted for `--cluster` without credentials (InfluxDB's default), which a warning says at start."""
    http_cert: str = ""
    """TLS certificate (PEM, chain first) for HTTPS; "" = plain HTTP."""
    http_key: str = ""
    """TLS private key of `http_cert` ("" = the key is in the certificate file)."""
    max_body: Annotated[int, msgspec.Meta(ge=1024)] = 32 * 2**20
    """Bytes one request body may have, as received and after gzip decompression (InfluxDB 1.x's default
    limit is 25 MB); larger requests get 413 and publish nothing."""
    max_requests: Annotated[int, msgspec.Meta(ge=1)] = 32
    """Requests handled at once; more get 503 with `Retry-After` at once (clients back off instead of
    queueing on a slow bus)."""
    max_body_memory: Annotated[int, msgspec.Meta(ge=1024)] = 128 * 2**20
    """Bytes of request bodies (as inflated) all requests together may hold at once; a request whose body
    would pass it gets 503 with `Retry-After` and lets go of what it held (32 gzip bombs at once cannot
    take `max_requests` x `max_body`)."""
    max_checks: Annotated[int, msgspec.Meta(ge=1)] = 4
    """Secrets and Sonar tokens hashed at once (each costs tens of milliseconds of one core); a request
    whose credentials would need one more gets 503 at once. Credentials checked before, good or wrong, are
    answered from memory and never wait."""
    failed_checks: Annotated[int, msgspec.Meta(ge=0)] = 20
    """Failed credential checks (wrong secrets or tokens, each hashed) one peer address may cause before it
    must wait, then one more every `failed_check_seconds`; beyond that its unknown credentials get 503 at
    once, unhashed. An IPv6 address counts as its /64. 0 = no limit."""
    failed_check_seconds: Annotated[float, msgspec.Meta(gt=0)] = 3.0
    """Seconds in which a peer address regains one failed credential check (see `failed_checks`)."""
    max_requests_per_client: Annotated[int, msgspec.Meta(ge=0)] = 8
    """Of those, requests one client (peer address) may have at once; more get 503 (0 = `max_requests`).
    Behind a reverse proxy every request has the proxy's address: set 0 there and let the proxy limit."""
    max_requests_per_cluster: Annotated[int, msgspec.Meta(ge=0)] = 0
    """Of those, requests one cluster may have at once; more get 503 (0 = all of them on a gateway that
    serves one cluster, half on one that serves several, so stalled clients of one cluster cannot lock the
    others out)."""
    header_timeout: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    """Seconds a connection may take to send a request's head (line and headers), counted from its opening
    or the end of its previous answer; then it is closed (an idle keep-alive connection too)."""
    body_timeout: Annotated[float, msgspec.Meta(gt=0)] = 60.0
    """Seconds a request's whole body may take to arrive once its head has; then it is answered 408 and its
    place is freed (32 MiB at 10 Mbit/s takes 27 s)."""
    stall_timeout: Annotated[float, msgspec.Meta(gt=0)] = 5.0
    """Seconds without a byte of body after which a request loses its place to a new request that finds
    none free (the stalled one is answered 408): stalled clients cannot hold places that clients which
    send need, for all of `body_timeout`."""
    retry_after: Annotated[int, msgspec.Meta(ge=1)] = 2
    """Seconds a 503 asks the client to wait (`Retry-After`) while the gateway is busy or NATS is away."""
    publish_timeout: PublishTimeout = PUBLISH_TIMEOUT
    max_future: MaxFuture = MAX_FUTURE
    stats_seconds: StatsSeconds = STATS_SECONDS


GATEWAY = Section(
    "gateway",
    GatewaySettings,
    env={"listen": "HPCBUS_GATEWAY_LISTEN", "auth_file": "HPCBUS_GATEWAY_AUTH_FILE"},
    metavars={
        "listen": "HOST:PORT",
        "auth_file": "FILE",
        "http_cert": "FILE",
        "http_key": "FILE",
        "max_body": "BYTES",
        "max_requests": "N",
        "max_body_memory": "BYTES",
        "max_checks": "N",
        "failed_checks": "N",
        "failed_check_seconds": "S",
        "stall_timeout": "S",
        "max_requests_per_client": "N",
        "max_requests_per_cluster": "N",
        "header_timeout": "S",
        "body_timeout": "S",
        "retry_after": "S",
        "publish_timeout": "S",
        "max_future": "S",
        "stats_seconds": "S",
    },
)
