"""`hpcbus consume jobs` on the real pipeline: the node producer sampling this host, a real Slurm running a job
that burns one core for a while with 256 MiB resident on an allocation of 2 cores and 2 GiB, `produce slurm`,
two jobs workers and InfluxDB.

One worker runs undisturbed (the reference); the other is killed with SIGKILL in the middle of the job and
started again. Its summary must equal the reference's: what it had saved survives, what it had not
acknowledged comes back (redelivered after `ack_wait`) and is counted once.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest

from hpcbus.schemas.jobsummary import decode_state
from tests.consumer_helpers import Process, Worker, bus_messages, wait_for
from tests.services import InfluxDB, NatsServer, SlurmCluster
from tests.test_consume_jobs import summaries

pytestmark = pytest.mark.services

MIB = 1024 * 1024
BURN_SECONDS = 12
CPU = re.compile(r"^cpu ([0-9.]+)$", re.MULTILINE)

JOB_SCRIPT = f"""#!/bin/sh
python3 - <<'EOF'
import time
block = bytearray(256 * 1024 * 1024)
for i in range(0, len(block), 4096):
    block[i] = 1  # resident, not just reserved
end = time.time() + {BURN_SECONDS}
while time.time() < end:
    pass
print("cpu", time.process_time())
EOF
"""


def test_real_job_summary_survives_kill_9_without_double_counting(
    workers: list[Process],
    tmp_path: Path,
    nats_server: NatsServer,
    influxdb: InfluxDB,
    slurm: SlurmCluster,
    cluster: str,
) -> None:
    bus = ["--nats", nats_server.url, "--cluster", cluster]
    (tmp_path / "node.toml").write_text("[node.jobs]\nmin_uid = 0\n")  # the test Slurm runs jobs as root
    dbs = {name: f"jobs_{name}_{uuid.uuid4().hex[:6]}" for name in ("ref", "victim")}

    def jobs_worker(name: str, run: int = 0) -> Worker:
        args = ["consume", "jobs", *bus, "--influx-url", influxdb.url, "--db", dbs[name], "--durable", name]
        args += ["--state-file", str(tmp_path / f"{name}.state"), "--grace", "4", "--ack-wait", "3"]
        args += ["--window", "15", "--interval", "1"]
        w = Worker(args, tmp_path / f"{name}-{run}.log")
        workers.append(w)
        return w.start()

    ref = jobs_worker("ref")
    victim = jobs_worker("victim")
    node = Worker(
        ["produce", "node", *bus, "--config", str(tmp_path / "node.toml"), "--interval", "1"],
        tmp_path / "node.log",
    )
    producer = Worker(
        ["produce", "slurm", *bus, "--interval", "1", "--state-file", str(tmp_path / "slurm.state")],
        tmp_path / "slurm.log",
        env=slurm.env(),
    )
    workers += [node, producer]
    node.start(ready=None)
    producer.start(ready=None)

    def node_sampled() -> bool:
        assert node.running(), f"the node producer exited:\n{node.log()}"
        return any(
            b"job_processes," in (m.data or b"")
            for m in bus_messages(nats_server.url, cluster, f"{cluster}.metrics")
        )

    wait_for(node_sampled, 60, "the node's first sample")
    job = str(slurm.sbatch(JOB_SCRIPT, "-c", "2", "--mem=2G"))
    slurm.wait_job(job, states=("RUNNING", "COMPLETED"), timeout=60)

    def victim_has_samples() -> bool:
        try:
            state = decode_state((tmp_path / "victim.state").read_bytes())
        except (FileNotFoundError, ValueError):
            return False
        j = state.jobs.get(f"{cluster}\t{job}")
        return j is not None and any(len(n.buckets) + n.samples >= 3 for n in j.nodes.values())

    wait_for(victim_has_samples, 60, lambda: f"samples of job {job} in the victim's state\n{victim.log()}")
    victim.stop()  # SIGKILL in the middle of the job: no flush, no ack of what it held
    victim = jobs_worker("victim", 1)
    slurm.wait_job(job, timeout=90)

    def point(name: str) -> dict[str, Any] | None:
        rows = influxdb.points(f"SELECT * FROM job_summary WHERE job = '{job}'", dbs[name], epoch="s")
        return rows[0] if rows else None

    wait_for(lambda: point("ref") and point("victim"), 90, "both workers' job_summary points")
    # (only this job: other Slurm instances on the machine run jobs the node producer sees too)
    query = f"SELECT * FROM job_summary WHERE job = '{job}'"
    rows = {name: influxdb.points(query, db, epoch="s") for name, db in dbs.items()}
    logs = "\n".join(f"--- {w.log_path.name}\n{w.log()[-3000:]}" for w in workers if "jobs" in w.argv)
    assert len(rows["ref"]) == len(rows["victim"]) == 1, f"{rows}\n{logs}"
    reference, restarted = rows["ref"][0], rows["victim"][0]
    assert restarted == reference, f"{rows}\n{logs}"  # every field: nothing lost, nothing counted twice

    event = summaries(nats_server, cluster)[job]
    assert (event["scheduler"], event["state"], event["partition"], event["nodes"]) == (
        "slurm",
        "completed",
        slurm.partition,
        1,
    )
    assert event["cores"] == 2 and event["mem_requested"] == 2048 * MIB
    assert event["samples"] >= BURN_SECONDS - 2 and event["coverage"] > 50
    # One core burnt on an allocation of 2: 50 % on an idle machine. The test machine is shared, so the
    # burner reports the CPU it really got (sacct's TotalCPU stays 0 with jobacct_gather on this Slurm):
    # the sampled CPU time misses at most the tail after the last sample and the whole-second rounding.
    burnt = float(wait_for(lambda: CPU.findall(slurm.job_output(job)), 30, "the burner's own CPU time")[0])
    assert burnt - 1.5 <= event["cpu_seconds"] <= burnt + 1.0, (event["cpu_seconds"], burnt)
    assert event["cpu_eff"] == pytest.approx(100 * event["cpu_seconds"] / (2 * event["elapsed"]), abs=0.01)
    assert event["cpu_eff"] == pytest.approx(100 * burnt / (2 * event["elapsed"]), abs=8)
    assert event["cpu_eff"] <= 55
    assert 256 * MIB <= event["mem_peak"] < 400 * MIB and event["max_rss_node"] == slurm.node_name
    assert "mem_overrequested" in event["flags"] and "no_samples" not in event["flags"]
    assert (
        reference["user"] == "root"
        and reference["scheduler"] == "slurm"
        and reference["flag_mem_overrequested"]
    )
    assert victim.running() and ref.running()
