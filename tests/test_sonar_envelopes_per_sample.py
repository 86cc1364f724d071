"""One Sonar envelope per sample, end to end: the real `hpcbus produce node` and the real `hpcbus consume sonar
--to sonar --directory DIR` on a real nats-server (issue 10, part 1).

The node producer sends, per sample, a skeleton event and one metrics message holding the Sonar lines and,
after them, the ClusterCockpit lines (CPU percentages per hwthread, meminfo, network, disks, ...). Those CC
lines must never be read as a second sample: for N samples the worker publishes N envelopes, none partial,
none a follow-up, each the envelope `hpcbus produce node --once --format sonar` builds from the same readings.

Readings come from a fixture tree (constant values), except that the idle ticks of its /proc/stat advance with
the clock, as on a live node: the producer then writes CPU percentages (the lines that used to come back as a
follow-up envelope of zero `cpus`) while Sonar's busy seconds, and so the envelope, stay the same.

A cc-metric-collector stream (no skeletons) published the way its NATS sink does gives one envelope per
(host, time), whatever the messages it is split into.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcbus.schemas.sonar import decode_envelope
from hpcbus.schemas.sonar.types import SampleEnvelope
from hpcbus.schemas.translate.common import epoch_of
from tests.consumer_helpers import (
    ROOT,
    TO_SONAR,
    Process,
    ProducerProcess,
    Worker,
    bus_messages,
    raw_pub,
    settled,
    sonar_worker,
    wait_for,
)
from tests.node_fixtures import FIX, tree
from tests.services import NatsServer
from tests.test_node_producer_bus import sample_times
from tests.test_translate_ccnative import T0, collector_payload

pytestmark = pytest.mark.services

HOST = "n1"
SAMPLES = 4

_SUMMARY = re.compile(r"[;,] envelopes (\d+), partial envelopes (\d+), followup envelopes (\d+)")


@contextlib.contextmanager
def idle_ticking(root: Path) -> Iterator[None]:
    """Advance every `cpu` line's idle ticks in `root/proc/stat` (USER_HZ 100) in real time, replacing the
    file atomically: CPU percentages of 0 % busy between any two readings, busy seconds unchanged."""
    stat = root / "proc" / "stat"
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(0.1):
            out = []
            for line in stat.read_text().splitlines():
                fields = line.split()
                if fields and fields[0].startswith("cpu"):
                    fields[4] = str(int(fields[4]) + 10)
                    line = " ".join(fields)
                out.append(line)
            tmp = stat.with_name("stat.tmp")
            tmp.write_text("\n".join(out) + "\n")
            os.replace(tmp, stat)

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def to_sonar_worker(
    workers: list[Process], tmp_path: Path, url: str, cluster: str, directory: Path
) -> Worker:
    """The LP -> Sonar direction alone, writing Sonar's tree under `directory` (grace window 2 s)."""
    return sonar_worker(
        workers, tmp_path, url, cluster, "--to", "sonar", "--grace", "2", "--directory", str(directory)
    )


def counters(w: Process) -> tuple[int, int, int]:
    """(envelopes, partial, follow-up) of the worker's last summary line (it writes one when it stops)."""
    found = _SUMMARY.findall(w.log())
    assert found, w.log()
    envelopes, partial, followup = found[-1]
    return int(envelopes), int(partial), int(followup)


def stop_when_settled(w: Process, url: str, cluster: str) -> None:
    """Wait until the worker has taken and acknowledged everything stored (it acknowledges a message only after
    every envelope of it is published and written), then SIGTERM it: its summary is then final."""
    wait_for(lambda: settled(url, cluster, TO_SONAR), 30, "the LP -> Sonar worker settled")
    assert w.terminate() == 0, w.log()


def published(url: str, cluster: str) -> list[SampleEnvelope]:
    out = []
    for m in bus_messages(url, cluster, f"{cluster}.sonar.sample"):
        env = decode_envelope(m.data or b"", expect="sample")
        assert isinstance(env, SampleEnvelope)
        out.append(env)
    return out


def in_tree(directory: Path, host: str) -> list[SampleEnvelope]:
    """The sample envelopes of `host` in Sonar's directory tree (one JSON per line)."""
    out = []
    for path in sorted(directory.rglob(f"0+sample-{host}.json")):
        for line in path.read_text().splitlines():
            env = decode_envelope(line, expect="sample")
            assert isinstance(env, SampleEnvelope)
            out.append(env)
    return out


def once_envelope(root: Path, cluster: str) -> SampleEnvelope:
    """What `hpcbus produce node --once --format sonar` builds from the same tree."""
    argv = [sys.executable, "-m", "hpcbus", "produce", "node", "--once", "--format", "sonar"]
    argv += ["--cluster", cluster, "--root", str(root), "--hostname", HOST, "--settle", "0.05"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, check=True, timeout=60)
    env = decode_envelope(done.stdout, expect="sample")
    assert isinstance(env, SampleEnvelope)
    return env


def time_of(env: SampleEnvelope) -> str:
    assert env.data is not None
    return env.data.attributes.time


@pytest.mark.parametrize("case", ["hpc", "vm"])
def test_node_producer_samples_come_back_one_envelope_each(
    nats_server: NatsServer, tmp_path: Path, cluster: str, workers: list[Process], case: str
) -> None:
    directory = tmp_path / "sonar-data"
    w = to_sonar_worker(workers, tmp_path, nats_server.url, cluster, directory)
    root = tree(tmp_path, case)
    producer = ProducerProcess(
        tmp_path,
        nats_server.url,
        cluster,
        ["produce", "node", "--root", str(root), "--interval", "1", "--hostname", HOST],
    )
    skeletons = f"{cluster}.events.sample"
    with idle_ticking(root):
        producer.start()
        try:
            msgs = producer.wait(
                f"{SAMPLES} samples with CPU percentages",
                lambda ms: (
                    sum(s == skeletons for s, _, _ in ms) >= SAMPLES
                    and any(
                        s == f"{cluster}.metrics" and b"cpu_user," in p and b"type=hwthread" in p
                        for s, p, _ in ms
                    )
                ),
            )
        finally:
            assert producer.stop() == 0, producer.log()
    # The CC lines are on the bus, in the same messages as the Sonar lines they must not be confused with.
    assert any(s == f"{cluster}.metrics" and b"cpu_user," in p for s, p, _ in msgs)
    times = sample_times(bus_messages(nats_server.url, cluster), cluster)
    n = len(times)
    assert n >= SAMPLES and len(set(times)) == n

    stop_when_settled(w, nats_server.url, cluster)
    sysinfos = len(bus_messages(nats_server.url, cluster, f"{cluster}.sonar.sysinfo"))
    assert counters(w) == (n + sysinfos, 0, 0)  # N samples: N envelopes, no partial, no follow-up

    envs = published(nats_server.url, cluster)
    assert sorted(epoch_of(time_of(e)) for e in envs) == sorted(times)
    files = in_tree(directory, HOST)
    assert sorted(map(repr, files)) == sorted(map(repr, envs))  # the tree holds exactly what was published
    want = once_envelope(FIX / case, cluster)
    assert want.meta.attrs == []  # the producer's own meta, not `translated-from`
    for env in envs:
        assert env.data is not None and want.data is not None
        env.data.attributes.time = want.data.attributes.time
        assert env == want  # field by field, apart from the time


def test_collector_stream_gives_one_envelope_per_host_and_time(
    nats_server: NatsServer, tmp_path: Path, cluster: str, workers: list[Process]
) -> None:
    """cc-metric-collector's NATS sink publishes core NATS messages of line protocol, a tick's lines possibly
    in several messages; without skeletons every (host, time) is one envelope built from the tags."""
    directory = tmp_path / "sonar-data"
    w = to_sonar_worker(workers, tmp_path, nats_server.url, cluster, directory)
    ticks = [(T0, 50.0, 10.0), (T0 + 10, 25.0, 5.0), (T0 + 20, 25.0, 5.0)]
    hosts = ["node01", "node02"]
    for t, user, system in ticks:
        for host in hosts:
            lines = (
                collector_payload(t, user, system)
                .replace("cluster=testcluster", f"cluster={cluster}")
                .replace("hostname=node01", f"hostname={host}")
                .splitlines()
            )
            third = len(lines) // 3
            for part in (lines[:third], lines[third : 2 * third], lines[2 * third :]):
                raw_pub(nats_server.port, f"{cluster}.metrics", ("\n".join(part) + "\n").encode())
    wait_for(
        lambda: (
            len(bus_messages(nats_server.url, cluster, f"{cluster}.metrics")) == 3 * len(ticks) * len(hosts)
        ),
        10,
        "the collector's messages stored",
    )
    stop_when_settled(w, nats_server.url, cluster)
    envelopes, _partial, followup = counters(w)  # partial: built without a skeleton, as every CC envelope
    assert (envelopes, followup) == (len(ticks) * len(hosts), 0)

    envs = published(nats_server.url, cluster)
    keys = sorted((e.data.attributes.node, epoch_of(time_of(e))) for e in envs if e.data is not None)
    assert keys == sorted((h, t) for t, _, _ in ticks for h in hosts)
    for host in hosts:
        mine = sorted((e for e in envs if e.data is not None and e.data.attributes.node == host), key=time_of)
        assert [e.meta.attrs[0].value for e in mine] == ["line-protocol"] * len(ticks)
        # busy seconds integrated per host from the percentages: (25 + 5) % of 10 s per interval
        assert [e.data.attributes.system.cpus for e in mine if e.data is not None] == [
            [0, 0, 0, 0],
            [3, 3, 3, 3],
            [6, 6, 6, 6],
        ]
        assert sorted(map(repr, in_tree(directory, host))) == sorted(map(repr, mine))
