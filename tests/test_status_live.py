"""`hpcbus status --watch` in a real terminal (tmux): the rate it shows matches what was published within
10 %, a resize to a tiny window and back is drawn again (no crash, no line wider than the window), Ctrl-C
ends it with exit 0."""

from __future__ import annotations

import asyncio
import re
import shlex
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from tests.consumer_helpers import ROOT, make_telemetry_stream, wait_for
from tests.services import NatsServer

pytestmark = pytest.mark.services

LINES_PER_MSG = 25
MSGS_PER_S = 40
"""1,000 lines a second on `<cluster>.metrics`, from four hosts."""


class Publisher(threading.Thread):
    """Publishes MSGS_PER_S messages a second on an absolute schedule (so the rate is exact on average)."""

    def __init__(self, url: str, cluster: str) -> None:
        super().__init__(daemon=True)
        self.url, self.cluster = url, cluster
        self.stop = threading.Event()
        self.sent = 0

    def run(self) -> None:
        asyncio.run(self.main())

    async def main(self) -> None:
        nc = await nats.connect(self.url)
        start = time.monotonic()
        try:
            while not self.stop.is_set():
                due = start + self.sent / MSGS_PER_S
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                host = f"h{self.sent % 4}"
                now = int(time.time())
                body = "".join(
                    f"cpu_load,hostname={host},type=node,type-id=0 value={i} {now}\n"
                    for i in range(LINES_PER_MSG)
                )
                await nc.publish(f"{self.cluster}.metrics", body.encode())
                self.sent += 1
        finally:
            await nc.close()


class Tmux:
    def __init__(self, tmp: Path) -> None:
        self.socket = f"hpcbus-test-{uuid.uuid4().hex[:8]}"
        self.tmp = tmp

    def __call__(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, check=True, timeout=10
        ).stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "s")


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    t = Tmux(tmp_path)
    yield t
    subprocess.run(["tmux", "-L", t.socket, "kill-server"], capture_output=True, timeout=10)


def rate_on_screen(screen: str, subject: str) -> float | None:
    m = re.search(re.escape(subject) + r"\s+(\d+) lines/s", screen)
    return float(m.group(1)) if m else None


def test_live_view_rates_resize_and_ctrl_c(
    nats_server: NatsServer, cluster: str, tmux: Tmux, tmp_path: Path
) -> None:
    make_telemetry_stream(nats_server.url, cluster)
    publisher = Publisher(nats_server.url, cluster)
    publisher.start()
    err = tmp_path / "watch.err"
    argv = [sys.executable, "-m", "hpcbus", "status", "--watch", "--refresh", "1"]
    argv += ["--nats", nats_server.url, "--cluster", cluster]
    command = f"cd {shlex.quote(str(ROOT))} && {shlex.join(argv)} 2>{shlex.quote(str(err))}; echo EXITED $?; sleep 600"
    tmux("new-session", "-d", "-s", "s", "-x", "120", "-y", "30", command)
    try:
        subject = f"{cluster}.metrics"
        expected = LINES_PER_MSG * MSGS_PER_S

        def accurate() -> float | None:
            rate = rate_on_screen(tmux.screen(), subject)
            return rate if rate is not None and abs(rate - expected) <= 0.1 * expected else None

        wait_for(
            accurate, 60, lambda: f"a rate within 10 % of {expected} lines/s:\n{tmux.screen()}", interval=0.5
        )
        screen = tmux.screen()
        assert f"cluster {cluster}" in screen and "busiest nodes: h" in screen, screen

        tmux("resize-window", "-t", "s", "-x", "24", "-y", "6")

        def redrawn_small() -> str | None:
            lines = tmux.screen().rstrip("\n").split("\n")
            text = "\n".join(lines)
            ok = "hpcbus status" in text and all(len(line) <= 24 for line in lines) and "EXITED" not in text
            return text if ok else None

        wait_for(
            redrawn_small, 20, lambda: f"a redraw in 24x6:\n{tmux.screen()}\n{err.read_text()}", interval=0.5
        )
        tmux("resize-window", "-t", "s", "-x", "120", "-y", "30")
        wait_for(
            lambda: rate_on_screen(tmux.screen(), subject),
            20,
            lambda: f"the full screen again:\n{tmux.screen()}",
        )
        assert "EXITED" not in tmux.screen()

        tmux("send-keys", "-t", "s", "C-c")
        wait_for(lambda: "EXITED 0" in tmux.screen(), 20, lambda: f"exit 0 after Ctrl-C:\n{tmux.screen()}")
        assert "Traceback" not in err.read_text(), err.read_text()
    finally:
        publisher.stop.set()
        publisher.join(10)
