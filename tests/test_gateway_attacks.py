"""`hpcbus gateway` against hostile and broken clients (issue 20): malformed credentials, malformed requests,
clients that go away or stall, a stream that is full, and the stream options. Real gateway processes and a
real nats-server; each wait is on state (an answer, a closed socket, the gateway's /health, its log).
Time-bounded checks under load are in tests/faults/test_gateway_attacks.py."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import re
import socket
import time
from pathlib import Path

import nats
import pytest
from nats.js.api import DiscardPolicy
from nats.js.errors import NotFoundError

from hpcbus.streams import stream_name
from tests.consumer_helpers import Process, wait_for
from tests.services import NatsServer
from tests.test_gateway import auth_file, basic, http, start_gateway

pytestmark = pytest.mark.services

SECRET = "s3cret-token"


def line(value: int = 1) -> bytes:
    return f"gw_attack,hostname=n1,type=node,type-id=0 value={value} {int(time.time())}\n".encode()


def raw(url: str, data: bytes, *, source: str = "") -> socket.socket:
    """A connection to the gateway that has sent `data` and nothing more (the test decides what follows)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    s = socket.create_connection(
        (host, int(port)), timeout=30, source_address=(source, 0) if source else None
    )
    s.sendall(data)
    return s


def answer_of(s: socket.socket) -> bytes:
    """Everything the gateway sends until it closes the connection."""
    out = b""
    while chunk := s.recv(65536):
        out += chunk
    s.close()
    return out


def head(path: str, cluster: str, length: int, *extra: str) -> bytes:
    token = base64.b64encode(f"{cluster}:{SECRET}".encode()).decode()
    lines = [
        f"POST {path} HTTP/1.1",
        "Host: gateway",
        f"Authorization: Basic {token}",
        f"Content-Length: {length}",
        *extra,
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def health(url: str, headers: dict[str, str] | None = None) -> dict[str, object]:
    """What `/health` says (in full only to a cluster's credentials, or without an auth file)."""
    return dict(http(url + "/health", method="GET", headers=headers).json())


def warnings_and_errors(log: str) -> list[str]:
    return [x for x in log.splitlines() if " WARNING " in x or " ERROR " in x]


# --- credentials -------------------------------------------------------------------------------------------


def test_malformed_credentials_are_401_without_traceback(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    """A Token or Basic value that is not UTF-8 or not base64, on v1, v2 and Sonar: 401 like wrong
    credentials (was 500 with an ERROR traceback, before any credential was checked); good credentials
    still pass."""
    w, url = start_gateway(
        workers, tmp_path, nats_server.url, "--auth-file", str(auth_file(tmp_path, {cluster: SECRET}))
    )
    bad: list[dict[str, str]] = [
        {"Authorization": f"Token {cluster}:\xff\xfe"},  # http.client sends latin-1: bytes ff fe
        {"Authorization": "Token \xc3\x28"},
        {"Authorization": "Basic !!!not-base64"},
        {"Authorization": "Basic " + base64.b64encode(b"\xff\xfe:\xfa").decode()},
        {"Authorization": "Basic"},
        {"Authorization": "Token"},
    ]
    paths = ["/write?db=x&precision=s", "/api/v2/write?bucket=x&precision=s", "/sonar/sample"]
    for path in paths:
        for headers in bad:
            answer = http(url + path, line(), headers=headers)
            assert answer.status == 401, (path, headers, answer.status, answer.body)
        assert http(url + f"{path}&u=%FF%FE&p=%FF" if "?" in path else url + path, line()).status == 401
    assert http(url + paths[0], line(), headers=basic(cluster, SECRET)).status == 204
    assert http(url + paths[1], line(2), headers={"Authorization": f"Token {cluster}:{SECRET}"}).status == 204
    assert "Traceback" not in w.log() and " ERROR " not in w.log(), w.log()[-3000:]


def test_failed_logins_are_summarised_not_logged_one_by_one(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    """200 wrong passwords in a row: one WARNING for the first, the rest counted in one summary line (was 200
    WARNINGs); the stop summary counts them all. (Without the per-address limit on failed checks, which
    would answer most of them 503 unhashed.)"""
    w, url = start_gateway(
        workers,
        tmp_path,
        nats_server.url,
        "--auth-file",
        str(auth_file(tmp_path, {cluster: SECRET})),
        "--failed-checks",
        "0",
    )
    for i in range(200):
        answer = http(url + "/write?db=x", line(), headers=basic(cluster, f"wrong{i}"))
        assert answer.status in (401, 503), answer.body  # 503: checks of other secrets under way
    assert w.terminate() == 0
    refused = [x for x in warnings_and_errors(w.log()) if "401" in x]
    assert len(refused) == 2 and "199 more in the last" in refused[1], refused  # the first, then the count
    assert re.search(r"\b200 unauthorized\b", w.log()), w.log()[-2000:]


def test_health_says_only_pass_or_fail_without_credentials(
    nats_server: NatsServer, tmp_path: Path, workers: list[Process]
) -> None:
    """`GET /health` without credentials (or with wrong ones) says pass or fail and nothing more: no cluster
    name, the user names of the auth file (was: every cluster listed). With a cluster's credentials it says
    more, and names that cluster only."""
    a, b = "ha.example.org", "hb.example.org"
    _, url = start_gateway(
        workers, tmp_path, nats_server.url, "--auth-file", str(auth_file(tmp_path, {a: SECRET, b: SECRET}))
    )
    for headers in ({}, basic(a, "wrong"), basic("nobody", SECRET)):
        answer = http(url + "/health", method="GET", headers=headers)
        assert answer.status == 200 and answer.json() == {"status": "pass"}, (headers, answer.body)
    told = health(url, basic(a, SECRET))
    assert told["status"] == "pass" and told["in_flight"] == 0 and told["clusters"] == [a], told
    assert b not in json.dumps(told)


def test_partial_writes_are_one_episode_in_the_log(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    """200 requests with a good and a bad line each: each answered 400 `partial write` naming the line, the
    good lines stored, and the log has one WARNING for the first and one summary line for the rest, the
    stop summary counting all 200 (was: a line per request, 1,000 lines in 6 s)."""
    w, url = start_gateway(workers, tmp_path, nats_server.url, "--cluster", cluster)
    for i in range(200):
        answer = http(url + "/write?db=x&precision=s", line(i) + b"broken line\n")
        assert answer.status == 400 and "partial write" in answer.json()["error"], answer.body
    assert w.terminate() == 0
    told = [x for x in w.log().splitlines() if "1 of 2 lines refused" in x]
    assert len(told) == 2 and " WARNING " in told[0] and "199 more in the last" in told[1], told
    assert "200 requests with refused lines or envelopes" in w.log(), w.log()[-2000:]


def test_a_header_too_long_is_neither_quoted_in_the_answer_nor_logged(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    """An `Authorization` header over 8,190 bytes: 400 with a fixed text; neither the answer nor the log
    holds any of the header (was: its first 100 bytes in both, the base64 of `cluster:secret`)."""
    w, url = start_gateway(
        workers, tmp_path, nats_server.url, "--auth-file", str(auth_file(tmp_path, {cluster: SECRET}))
    )
    secret = SECRET + "x" * 9000
    token = base64.b64encode(f"{cluster}:{secret}".encode()).decode()
    s = raw(url, f"POST /write?db=x HTTP/1.1\r\nHost: g\r\nAuthorization: Basic {token}\r\n\r\n".encode())
    answer = answer_of(s)
    assert answer.split(b" ")[1] == b"400" and b"too long" in answer, answer
    assert http(url + "/write?db=x&precision=s", line(), headers=basic(cluster, SECRET)).status == 204
    assert w.terminate() == 0
    for where, text in (("answer", answer.decode(errors="replace")), ("log", w.log())):
        assert token[:16] not in text and SECRET not in text and "Basic" not in text, (where, text[-2000:])
    assert "malformed HTTP request refused" in w.log(), w.log()[-2000:]


# --- malformed requests and clients that go away -----------------------------------------------------------


def test_malformed_requests_and_clients_gone_mid_body_log_no_tracebacks(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    """20 requests aiohttp cannot parse and 20 clients that close mid-body: each malformed one gets its
    400, and the log has at most one line for each kind (was an ERROR with a traceback per request)."""
    w, url = start_gateway(workers, tmp_path, nats_server.url, "--cluster", cluster)
    for _ in range(20):
        s = raw(url, b"POST /write?db=x HTTP/1.1\r\nHost: g\r\nContent-Length: abc\r\n\r\n")
        assert answer_of(s).split(b" ")[1] == b"400", "a 400 for a malformed head"
    for _ in range(20):
        s = raw(url, head("/write?db=x&precision=s", cluster, 100_000) + line() * 10)
        wait_for(lambda: health(url)["in_flight"] == 1, 20, "the body being read")
        s.close()
        wait_for(lambda: health(url)["in_flight"] == 0, 20, "the request given up")
    assert http(url + "/write?db=x&precision=s", line()).status == 204
    assert w.terminate() == 0
    log = w.log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]
    for what in ("malformed HTTP request refused", "client gone before its answer"):
        lines = [x for x in log.splitlines() if what in x]  # the first, then the count of the rest
        assert len(lines) == 2 and "19 more in the last" in lines[1], lines
    assert "20 clients gone mid-body" in log and "20 malformed requests" in log, log[-2000:]


# --- timeouts and shares of the request slots ---------------------------------------------------------------


def test_header_and_body_timeouts(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    """A head that never ends is closed after `header_timeout`; a body that stalls is answered 408 after
    `body_timeout` and its slot is free again (was: kept forever)."""
    _, url = start_gateway(
        workers,
        tmp_path,
        nats_server.url,
        "--cluster",
        cluster,
        "--header-timeout",
        "1",
        "--body-timeout",
        "1",
    )
    started = time.monotonic()
    slow_head = raw(url, b"POST /write?db=x HTTP/1.1\r\nHost: g\r\n")
    assert answer_of(slow_head) == b"" and time.monotonic() - started < 15
    slow_body = raw(url, head("/write?db=x&precision=s", cluster, 100_000) + line())
    assert answer_of_first(slow_body).startswith(b"HTTP/1.1 408"), "408 for a body that stalls"
    assert health(url)["in_flight"] == 0
    assert http(url + "/write?db=x&precision=s", line()).status == 204


def test_one_client_or_cluster_cannot_take_every_slot(
    nats_server: NatsServer, tmp_path: Path, workers: list[Process]
) -> None:
    """`max_requests` 6, 2 per client: a client with 2 stalled bodies gets 503 for a third, naming its
    share, while other clients are served; with two clusters, one cluster gets at most half."""
    a, b = "fa.example.org", "fb.example.org"
    _, url = start_gateway(
        workers,
        tmp_path,
        nats_server.url,
        "--auth-file",
        str(auth_file(tmp_path, {a: SECRET, b: SECRET})),
        "--max-requests",
        "6",
        "--max-requests-per-client",
        "2",
    )
    stalled = [raw(url, head("/write?db=x&precision=s", a, 100_000) + line()) for _ in range(2)]
    wait_for(lambda: health(url, basic(b, SECRET))["in_flight"] == 2, 20, "two stalled bodies")
    third = http(url + "/write?db=x&precision=s", line(), headers=basic(a, SECRET))
    assert third.status == 503 and "share" in third.json()["error"], third.body
    assert third.headers["Retry-After"] == "2"
    stalled.append(raw(url, head("/write?db=x&precision=s", a, 100_000) + line(), source="127.0.0.2"))
    wait_for(lambda: health(url, basic(b, SECRET))["in_flight"] == 3, 20, "a third stalled body elsewhere")
    over = raw(url, head("/write?db=x&precision=s", a, 100_000) + line(), source="127.0.0.3")
    assert b"cluster fa.example.org" in answer_of_first(over), "cluster a at its share (half of 6)"
    for source in ("127.0.0.3", "127.0.0.4"):
        s = raw(url, head("/write?db=x&precision=s", b, len(line())) + line(), source=source)
        assert answer_of_first(s).startswith(b"HTTP/1.1 204"), f"cluster b from {source} served"
    for s in stalled:
        s.close()


def answer_of_first(s: socket.socket) -> bytes:
    """The first answer on a keep-alive connection (its status line and headers)."""
    out = b""
    while b"\r\n\r\n" not in out and (chunk := s.recv(65536)):
        out += chunk
    s.close()
    return out


def test_compressed_bodies_count_against_max_body(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    """`max_body` limits what is received as well as what it inflates to: a gzip body announced larger is
    413 before it is read (was: read until `body_timeout`, then 408), and a chunked stream of empty gzip
    members, which inflates to nothing, is 413 once its compressed bytes pass the limit (was: read to its
    end, however long)."""
    _, url = start_gateway(
        workers,
        tmp_path,
        nats_server.url,
        "--cluster",
        cluster,
        "--max-body",
        "10000",
        "--body-timeout",
        "120",
    )
    announced = raw(url, head("/write?db=x&precision=s", cluster, 20_000, "Content-Encoding: gzip"))
    assert answer_of_first(announced).startswith(b"HTTP/1.1 413"), "413 from Content-Length alone"
    empty = gzip.compress(b"")
    members = empty * (30_000 // len(empty))  # 30 kB received, 0 bytes inflated
    assert gzip.decompress(members) == b""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    chunked = (
        "\r\n".join(
            [
                "POST /write?db=x&precision=s HTTP/1.1",
                "Host: gateway",
                "Content-Encoding: gzip",
                "Transfer-Encoding: chunked",
            ]
        ).encode()
        + b"\r\n\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(chunked)
        answer = b""
        try:
            for i in range(0, len(members), 4000):  # the gateway may answer (and close) before the last
                piece = members[i : i + 4000]
                s.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            s.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        while b"\r\n\r\n" not in answer and (chunk := s.recv(65536)):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413"), answer
    assert b"larger than 10000 bytes" in answer or b"request too large" in answer, answer
    assert (
        http(
            url + "/write?db=x&precision=s", gzip.compress(line()), headers={"Content-Encoding": "gzip"}
        ).status
        == 204
    )


# --- the stream --------------------------------------------------------------------------------------------


def test_stream_options_and_503_when_the_stream_is_full(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    """`--stream-max-bytes`/`--stream-max-age` shape the stream the gateway creates. A `discard: new` stream
    at its limit refuses publishes (nats-server: err_code 10077, "maximum bytes exceeded"): the gateway
    answers 503 with Retry-After saying the stream is full (the client holds its data), never 400/500."""
    _, url = start_gateway(
        workers,
        tmp_path,
        nats_server.url,
        "--cluster",
        cluster,
        "--stream-max-bytes",
        "5000000",
        "--stream-max-age",
        "3600",
        name="gateway-options",
    )
    name = stream_name("HPCBUS", cluster)

    async def config() -> tuple[int, float] | None:
        nc = await nats.connect(nats_server.url)
        try:
            info = await nc.jetstream().stream_info(name)
            return int(info.config.max_bytes or 0), float(info.config.max_age or 0)
        except NotFoundError:  # not made yet: the gateway ensures it in the background
            return None
        finally:
            await nc.close()

    assert wait_for(lambda: asyncio.run(config()), 20, "the stream") == (5_000_000, 3600.0)

    full_cluster = "full" + cluster

    async def small_stream() -> None:
        nc = await nats.connect(nats_server.url)
        try:
            await nc.jetstream().add_stream(
                name=stream_name("HPCBUS", full_cluster),
                subjects=[f"{full_cluster}.>"],
                max_bytes=2000,
                discard=DiscardPolicy.NEW,
            )
        finally:
            await nc.close()

    asyncio.run(small_stream())
    w, url = start_gateway(workers, tmp_path, nats_server.url, "--cluster", full_cluster, name="gateway-full")
    statuses = []
    for i in range(100):
        answer = http(
            url + "/write?db=x&precision=s", gzip.compress(line(i) * 10), headers={"Content-Encoding": "gzip"}
        )
        statuses.append(answer.status)
        if answer.status != 204:
            break
    assert statuses[0] == 204 and answer.status == 503, (statuses, answer.body)
    assert "stream is full" in json.loads(answer.body)["error"] and answer.headers["Retry-After"] == "2"
    assert "Traceback" not in w.log()
