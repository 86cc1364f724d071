"""The node collector on a real Slurm node: a job's processes are found through their `slurmstepd` ancestor
(proctrack/linuxproc, no cgroups) and reported as one Slurm job with its id, step and epoch 0."""

from __future__ import annotations

import time

import pytest

from hpcbus.producers.node.collector import NodeCollector, NodeCollectorConfig
from hpcbus.producers.node.jobs import JobOptions, JobStarted
from tests.consumer_helpers import wait_for
from tests.services import SlurmCluster

pytestmark = pytest.mark.services


def test_srun_sleep_appears_as_its_slurm_job_and_step(slurm: SlurmCluster) -> None:
    collector = NodeCollector(NodeCollectorConfig(jobs=JobOptions(min_uid=0)))  # test jobs run as root
    collector.collect(time.time())  # the job is not there yet: its appearance is a start
    job_id = slurm.sbatch(wrap="srun sleep 60")
    started: list[JobStarted] = []
    try:
        slurm.wait_job(job_id, states=("RUNNING",), timeout=60)

        def job_with_sleep() -> object:
            sample = collector.collect(time.time())
            started.extend(e for e in sample.job_events if isinstance(e, JobStarted))
            for job in sample.jobs:
                if job.job == job_id and any(p.cmd == "sleep" for p in job.processes):
                    return job
            return None

        job = wait_for(job_with_sleep, 30, f"job {job_id} with its sleep in the sample")
        assert job.slurm and job.epoch == 0
        (sleep,) = [p for p in job.processes if p.cmd == "sleep"]
        assert (sleep.job, sleep.step) == (job_id, "0")  # the srun step, not the batch script
        assert [(e.job, e.slurm, e.epoch) for e in started if e.job == job_id] == [(job_id, True, 0)]
    finally:
        slurm.run("scancel", str(job_id), check=False)
        collector.close()
