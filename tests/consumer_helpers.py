"""Running real `hpcbus consume ...` worker processes in tests, and sending data the way `nats pub` does."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class Worker:
    """A `hpcbus` subprocess whose log goes to a file; waits for a log line to know it is ready."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.log_path = log_path
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, ready: str = "consuming", timeout: float = 20.0) -> Worker:
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "hpcbus", *self.args], stdout=log, stderr=log, cwd=ROOT, env=self.env
        )
        log.close()
        wait_for(
            lambda: ready in self.log()[offset:],
            timeout,
            lambda: f"worker log to show {ready!r}:\n{self.log()}",
        )
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def wait_for(
    check: Callable[[], Any], timeout: float, what: str | Callable[[], str], interval: float = 0.2
) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            text = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout}s waiting for {text}")
        time.sleep(interval)


def raw_pub(port: int, subject: str, payload: bytes) -> None:
    """Publish with the raw NATS protocol (`PUB <subject> <n>`), byte for byte as `nats pub` sends it."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        f = s.makefile("rb")
        assert f.readline().startswith(b"INFO ")
        s.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\n')
        s.sendall(b"PUB %s %d\r\n%s\r\nPING\r\n" % (subject.encode(), len(payload), payload))
        assert f.readline() == b"PONG\r\n"


def count_points(influx: Any, db: str, measurement: str, where: str = "") -> int:
    rows = influx.points(f'SELECT count("value") FROM "{measurement}" {where}', db)
    return int(rows[0]["count"]) if rows else 0


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]
