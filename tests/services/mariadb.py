"""A private MariaDB for the test Slurm's slurmdbd: accounting (what sacct and `hpcbus produce slurm` read)
needs a database, and the system's MariaDB (if any) must not be touched."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from hpcbus.local.daemon import LOOPBACK, Daemon, DaemonService, free_port, wait_until


class MariaDB(DaemonService):
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
        if os.geteuid() == 0:
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
