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
from pathlib import Path

import pytest

from tests.consumer_helpers import ROOT, Worker, wait_for

pytestmark = pytest.mark.services


def influxql(url: str, q: str) -> dict:
    query = urllib.parse.urlencode({"db": "hpcbus", "q": q})
    with urllib.request.urlopen(f"{url}/query?{query}", timeout=5) as resp:
        return json.loads(resp.read())


def test_run_starts_the_pipeline_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    run = Worker(["run", "--var", str(tmp_path / "var"), "--interval", "1"], tmp_path / "run.log")
    try:
        text = run.start(ready="hpcbus is running", timeout=60).log()
        influx_url = re.search(r"InfluxDB 1\.x\s+(\S+)", text).group(1)  # type: ignore[union-attr]
        nats_url = re.search(r"NATS \(JetStream\)\s+(\S+)", text).group(1)  # type: ignore[union-attr]
        assert f"nats pub -s {nats_url} local.metrics" in text

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
        code = run.wait(60)
    text = run.log()
    assert code == 0, text
    assert "stopped cleanly" in text
    assert "hpcbus.run: stopped" in text
