"""A private single-node Slurm with accounting for tests: the real sacct/squeue/sinfo, slurmstepd and
acct_gather_profile that the Slurm producer and the node producer's job detection read."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

from hpcbus.local.daemon import (
    LOOPBACK,
    Daemon,
    LocalService,
    ServiceError,
    file_tail,
    free_ports,
    require_program,
    wait_until,
)
from hpcbus.schemas.slurm.values import TERMINAL_STATES
from tests.services.mariadb import MariaDB
from tests.services.munge import Munge


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


def _slurmd_hardware() -> dict[str, str]:
    """This host as `slurmd -C` sees it (NodeName=... CPUs=... RealMemory=...), the keys to copy into the
    node line so slurmd registers exactly what slurm.conf claims (otherwise the node is drained)."""
    require_program("slurmd")
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


class SlurmCluster(LocalService):
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
        if os.geteuid() != 0:
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

    @contextlib.contextmanager
    def profile_set_to(self, profile: InfluxProfile | None) -> Iterator[Self]:
        """`set_profile(profile)` for the `with` block, then the profile it had before (each switch restarts
        slurmctld and slurmd): a test points the plugin elsewhere (at `hpcbus gateway`, say) without
        changing it for the tests after it, `slurm_influx_profile`'s included."""
        before = self.profile
        if profile != before:
            self.set_profile(profile)
        try:
            yield self
        finally:
            if self.profile != before:
                self.ensure_running().set_profile(before)

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
            f"== {d.name} ==\n{file_tail(self.log_dir / (d.name + '.log'), lines)}" for d in self._daemons()
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
