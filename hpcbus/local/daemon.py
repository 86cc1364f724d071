"""Running a private service as a child process and knowing when it answers: what `hpcbus run` needs to
start nats-server and InfluxDB, and what the test services in `tests/services/` build on.

Every service started through `Daemon` and `LocalService`

- binds only to 127.0.0.1 on ports picked free at start-up unless the caller asks for a port,
- keeps all its files (config, data, logs, sockets) in a directory of its own, never under /etc or /var,
- runs as a foreground child in its own session, so `stop()` can take the whole process group down,
- dies with the thread that started it (`PR_SET_PDEATHSIG`), so a killed parent (Ctrl-C twice on
  `hpcbus run`, a CI timeout that SIGKILLs pytest) leaves no daemon behind. Quirk: start services from the
  main thread (or a thread that outlives them), otherwise they are killed when the starting thread exits.

Each service is a context manager: `with NatsServer(tmp) as nats: ...` starts, waits until the service
really answers, and stops on exit even when the body raises. `stop()` then `start()` reuses the same ports
and data, which is what restart tests need.

Only the standard library is used here (urllib, socket, subprocess), so importing this module is cheap.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

LOOPBACK = "127.0.0.1"
_PR_SET_PDEATHSIG = 1


class ServiceError(RuntimeError):
    """A local service did not start, died, or answered with an error; the message carries its log tail."""


class PortPicker:
    """Hands out loopback ports that are free, outside the kernel's ephemeral range, and never twice.

    Why not bind port 0: that port comes from the ephemeral range, the same range the kernel draws from for
    every outgoing connection. Between picking and the daemon's own bind, or while a daemon is stopped to
    be restarted on its ports, any client socket in the test run may take the port as its local end, and
    the daemon then fails with "address already in use" (seen in the fault suite). Ports below the
    ephemeral range are only ever taken by an explicit bind. Within one process a cursor walks the range so
    a port handed out once is not handed out again (a stopped service keeps its ports); a random start per
    picker keeps two test runs on one machine apart, and the bind check skips ports anyone holds.
    """

    LOWEST = 10000

    def __init__(self, host: str = LOOPBACK) -> None:
        self.host = host
        self.low, self.high = self._range()
        """The ports handed out are in [low, high)."""
        self._cursor = self.low + int.from_bytes(os.urandom(4)) % (self.high - self.low)
        self._lock = threading.Lock()

    @classmethod
    def _range(cls) -> tuple[int, int]:
        try:
            first, last = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        except (OSError, ValueError):
            first, last = 32768, 60999  # Linux's default
        return cls.usable(first, last)

    @classmethod
    def usable(cls, first: int, last: int) -> tuple[int, int]:
        """[low, high) of the ports to hand out when the ephemeral range is `first`-`last`: below it, or above
        it when a site lets it start low; when it covers nearly everything, all ports from `LOWEST` (the
        bind check then has to do)."""
        if first - cls.LOWEST >= 1000:
            return cls.LOWEST, first
        if 65536 - (last + 1) >= 1000:
            return last + 1, 65536
        return cls.LOWEST, 65536

    def take(self, count: int = 1) -> list[int]:
        ports: list[int] = []
        with self._lock:
            for _ in range(self.high - self.low):
                port = self._cursor
                self._cursor = self._cursor + 1 if self._cursor + 1 < self.high else self.low
                if port_free(port, self.host):
                    ports.append(port)
                    if len(ports) == count:
                        return ports
        raise ServiceError(f"no {count} free ports in {self.low}-{self.high - 1} on {self.host}")


def port_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether a daemon could listen on `port` now (a TIME_WAIT leftover does not count as an owner)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


_PORTS = PortPicker()
"""The one picker of this process (made at import, so no two threads can make two): every service it starts
draws from one cursor, which is what keeps a port from being handed out twice."""


def free_ports(count: int = 1) -> list[int]:
    """`count` distinct loopback ports, free right now, that this process has not handed out before and
    that the kernel never gives to outgoing connections (see `PortPicker`)."""
    return _PORTS.take(count)


def free_port() -> int:
    """One port as `free_ports` picks them."""
    return free_ports(1)[0]


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


def file_tail(path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a log file, for failure messages ("(no log)" when it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def require_program(name: str) -> None:
    """Fail with how to install `name` rather than with a bare FileNotFoundError from Popen."""
    if shutil.which(name) is None:
        raise ServiceError(f"{name} not found: `make install` installs it (deploy/install-debian.sh)")


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
        require_program(self.argv[0])
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
        return file_tail(self.log_path, lines)

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


class LocalService:
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


class DaemonService(LocalService):
    """A service that is exactly one `Daemon`."""

    _daemon: Daemon

    def alive(self) -> bool:
        return self._daemon.alive()

    @property
    def pid(self) -> int | None:
        """The daemon's process id while it runs (the fault tests kill it, the benchmarks meter its CPU)."""
        return self._daemon.pid

    def stop(self) -> None:
        self._daemon.stop()

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the daemon's output, for failure messages."""
        return self._daemon.log_tail(lines)
