"""Peak memory of a child process, for the tests and benchmarks that bound how much memory hpcbus uses."""

from __future__ import annotations

import threading
import time


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
