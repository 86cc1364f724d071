"""Sonar's directory tree as Jobanalyzer reads it, from the real Slurm: `hpcbus produce slurm` polling the
session's Slurm, `hpcbus consume sonar --to sonar --directory DIR` on the same nats-server.

Jobanalyzer's `sonalyze` (filedb) reads only `0+sample-<host>.json`, `0+sysinfo-<host>.json`,
`0+job-slurm.json` and `0+cluzter-slurm.json` under `yyyy/mm/dd`, the day being the UTC date of the record's
time (it converts with `.UTC()` on ingest); each file holds envelopes, one JSON document per line. The Slurm
producer spells times in the zone given by `--tz`; the test picks a zone whose date differs from UTC's right
now, so a tree dated by the spelled local date would fail.

One job ends before the producer starts (its first poll, with no state file, publishes all of that job's
steps in one jobs envelope: several records per envelope), another runs while it polls (later envelopes:
several lines per file).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hpcbus.schemas.sonar import decode_envelope
from hpcbus.schemas.sonar.types import ClusterEnvelope, JobsEnvelope
from tests.consumer_helpers import Process, Worker, bus_messages, settled, wait_for
from tests.services import NatsServer, SlurmCluster
from tests.test_slurm_producer import steps_ended

pytestmark = pytest.mark.services

JOBANALYZER_NAME = re.compile(r"^\d{4}/\d{2}/\d{2}/0\+(job|cluzter)-slurm\.json$")
"""The names sonalyze globs for Slurm data (`0+job-slurm.json`, `0+cluzter-slurm.json`) under a day."""


def far_zone() -> str:
    """A `--tz` whose date is not UTC's date for the next hour: -12:00 before 11:00 UTC, +14:00 after."""
    return "-12:00" if datetime.now(UTC).hour < 11 else "+14:00"


def envelopes(tree: Path) -> dict[str, list[bytes]]:
    """Relative path -> the lines of every file in the tree."""
    if not tree.exists():
        return {}
    return {
        str(p.relative_to(tree)): p.read_bytes().splitlines(keepends=True)
        for p in sorted(tree.rglob("*"))
        if p.is_file()
    }


def job_records(tree: Path, job_id: int) -> list[tuple[str, str]]:
    """(step, state) of every record of `job_id` in the tree's jobs files."""
    out = []
    for rel, lines in envelopes(tree).items():
        if rel.endswith("/0+job-slurm.json"):
            for line in lines:
                env = decode_envelope(line, expect="job")
                assert isinstance(env, JobsEnvelope) and env.data is not None
                out += [
                    (r.job_step, r.job_state) for r in env.data.attributes.slurm_jobs if r.job_id == job_id
                ]
    return out


def test_produce_slurm_envelopes_land_in_the_files_jobanalyzer_reads(
    nats_server: NatsServer, slurm: SlurmCluster, tmp_path: Path, cluster: str, workers: list[Process]
) -> None:
    tree = tmp_path / "sonar"
    config = tmp_path / "hpcbus.toml"
    config.write_text("[delivery]\nstats_seconds = 3600.0\n")  # no self-telemetry: the tree is Slurm's only
    bus = ["--nats", nats_server.url, "--cluster", cluster]
    options = ["--config", str(config), "--to", "sonar", "--grace", "1", "--directory", str(tree)]
    translator = Worker(["consume", "sonar", *bus, *options], tmp_path / "sonar.log")
    workers.append(translator)
    translator.start()

    before = slurm.sbatch(None, "--mem=50M", "-J", "hb-tree-before", wrap="srun true")
    slurm.wait_job(before)
    # slurmdbd gets the steps' ends after the job's: the first poll must find all three rows final.
    wait_for(lambda: steps_ended(slurm, [before]), 60, lambda: f"the steps of {before} in sacct")
    zone = far_zone()
    producer = Worker(
        [
            "produce",
            "slurm",
            *bus,
            "--interval",
            "1",
            f"--tz={zone}",
            "--state-file",
            str(tmp_path / "state"),
        ],
        tmp_path / "slurm.log",
        env=slurm.env(),
    )
    workers.append(producer)
    producer.start(ready=None)

    def logs() -> str:
        return f"{producer.log()}\n{translator.log()}"

    def records(job_id: int) -> list[tuple[str, str]]:
        assert producer.running() and translator.running(), logs()  # fail at once, not at the timeout
        return job_records(tree, job_id)

    # The job that ended before the first poll: all its steps, in one envelope.
    wait_for(lambda: {step for step, _ in records(before)} >= {"", "batch", "0"}, 60, logs)
    during = slurm.sbatch(None, "--mem=50M", "-J", "hb-tree-during", wrap="srun sleep 1")
    wait_for(lambda: ("", "COMPLETED") in records(during), 60, logs)
    wait_for(lambda: settled(nats_server.url, cluster, "hpcbus-sonar-to-sonar"), 20, logs)
    producer.terminate()
    translator.terminate()

    files = envelopes(tree)
    # Only the names Jobanalyzer reads, and the cluster envelope's file among them.
    assert all(JOBANALYZER_NAME.match(rel) for rel in files), sorted(files)
    assert any(rel.endswith("/0+cluzter-slurm.json") for rel in files), sorted(files)
    # Every line is a whole envelope (line-delimited JSON), in the file of its kind and of its UTC day.
    for rel, lines in files.items():
        kind = "job" if rel.endswith("/0+job-slurm.json") else "cluster"
        for line in lines:
            assert line.endswith(b"\n") and line.count(b"\n") == 1
            env = decode_envelope(line, expect=kind)
            assert isinstance(env, JobsEnvelope | ClusterEnvelope) and env.data is not None
            stamp = datetime.fromisoformat(env.data.attributes.time)
            assert stamp.utcoffset() == datetime.fromisoformat(f"2000-01-01T00:00:00{zone}").utcoffset()
            assert rel.startswith(stamp.astimezone(UTC).strftime("%Y/%m/%d/")), (rel, stamp)
            assert env.data.attributes.cluster == cluster
    # The files hold exactly what the translator published on <cluster>.sonar.job / .cluster, in order.
    for kind, name in (("job", "job"), ("cluster", "cluzter")):
        published = [m.data for m in bus_messages(nats_server.url, cluster, f"{cluster}.sonar.{kind}")]
        written = [
            line.rstrip(b"\n") for rel, lines in files.items() if f"/0+{name}-" in rel for line in lines
        ]
        assert published and written == published, kind
    # Several records per envelope (the first poll's), several envelopes per file (the later polls').
    jobs = [line for rel, lines in files.items() if rel.endswith("/0+job-slurm.json") for line in lines]
    assert len(jobs) >= 2
    sizes = [
        sum(r.job_id == before for r in env.data.attributes.slurm_jobs)
        for env in (decode_envelope(line, expect="job") for line in jobs)
        if isinstance(env, JobsEnvelope) and env.data is not None
    ]
    # "", batch and step 0 all there, several of them in one envelope (which poll sees which step's end
    # depends on when slurmdbd has it, to the second of the sacct window's end).
    assert sum(sizes) >= 3 and max(sizes) >= 2, sizes
    assert {("", "COMPLETED"), ("0", "COMPLETED")} <= set(job_records(tree, during))
