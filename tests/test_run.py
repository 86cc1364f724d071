"""`hpcbus run` (what `make run` starts): services, producer and consumer together; data lands in InfluxDB."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

from hpcbus.schemas.sonar import decode_envelope
from hpcbus.schemas.sonar.types import SampleEnvelope
from tests.consumer_helpers import ROOT, Worker, wait_for

pytestmark = pytest.mark.services


def influxql(url: str, q: str) -> dict:
    query = urllib.parse.urlencode({"db": "hpcbus", "q": q})
    with urllib.request.urlopen(f"{url}/query?{query}", timeout=5) as resp:
        return json.loads(resp.read())


def sample_files(tree: Path, host: str) -> list[tuple[Path, list[SampleEnvelope]]]:
    """Each `yyyy/mm/dd/0+sample-<host>.json` under `tree` with the envelopes of its complete lines."""
    out = []
    for path in sorted(tree.glob(f"*/*/*/0+sample-{host}.json")):
        lines = path.read_bytes().splitlines(keepends=True)
        envs = [decode_envelope(line, expect="sample") for line in lines if line.endswith(b"\n")]
        out.append((path, [env for env in envs if isinstance(env, SampleEnvelope)]))
    return out


def test_run_starts_the_pipeline_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    var = (tmp_path / "var").resolve()
    run = Worker(["run", "--var", str(var), "--interval", "1"], tmp_path / "run.log")
    try:
        text = run.start(ready="hpcbus is running", timeout=60).log()
        influx_url = re.search(r"InfluxDB 1\.x\s+(\S+)", text).group(1)  # type: ignore[union-attr]
        nats_url = re.search(r"NATS \(JetStream\)\s+(\S+)", text).group(1)  # type: ignore[union-attr]
        host = re.search(r"node producer\s+this host \((\S+)\)", text).group(1)  # type: ignore[union-attr]
        assert f"hpcbus pub -s {nats_url} local.metrics" in text  # what is installed (full path off PATH)
        # The Sonar translator runs too, and the banner says where its tree is.
        assert f"Sonar's directory tree (what Jobanalyzer reads): {var / 'sonar'}\n" in text
        # The jobs worker runs too; the banner says where the dashboards are and how to get a job's report.
        grafana = ROOT / "deploy" / "grafana"
        assert f"Grafana dashboards (InfluxDB data source {influx_url}, database hpcbus): {grafana}\n" in text
        # where the committed provisioning file expects the dashboards, the path the banner names
        provider = (grafana / "provisioning" / "dashboards" / "hpcbus.yaml").read_text()
        (path,) = re.findall(r'path: "([^"]+)"', provider)
        assert f"  dashboards/*.json                    -> {path}\n" in text
        assert f"hpcbus report --job JOB --influx-url {influx_url} --db hpcbus\n" in text
        assert "[jobs worker] " in run.wait_log("[jobs worker] ", timeout=60)  # each worker names itself
        assert "FROM job_summary" in text
        run.wait_log("durable hpcbus-jobs)", timeout=60)
        wait_for(lambda: (var / "jobs.state").exists(), 30, "the jobs worker's state file")

        def samples() -> list[tuple[Path, list[SampleEnvelope]]]:
            return [(path, envs) for path, envs in sample_files(var / "sonar", host) if envs]

        found = wait_for(samples, 60, lambda: f"a sample envelope under var/sonar:\n{run.log()}")
        for path, envs in found:
            for env in envs:  # in the file of its node, in the directory of its UTC day
                assert env.data is not None and env.data.attributes.node == host
                day = datetime.fromisoformat(env.data.attributes.time).astimezone(UTC)
                assert path.relative_to(var / "sonar") == Path(f"{day:%Y/%m/%d}/0+sample-{host}.json")

        def node_series() -> list:
            try:
                answer = influxql(influx_url, 'SELECT last("value") FROM "mem_used" GROUP BY "hostname"')
            except OSError:
                return []
            return answer["results"][0].get("series", [])

        series = wait_for(node_series, 60, lambda: f"mem_used from the node producer:\n{run.log()}")
        assert series[0]["tags"]["hostname"]
        # The printed injection command works (hpcbus pub takes the same arguments as nats pub).
        subprocess.run(
            [
                sys.executable,
                "-m",
                "hpcbus",
                "pub",
                "-s",
                nats_url,
                "local.metrics",
                f"injected,hostname=test01,type=node value=42 {int(time.time())}",
            ],
            check=True,
            cwd=ROOT,
        )
        wait_for(
            lambda: influxql(influx_url, 'SELECT * FROM "injected"')["results"][0].get("series"),
            30,
            "the injected line",
        )
    finally:
        run.signal(signal.SIGINT)  # Ctrl-C (a no-op when it has already exited)
        interrupted = time.monotonic()
        code = run.wait(60)
        stopped = time.monotonic() - interrupted
    text = run.log()
    assert code == 0, text
    assert "stopped cleanly" in text
    assert "hpcbus.run: stopped" in text
    # Every worker (the Sonar translator too) stopped on its own: none had to be killed, and all of it,
    # services included, within the workers' 5 s promise plus the services' own stop.
    assert "did not stop in time" not in text and " exited with status " not in text, text
    assert stopped < 15, f"{stopped:.1f} s after Ctrl-C\n{text}"
