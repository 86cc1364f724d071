"""`hpcbus run` (what `make run` starts): the whole pipeline on this machine, data under `./var`.

nats-server with JetStream and InfluxDB 1.x are started as private daemons (unless `--nats` / `--influx-url`
point at existing ones), then the node producer for this host, the InfluxDB consumer, the Sonar translator
(`consume sonar`, writing Sonar's directory tree, the files Jobanalyzer reads, under `<var>/sonar`) and the
jobs worker (`consume jobs`: a summary per finished job, state in `<var>/jobs.state`) as child processes of
their own (the same commands an admin deploys). The banner says where the Grafana dashboards are and how to
get a report for a job. Ctrl-C or SIGTERM stops all of it: workers first (they
flush and ack), services last. A worker that dies is started again after a short pause.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from hpcbus.logs import LOG_TAG

CHILD_STOP_SECONDS = 4.5
"""How long the workers get to stop on their own (they promise 5 s from SIGTERM) before they are killed."""

HELP = (
    "start the whole pipeline locally (nats-server, InfluxDB, node producer, InfluxDB consumer, "
    "Sonar translator, jobs worker)"
)

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
"""The Grafana dashboards and provisioning files (`deploy/grafana/`)."""
PROCESS_QUIET = 60
"""Seconds after which the local jobs worker takes a process group whose processes are gone as ended (the
service's default is 300 s; locally a summary should come soon after a command finishes)."""

log = logging.getLogger("hpcbus.run")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--var", default="var", help="directory for data and logs (default ./var)")
    p.add_argument("--nats", help="use this NATS server instead of starting one")
    p.add_argument("--influx-url", help="use this InfluxDB (v1 API) instead of starting one")
    p.add_argument("--db", default="hpcbus", help="InfluxDB database (default hpcbus)")
    p.add_argument("--cluster", default=os.environ.get("HPCBUS_CLUSTER", "local"), help="cluster name")
    p.add_argument(
        "--interval", type=float, default=10.0, help="node sampling interval in seconds (default 10)"
    )
    p.add_argument("--for", dest="duration", type=float, default=0.0, help="stop after this many seconds")
    p.add_argument(
        "--min-uid",
        type=int,
        default=1000,
        metavar="UID",
        help="the node producer leaves out processes of users below this uid (default 1000: root's and "
        "system users' jobs are not reported; 0 keeps all)",
    )


def hpcbus_command() -> str:
    """How to run this hpcbus from a shell, as the banner prints it: `hpcbus` when that is on PATH and is
    this one, else the virtual environment's script by its full path, else `python -m hpcbus` (after
    `make run` the venv is not on PATH, so a bare `hpcbus` would not be found)."""
    script = Path(sys.executable).parent / "hpcbus"
    found = shutil.which("hpcbus")
    if found and script.exists() and Path(found).resolve() == script.resolve():
        return "hpcbus"
    if script.exists():
        return shlex.quote(str(script))
    return f"{shlex.quote(sys.executable)} -m hpcbus"


class Child:
    """A worker process, restarted when it dies (unless we are stopping)."""

    def __init__(self, name: str, argv: list[str]) -> None:
        self.name = name
        self.argv = argv
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def start(self) -> None:
        env = {**os.environ, LOG_TAG: self.name}  # its lines say which worker they are from
        self.proc = subprocess.Popen([sys.executable, "-m", "hpcbus", *self.argv], env=env)
        self.started = time.monotonic()

    def check(self, stopping: threading.Event) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            code = self.proc.returncode
            wait = 1.0 if time.monotonic() - self.started > 30 else 5.0
            log.warning("%s exited with status %s; starting it again in %.0f s", self.name, code, wait)
            if not stopping.wait(wait):
                self.start()

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, deadline: float) -> None:
        """Wait until `deadline` (monotonic) for the child's own clean stop, then kill it."""
        if self.proc is None:
            return
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s did not stop in time; killing it", self.name)
            self.proc.kill()
            self.proc.wait()


def banner(nats_url: str, influx_url: str, db: str, cluster: str, var: Path, min_uid: int = 1000) -> str:
    from hpcbus.commands.deploy.dashboards.settings import GrafanaSettings

    host = socket.gethostname()
    dashboards = GrafanaSettings().dashboards_path  # what the committed provisioning file loads
    hpcbus = hpcbus_command()
    uids = (
        f"Note: processes of users below uid {min_uid} (root's too) are not sampled, so their jobs have no\n"
        f"data; {hpcbus} run --min-uid 0 (make run RUN_ARGS='--min-uid 0') keeps them all.\n"
        if min_uid > 0
        else ""
    )
    return f"""
hpcbus is running (Ctrl-C stops everything)
  NATS (JetStream)   {nats_url}      data: {var / "nats"}
  InfluxDB 1.x       {influx_url}     database: {db}, data: {var / "influxdb"}
  node producer      this host ({host}) -> {cluster}.metrics, {cluster}.events.*
  InfluxDB consumer  {cluster}.metrics, .events.>, .log.> -> {db}
  Sonar translator   {cluster}.metrics, .events.> <-> {cluster}.sonar.*
                     Sonar's directory tree (what Jobanalyzer reads): {var / "sonar"}
  jobs worker        {cluster}.metrics, .events.> -> {cluster}.events.jobsummary and job_summary in {db}
                     (one summary per finished job; state: {var / "jobs.state"})

See the data (InfluxQL):
  curl -sG {influx_url}/query --data-urlencode db={db} \\
    --data-urlencode "q=SELECT mean(value) FROM cpu_load, mem_used WHERE time > now() - 5m GROUP BY hostname"

Grafana dashboards (InfluxDB data source {influx_url}, database {db}): {GRAFANA}
  provisioning/datasources/hpcbus.yaml -> Grafana's provisioning/datasources/
  provisioning/dashboards/hpcbus.yaml  -> Grafana's provisioning/dashboards/ (loads {dashboards})
  dashboards/*.json                    -> {dashboards}
  (`hpcbus deploy grafana --dashboards-path DIR` writes them for another place; docs/deploy.md)

The jobs summarised so far, and a report for one of them (JOB as the bus keys it: <job> for Slurm and
OCS, <job>@<epoch> for process groups; a process group is summarised {PROCESS_QUIET} s after its processes end):
  curl -sG {influx_url}/query --data-urlencode db={db} \\
    --data-urlencode 'q=SELECT "user", cpu_eff, mem_peak, flags FROM job_summary GROUP BY job ORDER BY time DESC LIMIT 1'
  {hpcbus} report --job JOB --influx-url {influx_url} --db {db}
{uids}
See the Sonar envelopes (one JSON document per line; a file per host and kind, a directory per UTC day):
  ls {var / "sonar"}/$(date -u +%Y/%m/%d)

Inject a line (checked first; it says the stream and sequence it was stored as):
  {hpcbus} pub -s {nats_url} {cluster}.metrics 'cpu_load,hostname=test01,type=node value=42'
  (the nats CLI, where installed, takes the same arguments: nats pub -s {nats_url} ...)
"""


def run(args: argparse.Namespace) -> int:
    from hpcbus.local import InfluxDB, NatsServer, ServiceError
    from hpcbus.local.daemon import port_free

    var = Path(args.var).resolve()
    var.mkdir(parents=True, exist_ok=True)
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if not stopping.is_set():
            log.info("%s: stopping the workers, then the services", signal.Signals(signum).name)
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    services: list[NatsServer | InfluxDB] = []
    children: list[Child] = []
    try:
        nats_url = args.nats
        if not nats_url:
            nats = NatsServer(var / "nats", port=4222 if port_free(4222) else None)
            services.append(nats.start())
            nats_url = nats.url
            log.info("nats-server started on %s (log %s)", nats_url, nats.log_path)
        influx_url = args.influx_url
        if not influx_url:
            influx = InfluxDB(var / "influxdb", port=8086 if port_free(8086) else None)
            services.append(influx.start())
            influx_url = influx.url
            log.info("InfluxDB started on %s (log %s)", influx_url, influx.log_path)
        bus = ["--nats", nats_url, "--cluster", args.cluster]
        children = [
            Child(
                "InfluxDB consumer", ["consume", "influx", *bus, "--influx-url", influx_url, "--db", args.db]
            ),
            Child(
                "Sonar translator",
                ["consume", "sonar", *bus, "--to", "both", "--directory", str(var / "sonar")],
            ),
            Child(
                "jobs worker",
                [
                    "consume",
                    "jobs",
                    *bus,
                    "--influx-url",
                    influx_url,
                    "--db",
                    args.db,
                    "--state-file",
                    str(var / "jobs.state"),
                    "--process-quiet",
                    str(PROCESS_QUIET),
                ],
            ),
            Child(
                "node producer",
                [
                    "produce",
                    "node",
                    *bus,
                    "--interval",
                    str(args.interval),
                    "--spill-dir",
                    str(var / "outbox"),
                    "--min-uid",
                    str(args.min_uid),
                ],
            ),
        ]
        for child in children:
            child.start()
        print(
            banner(nats_url, influx_url, args.db, args.cluster, var, args.min_uid),
            file=sys.stderr,
            flush=True,
        )
        deadline = time.monotonic() + args.duration if args.duration else None
        while not stopping.wait(0.5):
            if deadline is not None and time.monotonic() > deadline:
                break
            for child in children:
                child.check(stopping)
    except ServiceError as exc:
        log.error("%s", str(exc).splitlines()[0])
        return 1
    finally:
        for child in children:  # all at once: each stops within its own deadline (hpcbus.service)
            child.terminate()
        deadline = time.monotonic() + CHILD_STOP_SECONDS
        for child in children:
            child.wait(deadline)
        for service in reversed(services):
            service.stop()
    log.info("stopped cleanly")
    return 0
