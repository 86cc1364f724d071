"""A private munged for the test Slurm: Slurm authenticates every RPC through munge, and the system's munged
(if any) must not be touched."""

from __future__ import annotations

import getpass
import os
import pwd
import subprocess
import tempfile
from pathlib import Path

from hpcbus.local.daemon import Daemon, DaemonService, wait_until


def _traversable_temp_root() -> str:
    """The system temp dir if every user can traverse it (munged runs as user munge), else /tmp: CI setups
    sometimes point TMPDIR into a root-only directory."""
    root = Path(tempfile.gettempdir()).resolve()
    if all(p.stat().st_mode & 0o001 for p in (root, *root.parents)):
        return str(root)
    return "/tmp"


class Munge(DaemonService):
    """A private munged: own key, socket, pid and seed files, run as user `munge` in the foreground.

    Quirks: munged refuses a key or socket directory it finds insecure, and user `munge` must be able to
    traverse every parent. pytest's temp dirs live under a root-only 0700 directory, so this always makes
    its own directory under the system temp dir (0755, the key's directory 0700, both owned by munge) and
    removes it on `close()`. With `-F` the log goes to stderr (our log file), not to `--log-file`.
    """

    def __init__(self, start_timeout: float = 10.0) -> None:
        super().__init__(None, "hpcbus-munge-", start_timeout, temp_root=_traversable_temp_root())
        self.user = "munge" if os.geteuid() == 0 else getpass.getuser()
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
            user=self.user if os.geteuid() == 0 else None,
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
