"""`hpcbus tail SUBJECT` in a pipe: each message is one line, flushed as it comes (read while the process
still runs), filtered by host, measurement or job, Sonar envelopes summarised; it never takes anything from a
durable, `--since` included; no NATS is a sentence and exit 3."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from hpcbus.commands.tail.decode import Filters, describe
from tests.consumer_helpers import ROOT, make_telemetry_stream, wait_for
from tests.corpus import CORPUS
from tests.services import NatsServer

LINE = "cpu_load,hostname={host},job={job},type=node value={v} 1700000000\n"


def test_decode_filters_and_summarises() -> None:
    two = (LINE.format(host="a", job="1", v=1) + LINE.format(host="b", job="2", v=2)).encode()
    assert describe("f.metrics", two, Filters()) == [
        "f.metrics: 2 lines, host a,b, time 2023-11-14T22:13:20Z, measurements cpu_load"
    ]
    (only_b,) = describe("f.metrics", two, Filters(hosts=frozenset({"b"})))
    assert only_b == "f.metrics: " + LINE.format(host="b", job="2", v=2.0).strip()
    assert describe("f.metrics", two, Filters(jobs=frozenset({"1"})))[0].startswith(
        "f.metrics: cpu_load,hostname=a"
    )
    assert describe("f.metrics", two, Filters(measurements=frozenset({"mem_used"}))) == []
    # issue 33: a process-group job by the key `report` uses, `<job>@<epoch>`, in tags and in events
    groups = (
        b"job_processes,hostname=a,job=7,epoch=100,type=node value=1 1700000000\n"
        b"job_processes,hostname=a,job=7,epoch=200,type=node value=2 1700000000\n"
        b'nodejob,hostname=a,function=start event="{\\"jobId\\":7,\\"epoch\\":200}" 1700000000\n'
    )
    (only,) = describe("f.metrics", groups, Filters(jobs=frozenset({"7@200"})))
    assert only.startswith("f.metrics: 2 lines,") and only.endswith("measurements job_processes,nodejob"), (
        only
    )
    (every,) = describe("f.metrics", groups, Filters(jobs=frozenset({"7"})))
    assert every.startswith("f.metrics: 3 lines,"), every
    envelope = (CORPUS / "sonar" / "slurmmonitor__fox_sample_slurmnode_v0.18.json").read_bytes()
    (summary,) = describe("f.sonar.sample", envelope, Filters())
    assert summary.startswith("f.sonar.sample: sonar sample node=c1-10.fox time=") and " jobs=" in summary
    assert describe("f.sonar.sample", envelope, Filters(hosts=frozenset({"other"}))) == []
    assert describe("f.x", b"not\nline protocol at all", Filters()) == ["f.x: not\\nline protocol at all"]


def tail(url: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "hpcbus", "tail", "--nats", url, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


class Lines:
    """What a process writes to its stdout pipe, line by line, as it comes."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.got: list[str] = []
        assert proc.stdout is not None
        out = proc.stdout
        threading.Thread(target=lambda: self.got.extend(iter(out.readline, "")), daemon=True).start()


@pytest.fixture
def stream(nats_server: NatsServer, cluster: str) -> Iterator[str]:
    yield make_telemetry_stream(nats_server.url, cluster)


async def publish(url: str, subject: str, *bodies: bytes) -> None:
    nc = await nats.connect(url)
    try:
        for body in bodies:
            await nc.jetstream().publish(subject, body)
    finally:
        await nc.close()


async def consumers(url: str, stream: str) -> list[tuple[str, int, int]]:
    nc = await nats.connect(url)
    try:
        return [
            (c.name, c.num_pending or 0, c.num_ack_pending or 0)
            for c in await nc.jetstream().consumers_info(stream)
            if c.config.durable_name
        ]
    finally:
        await nc.close()


@pytest.mark.services
def test_tail_in_a_pipe_prints_each_message_as_it_comes_and_acks_nothing(
    nats_server: NatsServer, cluster: str, stream: str, tmp_path: Path
) -> None:
    url = nats_server.url
    subject = f"{cluster}.metrics"

    async def durable() -> None:  # a worker's durable with messages waiting: tail must leave them there
        nc = await nats.connect(url)
        try:
            await nc.jetstream().pull_subscribe(subject, durable="w", stream=stream)
        finally:
            await nc.close()

    asyncio.run(durable())
    asyncio.run(publish(url, subject, LINE.format(host="old", job="7", v=0).encode()))
    proc = tail(url, f"{cluster}.>", "--host", "n2", "--since", "600")
    try:
        lines = Lines(proc)
        asyncio.run(
            publish(
                url,
                subject,
                LINE.format(host="n1", job="1", v=1).encode(),
                LINE.format(host="n2", job="2", v=2).encode(),
            )
        )

        def printed() -> bool:
            if not lines.got:  # not subscribed yet when we published: again
                asyncio.run(publish(url, subject, LINE.format(host="n2", job="2", v=2).encode()))
            return bool(lines.got)

        wait_for(printed, 30, "tail to print while running")
        assert proc.poll() is None  # printed while it still runs: flushed per message
        assert all("hostname=n2" in line for line in lines.got), lines.got
        assert not any("hostname=n1" in line or "hostname=old" in line for line in lines.got)
    finally:
        proc.terminate()
        proc.wait(10)
    ((name, pending, ack_pending),) = asyncio.run(consumers(url, stream))  # no durable added
    assert name == "w" and ack_pending == 0 and pending >= 3  # nothing taken from the worker's durable

    replay = tail(url, subject, "--since", "600", "--count", "1", "--host", "old")
    out, err = replay.communicate(timeout=30)
    assert replay.returncode == 0, err
    assert out.startswith(f"{subject}: cpu_load,hostname=old,job=7"), out


def test_no_nats_is_exit_3() -> None:
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcbus",
            "tail",
            "--nats",
            "nats://127.0.0.1:1",
            "--timeout",
            "1",
            "x.metrics",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=30,
    )
    assert p.returncode == 3 and "not reachable" in p.stderr and "Traceback" not in p.stderr
