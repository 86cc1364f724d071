"""The soak harness (`make soak`, bench/soak.py) end to end at a small size, so that CI keeps it working: the
real nats-server, InfluxDB, `consume influx` and `consume jobs`, 300 jobs. Its table must say that nothing
was refused and no summary is stuck, and every row must carry a value (a query or a report that failed says
so in its row, a counter the workers did not report says `missing`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.consumer_helpers import ROOT

pytestmark = pytest.mark.services

JOBS = 300


def table(output: str) -> dict[str, str]:
    """The harness's table: row name -> value (two or more spaces apart), the header line left out."""
    rows: dict[str, str] = {}
    for line in output.splitlines()[1:]:
        name, _, value = re.split(r"(\s{2,})", line.strip(), maxsplit=1) if "  " in line else (line, "", "")
        rows[name.strip()] = value.strip()
    return rows


def test_a_small_soak_refuses_nothing_and_leaves_no_summary_stuck(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.soak", str(JOBS)],
        capture_output=True,
        text=True,
        cwd=tmp_path,  # nothing may be written into the current directory
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=600,
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-4000:]}"
    assert done.stdout.startswith(f"hpcbus soak: {JOBS:,} jobs"), done.stdout
    rows = table(done.stdout)
    assert rows["refused"] == "0" and rows["stuck"] == "0", done.stdout
    assert rows["summaries"] == rows["job_summary points"] == f"{JOBS:,}", done.stdout
    empty = [name for name, value in rows.items() if not value or value.startswith(("failed", "missing"))]
    assert not empty, f"rows without a value: {empty}\n{done.stdout}"
    names = " ".join(rows)
    for expected in (
        "series job_processes",
        "series job_summary",
        "influxd RSS",
        "influxd disk",
        "jobs worker RSS",
        "jobs worker state file",
        "(recent)",
        "(old)",
        "job-list Finished jobs",
        "job-detail Job summary",
    ):
        assert expected in names, (expected, done.stdout)
    assert list(tmp_path.iterdir()) == []
