"""The one place for what bus tests share: real `hpcbus` processes (workers and producer services), waiting
on state, publishing the way `nats pub` and producers do, and reading back what a stream or a durable holds.

Tests wait on state, never on the clock: a worker's log line or counter, a JetStream consumer's pending
counts, a file, a process's read offset. `settled` is the answer to "nothing more arrives": once every
durable reading a stream has taken and acknowledged everything stored (and the stream did not grow
meanwhile), nothing in the stream can still cause output, so a later assertion that nothing more was
written is sound.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import nats
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError

from hpcbus.bus import round_trip
from hpcbus.schemas import subjects
from hpcbus.streams import ensure_stream, stream_name, telemetry_stream

ROOT = Path(__file__).resolve().parents[1]


# --- waiting ---------------------------------------------------------------------------------------------


def _fail_after(deadline: float, timeout: float, what: str | Callable[[], str]) -> None:
    """Fail naming `what` once the monotonic clock is past `deadline` (the one message of both waits)."""
    if time.monotonic() > deadline:
        text = what() if callable(what) else what
        raise AssertionError(f"timed out after {timeout}s waiting for {text}")


def wait_for(
    check: Callable[[], Any], timeout: float, what: str | Callable[[], str], interval: float = 0.1
) -> Any:
    """`check()` until it returns something true (returned), or fail after `timeout` seconds naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        _fail_after(deadline, timeout, what)
        time.sleep(interval)


async def wait_for_async(
    check: Callable[[], Any | Awaitable[Any]],
    timeout: float,
    what: str | Callable[[], str],
    interval: float = 0.1,
) -> Any:
    """`wait_for` inside an event loop; `check` may be a plain function or a coroutine function."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        _fail_after(deadline, timeout, what)
        await asyncio.sleep(interval)


# --- processes ---------------------------------------------------------------------------------------------


class Process:
    """A subprocess whose stdout and stderr go to a log file (appended: a restart keeps one log)."""

    def __init__(
        self, argv: list[str], log_path: Path, env: dict[str, str] | None = None, cwd: Path = ROOT
    ) -> None:
        self.argv = argv
        self.log_path = log_path
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready: str | None = None, timeout: float = 60.0) -> Process:
        """Start; with `ready`, return once the log shows that text (written after this start)."""
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=self.cwd, env=self.env
            )
        if ready is not None:
            self.wait_log(ready, timeout, offset)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def wait_log(self, text: str, timeout: float = 20.0, offset: int = 0) -> str:
        """Wait for `text` in the log (after byte `offset`); fails at once when the process has exited."""

        def seen() -> str:
            alive = self.running()
            log = self.log()
            if text in log[offset:]:
                return log
            assert alive or self.proc is None, f"exited ({self.returncode()}) before {text!r}:\n{log}"
            return ""

        return str(wait_for(seen, timeout, lambda: f"the log to show {text!r}:\n{self.log()}"))

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM, and the exit status."""
        self.signal(signal.SIGTERM)
        return self.wait(timeout)

    def stop(self) -> None:
        """Kill if still running (test teardown)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Worker(Process):
    """`python -m hpcbus ARGS` (any subcommand); `start()` waits for the worker's "consuming" log line."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        super().__init__([sys.executable, "-m", "hpcbus", *args], log_path, env)
        self.args = args

    def start(self, ready: str | None = "consuming", timeout: float = 60.0) -> Worker:
        super().start(ready, timeout)
        return self


TO_SONAR, TO_LP = "hpcbus-sonar-to-sonar", "hpcbus-sonar-to-lp"
"""The durables of `hpcbus consume sonar`'s two directions (LP -> Sonar, Sonar -> LP)."""


def sonar_worker(
    workers: list[Process],
    tmp_path: Path,
    nats_url: str,
    cluster: str,
    *extra: str,
    name: str = "w",
    delivery: str = "",
) -> Worker:
    """A started `hpcbus consume sonar` worker, registered in `workers` (the fixture stops it). Its config
    (`delivery` adds lines to `[delivery]`) turns self-telemetry off, so message counts on the stream are
    exact; the log is `tmp_path/<name>.log`."""
    config = tmp_path / "hpcbus.toml"
    if not config.exists():
        config.write_text("[delivery]\nstats_seconds = 3600.0\n" + delivery)
    args = ["consume", "sonar", "--nats", nats_url, "--cluster", cluster, "--config", str(config), *extra]
    w = Worker(args, tmp_path / f"{name}.log")
    workers.append(w)
    return w.start()


def deadletter_records(
    workers: list[Process], log_path: Path, url: str, cluster: str
) -> list[dict[str, Any]]:
    """What `hpcbus deadletter list --json` prints for the cluster (a real process, logging to `log_path`)."""
    listing = Worker(["deadletter", "list", "--json", "--nats", url, "--cluster", cluster], log_path)
    workers.append(listing)
    listing.start(ready="seq")
    assert listing.wait(10) == 0, listing.log()
    return [json.loads(line) for line in listing.log().splitlines() if line.startswith("{")]


class ProducerProcess:
    """A producer service (`hpcbus produce ...`) that a test starts and stops several times; each run logs
    to a file of its own, and `wait` reads the cluster's stream until a check passes."""

    def __init__(
        self, tmp_path: Path, url: str, cluster: str, args: list[str], env: dict[str, str] | None = None
    ) -> None:
        self.tmp_path, self.url, self.cluster, self.args, self.env = tmp_path, url, cluster, args, env
        self.process: Worker | None = None
        self.runs = 0

    @property
    def log_path(self) -> Path:
        return self.tmp_path / f"service-{self.runs}.log"

    def start(self, *extra: str) -> Worker:
        self.runs += 1
        argv = [*self.args, "--nats", self.url, "--cluster", self.cluster, *extra]
        self.process = Worker(argv, self.log_path, self.env).start(ready=None)
        return self.process

    def running(self) -> bool:
        return self.process is not None and self.process.running()

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and the exit status."""
        assert self.process is not None
        rc = self.process.terminate(timeout)
        self.process = None
        return rc

    def kill(self) -> None:
        if self.process is not None:
            self.process.stop()
        self.process = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def messages(self) -> list[tuple[str, bytes, str]]:
        """(subject, payload, Nats-Msg-Id) of what the producer published in the cluster's stream: all but its
        self-telemetry (`hpcbus_*` lines on `<cluster>.telemetry`, not its output)."""
        own = subjects.telemetry(self.cluster)
        return [m for m in triples(bus_messages(self.url, self.cluster)) if m[0] != own]

    def wait(
        self, what: str, check: Callable[[list[tuple[str, bytes, str]]], Any], timeout: float = 30.0
    ) -> list[tuple[str, bytes, str]]:
        """The stream's messages once `check(messages)` is true; fails at once if the service exited."""

        def ready() -> tuple[list[tuple[str, bytes, str]]] | None:
            if self.process is not None and not self.process.running():
                raise AssertionError(f"the service exited ({self.process.returncode()}) before {what}")
            messages = self.messages()
            return (messages,) if check(messages) else None  # a tuple: true even when there are none

        try:
            return list(wait_for(ready, timeout, what)[0])
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log()}") from None


def read_offset(pid: int, path: Path) -> int | None:
    """The file position of `pid`'s open descriptor on `path` (from /proc/PID/fdinfo): how far the
    process has read a file it keeps open; None when it has no such descriptor."""
    target = str(path.resolve())
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                    for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines():
                        if line.startswith("pos:"):
                            return int(line.split()[1])
    return None


def log_counter(log: str, pattern: str) -> int:
    """The largest value of the `(\\d+)` group of `pattern` in a worker's log (its counter summaries)."""
    return max((int(m) for m in re.findall(pattern, log)), default=0)


# --- publishing ----------------------------------------------------------------------------------------------


def raw_pub(port: int, subject: str, payload: bytes) -> None:
    """Publish with the raw NATS protocol (`PUB <subject> <n>`), byte for byte as `nats pub` sends it."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        f = s.makefile("rb")
        assert f.readline().startswith(b"INFO ")
        s.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\n')
        s.sendall(b"PUB %s %d\r\n%s\r\nPING\r\n" % (subject.encode(), len(payload), payload))
        assert f.readline() == b"PONG\r\n"


def js_publish(url: str, messages: Iterable[tuple[str, bytes]]) -> None:
    """JetStream publish, each with a unique Nats-Msg-Id (a repeated id would be dropped as a duplicate),
    the way `hpcbus pub --jetstream` or a bridge would."""

    async def publish() -> None:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            call = uuid.uuid4().hex[:8]
            for i, (subject, payload) in enumerate(messages):
                await js.publish(subject, payload, headers={"Nats-Msg-Id": f"test:{call}:{i}"})
        finally:
            await nc.close()

    asyncio.run(publish())


async def collect_while(
    url: str,
    subject: str,
    action: Callable[[nats.NATS], Awaitable[None]],
    enough: Callable[[list[str]], bool],
) -> list[str]:
    """Subscribe to `subject`, run `action(nc)`, and collect the payloads until `enough(collected)`."""
    got: list[str] = []
    nc = await nats.connect(url)
    try:

        async def on_msg(msg: Any) -> None:
            got.append(msg.data.decode())

        await nc.subscribe(subject, cb=on_msg)
        await round_trip(nc, 5)
        await action(nc)
        await wait_for_async(lambda: enough(got), 10, lambda: f"messages on {subject}: {got}")
    finally:
        await nc.close()
    return got


# --- what a stream and its durables hold -----------------------------------------------------------------


async def stream_messages(url: str, stream: str, prefix: str = "") -> list[RawStreamMsg]:
    """Every message of `stream` whose subject starts with `prefix`, in order ([] when there is no stream)."""
    nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(stream)
        except NotFoundError:
            return []
        out = []
        if info.state.messages:
            for seq in range(max(1, info.state.first_seq), info.state.last_seq + 1):
                with contextlib.suppress(NotFoundError):
                    msg = await js.get_msg(stream, seq)
                    if (msg.subject or "").startswith(prefix):
                        out.append(msg)
        return out
    finally:
        await nc.close()


def bus_messages(url: str, cluster: str, prefix: str = "", kind: str = "HPCBUS") -> list[RawStreamMsg]:
    """`stream_messages` of a cluster's telemetry stream (`kind` HPCBUS_DLQ: its dead-letter stream)."""
    return asyncio.run(stream_messages(url, stream_name(kind, cluster), prefix))


def triples(msgs: list[RawStreamMsg]) -> list[tuple[str, bytes, str]]:
    """(subject, payload, Nats-Msg-Id) of each message."""
    return [(m.subject or "", m.data or b"", (m.headers or {}).get("Nats-Msg-Id", "")) for m in msgs]


async def _consumers(
    url: str, stream: str, durables: Iterable[str]
) -> tuple[int, list[tuple[int, int]], int]:
    """The stream's last sequence, each durable's (num_pending, num_ack_pending), the last sequence again."""
    nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
    try:
        js = nc.jetstream()
        before = (await js.stream_info(stream)).state.last_seq
        states = []
        for durable in durables:
            info = await js.consumer_info(stream, durable)
            states.append((int(info.num_pending or 0), int(info.num_ack_pending or 0)))
        return int(before), states, int((await js.stream_info(stream)).state.last_seq)
    finally:
        await nc.close()


def consumer_counts(url: str, cluster: str, durable: str) -> tuple[int, int]:
    """(`num_pending`, `num_ack_pending`) of a durable: messages not yet delivered, and delivered to a worker
    but not yet acknowledged."""
    _, (counts,), _ = asyncio.run(_consumers(url, stream_name("HPCBUS", cluster), [durable]))
    return counts


def unacked(url: str, cluster: str, durable: str) -> int:
    """Messages of the durable not yet acknowledged (not yet delivered, or held by a worker)."""
    return sum(consumer_counts(url, cluster, durable))


def settled(url: str, cluster: str, *durables: str) -> bool:
    """True when each durable has taken and acknowledged everything the stream holds, and the stream did
    not grow while that was checked: a worker publishes its output before it acknowledges the input, so no
    output of anything stored can still come."""
    try:
        before, states, after = asyncio.run(_consumers(url, stream_name("HPCBUS", cluster), durables))
    except NotFoundError:
        return False
    return before == after and all(pending == 0 and ack_pending == 0 for pending, ack_pending in states)


# --- InfluxDB ------------------------------------------------------------------------------------------------


def count_points(influx: Any, db: str, measurement: str, where: str = "") -> int:
    rows = influx.points(f'SELECT count("value") FROM "{measurement}" {where}', db)
    return int(rows[0]["count"]) if rows else 0


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def make_telemetry_stream(urls: str | list[str], cluster: str) -> str:
    """Create `cluster`'s telemetry stream as a worker would (before anything publishes); its name."""

    async def make() -> None:
        nc = await nats.connect(urls)
        try:
            await ensure_stream(nc.jetstream(), telemetry_stream(cluster))
        finally:
            await nc.close()

    asyncio.run(make())
    return telemetry_stream(cluster).name
