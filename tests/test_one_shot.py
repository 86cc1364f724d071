"""A one-shot command never hangs: `hpcbus deadletter list|replay` with NATS unreachable gives up within
seconds with one sentence and exit 3, as `status` and `tail` do (issue 30/33: it used the reconnect-forever
client of the services and was still retrying after 600 s)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests.consumer_helpers import ROOT


@pytest.mark.parametrize("action", ["list", "replay"])
def test_deadletter_with_nats_unreachable_fails_fast(action: str) -> None:
    started = time.monotonic()
    argv = ["deadletter", action, "--nats", "nats://127.0.0.1:1", "--cluster", "c", "--connect-timeout", "1"]
    p = subprocess.run(
        [sys.executable, "-m", "hpcbus", *argv], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert p.returncode == 3, (p.returncode, p.stderr)
    assert "not reachable" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert time.monotonic() - started < 15
