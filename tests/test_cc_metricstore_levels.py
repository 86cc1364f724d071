"""Node-level values where ClusterCockpit's metric store keeps them (issue 19, section 1).

The metric store (cc-backend `pkg/metricstore/lineprotocol.go`, what cc-metric-store 1.5 runs) skips the word
`node` but appends any `type-id` to the selector below the host, so `type=node,type-id=0` landed under a
child `0` beside `hwthread0`, `hwthread1`, and a node-level query (the host, no type) averaged the node's own
value with the hwthreads'. Every path that puts lines on `<cluster>.metrics` is decoded here with those rules
(`tests.metricstore`): the node agent (a 2-hwthread fixture tree and this machine's /proc), Sonar -> LP of a
corpus sample, lines posted through the gateway, and `consume ingest` forwarding. No node-level line may land
below the host, except a device, job or process at `<stype>` / `<stype><stype-id>`; a node-level query returns
the node's own value.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import nats
import pytest
from line_protocol_parser import parse_line

from hpcbus.bus import round_trip
from hpcbus.producers.node import NodeCollector, NodeCollectorConfig
from hpcbus.producers.node.jobs import JobOptions
from hpcbus.producers.node.pipeline import AgentConfig, Pipeline
from hpcbus.schemas import subjects
from hpcbus.schemas.lineprotocol import Line, format_line
from hpcbus.schemas.sonar import decode_envelope
from hpcbus.schemas.translate import envelope_payloads
from tests.consumer_helpers import Process, Worker, wait_for
from tests.corpus import CORPUS
from tests.metricstore import MetricStore
from tests.node_fixtures import FIX
from tests.services import NatsServer
from tests.test_gateway import start_gateway, stored

HOST = "c1-10"
CPU = ("cpu_user", "cpu_system", "cpu_idle", "cpu_iowait", "cpu_used")


def node_lines(payloads: list[bytes]) -> list[dict]:
    """Every `type=node` metric line of the payloads, parsed."""
    out = []
    for p in payloads:
        for raw in p.decode().splitlines():
            if raw and not raw.startswith("#"):
                d = parse_line(raw)
                if d["tags"].get("type") == "node" and "value" in d["fields"]:
                    out.append(d)
    return out


def assert_node_level_at_host(payloads: list[bytes], store: MetricStore) -> int:
    """No node-level line is stored below its host, except a device/job/process at `<stype>/<stype><id>`;
    the number of node-level lines checked."""
    lines = node_lines(payloads)
    assert lines
    for d in lines:
        tags = d["tags"]
        path = store.path_of(tags)
        where = (tags.get("cluster", store.cluster), tags["hostname"])
        if "stype" in tags:
            stype = tags["stype"]
            assert path == (*where, stype, stype + tags.get("stype-id", "")), (d, path)
        else:
            assert path == where, (d, path)
    return len(lines)


def old_form(payloads: list[bytes]) -> list[bytes]:
    """The same lines as hpcbus sent them before: every node-level metric line `type=node,type-id=0`."""
    out = []
    for p in payloads:
        rows = []
        for raw in p.decode().splitlines():
            d = parse_line(raw)
            if d["tags"].get("type") == "node":
                d["tags"]["type-id"] = "0"
                raw = format_line(Line(d["measurement"], d["tags"], d["fields"], d["time"]))
            rows.append(raw)
        out.append(("\n".join(rows) + "\n").encode())
    return out


def agent_payloads(collector: NodeCollector, later: Path | None, root: Path | None) -> list[bytes]:
    """What `produce node` publishes on `<cluster>.metrics` for a second reading (CPU % need two)."""
    pipeline = Pipeline("fox", HOST, AgentConfig(cpu_fields=[c[4:] for c in CPU]))  # type: ignore[misc]
    first = collector.collect()
    if later is not None and root is not None:
        shutil.copytree(later, root, dirs_exist_ok=True)
    if later is None:  # this machine: CPU % need the counters to move between the readings (not always
        # so on an idle machine within the same clock tick): wait for that state, bounded
        deadline = time.monotonic() + 10
        before = Path("/proc/stat").read_text().splitlines()[0]
        while Path("/proc/stat").read_text().splitlines()[0] == before and time.monotonic() < deadline:
            time.sleep(0.01)
    second = collector.collect() if later is None else collector.collect(now=first.time + 30.0)
    return [m.payload for m in pipeline.sample_messages(second, 1 << 20) if m.subject == "fox.metrics"]


def node_value(payloads: list[bytes], measurement: str) -> tuple[float, int]:
    [d] = [d for d in node_lines(payloads) if d["measurement"] == measurement and "stype" not in d["tags"]]
    return d["fields"]["value"], d["time"]


def test_node_agent_two_hwthreads_node_query_returns_the_node_value(tmp_path: Path) -> None:
    root = tmp_path / "vm"
    shutil.copytree(FIX / "vm", root)
    collector = NodeCollector(NodeCollectorConfig(root=str(root), gpus=False, jobs=JobOptions(min_uid=0)))
    payloads = agent_payloads(collector, FIX / "vm-later", root)
    store = MetricStore(cluster="fox").decode_all(payloads)
    assert assert_node_level_at_host(payloads, store) > 20
    hw = [
        store.read("fox", HOST, "cpu_user", node_value(payloads, "cpu_user")[1], f"hwthread{i}")
        for i in (0, 1)
    ]
    assert None not in hw
    for name in CPU:
        value, ts = node_value(payloads, name)
        assert store.read("fox", HOST, name, ts) == value
    # what the store made of the same sample before: the node value averaged with the two hwthreads'
    before = MetricStore(cluster="fox").decode_all(old_form(payloads))
    value, ts = node_value(payloads, "cpu_user")
    assert before.read("fox", HOST, "cpu_user", ts) == pytest.approx((value + sum(hw)) / 3)  # type: ignore[arg-type]
    assert before.read("fox", HOST, "cpu_user", ts) != value


def test_node_agent_on_this_machine() -> None:
    collector = NodeCollector(NodeCollectorConfig(gpus=False, jobs=JobOptions(min_uid=0)))
    payloads = agent_payloads(collector, None, None)
    store = MetricStore(cluster="fox").decode_all(payloads)
    assert_node_level_at_host(payloads, store)
    for name in CPU:
        value, ts = node_value(payloads, name)
        assert store.read("fox", HOST, name, ts) == value
    value, ts = node_value(payloads, "mem_used")
    assert store.read("fox", HOST, "mem_used", ts) == value
    assert ("fox", HOST, "0") not in {p[:3] for p in store.values}


def test_sonar_sample_to_lp_keeps_node_values_at_the_host_and_series_apart() -> None:
    text = (CORPUS / "sonar" / "slurmmonitor__fox_sample_slurmnode_v0.18.json").read_text()
    env = decode_envelope(text.encode())
    payloads = envelope_payloads(env)["fox.educloud.no.metrics"]
    store = MetricStore().decode_all(payloads)
    assert assert_node_level_at_host(payloads, store) > 100
    value, ts = node_value(payloads, "cpu_load")
    assert store.read("fox.educloud.no", "c1-10.fox", "cpu_load", ts) == value
    # processes, jobs and disks never overwrite each other: one stored value per line
    lines = [ln for p in payloads for ln in p.decode().splitlines()]
    assert sum(len(v) for v in store.values.values()) == len(lines)
    assert {p[2] for p in store.paths("process_rss")} == {"process"}
    assert {p[2] for p in store.paths("diskstat_reads")} == {"disk"}


@pytest.mark.services
def test_lines_posted_through_the_gateway(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    """cc-metric-collector's form with a type-id, Telegraf, Slurm's profile plugin and a typeless line."""
    _, url = start_gateway(workers, tmp_path, nats_server.url, "--cluster", cluster)
    t = int(time.time())
    body = (
        f"cpu_user,hostname=n1,type=node,type-id=0 value=27.709 {t}\n"
        f"cpu_user,hostname=n1,type=hwthread,type-id=0 value=7.589 {t}\n"
        f"cpu_user,hostname=n1,type=hwthread,type-id=1 value=20.358 {t}\n"
        f"net_bytes_in,hostname=n1,type=node,type-id=0,stype=network,stype-id=eth0 value=5i {t}\n"
        f"net_bytes_in,hostname=n1,type=node,stype=network,stype-id=ib0 value=7i {t}\n"
        f"mem,host=n1 used=3i,free=4i {t}\n"
        f"RSS,job=7,step=-5,task=0,host=n1 value=100 {t}\n"
        f"load_one,hostname=n1 value=1.5 {t}\n"
    ).encode()
    from tests.test_gateway import http

    assert http(f"{url}/write?db=x&precision=s", body).status == 204
    payloads = wait_for(
        lambda: [p for s, p, _ in stored(nats_server.url, cluster) if s == subjects.metrics(cluster)],
        20,
        "the lines on .metrics",
    )
    store = MetricStore(cluster=cluster).decode_all(payloads)
    assert assert_node_level_at_host(payloads, store) == 7
    assert store.read(cluster, "n1", "cpu_user", t) == 27.709  # was (27.709 + 7.589 + 20.358) / 3
    assert store.read(cluster, "n1", "net_bytes_in", t, "network", "networketh0") == 5
    assert store.read(cluster, "n1", "net_bytes_in", t, "network", "networkib0") == 7
    for name, value in (("mem_used", 3), ("mem_free", 4), ("slurm_rss", 100), ("load_one", 1.5)):
        assert store.read(cluster, "n1", name, t) == value


@pytest.mark.services
def test_telegraf_devices_through_the_gateway_are_children_of_the_host(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    """Issue 32: Telegraf's per-device lines (as its `cpu`, `net`, `diskio`, `disk` and `mem` inputs write them,
    nanosecond timestamps, no precision: Telegraf's `[[outputs.influxdb]]`) kept the device in a `cpu=` /
    `interface=` tag the metric store ignores, so the host held whichever came last (usage_idle 10, not
    cpu-total's 50) and had no children. Now the host holds cpu-total's value, each CPU is a hwthread and
    each interface and disk a child below the host, as the node agent writes its own."""
    from tests.test_gateway import http

    _, url = start_gateway(workers, tmp_path, nats_server.url, "--cluster", cluster)
    t = int(time.time())
    ns = t * 10**9
    body = (
        f"cpu,cpu=cpu-total,host=tg1 usage_idle=50,usage_user=40 {ns}\n"
        f"cpu,cpu=cpu0,host=tg1 usage_idle=90,usage_user=5 {ns}\n"
        f"cpu,cpu=cpu1,host=tg1 usage_idle=10,usage_user=75 {ns}\n"
        f"net,host=tg1,interface=eth0 bytes_recv=1000i,bytes_sent=10i {ns}\n"
        f"net,host=tg1,interface=ib0 bytes_recv=7000i,bytes_sent=70i {ns}\n"
        f"net,host=tg1,interface=all tcp_activeopens=3i {ns}\n"
        f"diskio,host=tg1,name=sda reads=11i,writes=1i {ns}\n"
        f"diskio,host=tg1,name=nvme0n1 reads=22i,writes=2i {ns}\n"
        f"disk,device=sda1,fstype=ext4,host=tg1,mode=rw,path=/ used_percent=40.5 {ns}\n"
        f"disk,device=nvme0n1p1,fstype=xfs,host=tg1,mode=rw,path=/scratch used_percent=80.5 {ns}\n"
        f"mem,host=tg1 used=3000i,available=5000i {ns}\n"
        # Slurm's profile plugin on the same node: two tasks of a job, and the node's energy
        f"RSS,job=17,step=0,task=0,host=tg1 value=100 {ns}\n"
        f"RSS,job=17,step=0,task=1,host=tg1 value=300 {ns}\n"
        f"Power,job=17,step=0,task=Energy,host=tg1 value=250 {ns}\n"
    ).encode()
    answer = http(f"{url}/write?db=telegraf", body)
    assert answer.status == 204, answer.body
    payloads = wait_for(
        lambda: [p for s, p, _ in stored(nats_server.url, cluster) if s == subjects.metrics(cluster)],
        20,
        "the lines on .metrics",
    )
    store = MetricStore(cluster=cluster).decode_all(payloads)
    host = (cluster, "tg1")
    assert store.read(*host, "cpu_usage_idle", t) == 50  # cpu-total's, not the last CPU's
    assert store.read(*host, "cpu_usage_user", t) == 40
    assert store.paths("cpu_usage_idle") == {host, (*host, "hwthread0"), (*host, "hwthread1")}
    assert store.read(*host, "cpu_usage_idle", t, "hwthread0") == 90
    assert store.read(*host, "cpu_usage_idle", t, "hwthread1") == 10
    assert store.paths("net_bytes_recv") == {
        (*host, "network", "networketh0"),
        (*host, "network", "networkib0"),
    }
    assert store.read(*host, "net_bytes_recv", t, "network", "networketh0") == 1000
    assert store.read(*host, "net_bytes_recv", t, "network", "networkib0") == 7000
    assert store.read(*host, "net_tcp_activeopens", t) == 3  # `interface=all`: the node's own counters
    assert store.paths("diskio_reads") == {(*host, "disk", "disksda"), (*host, "disk", "disknvme0n1")}
    assert store.read(*host, "diskio_reads", t, "disk", "disknvme0n1") == 22
    assert store.paths("disk_used_percent") == {
        (*host, "filesystem", "filesystem/"),
        (*host, "filesystem", "filesystem/scratch"),
    }
    assert store.read(*host, "mem_used", t) == 3000 and store.paths("mem_used") == {host}
    assert store.paths("slurm_rss") == {(*host, "task", "task17.0.0"), (*host, "task", "task17.0.1")}
    assert store.read(*host, "slurm_rss", t, "task", "task17.0.1") == 300
    assert store.read(*host, "slurm_energy_power", t) == 250 and store.paths("slurm_energy_power") == {host}
    # every line its own value: nothing overwrote anything
    lines = [ln for p in payloads for ln in p.decode().splitlines()]
    assert sum(len(v) for v in store.values.values()) == len(lines) == 22
    # the interfaces and disks sit where the node agent puts its own (the same stype names)
    assert assert_node_level_at_host(payloads, store) == 18


@pytest.mark.services
def test_ingest_forwards_node_lines_in_their_bus_form(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    """An older agent's (or a collector's) `type=node,type-id=0`, sent to the ingest subject, goes on to
    `<cluster>.metrics` without the type-id; a message already in bus form goes on byte for byte."""
    w = Worker(
        ["consume", "ingest", "--nats", nats_server.url, "--cluster", cluster], tmp_path / "ingest.log"
    )
    workers.append(w)
    w.start(timeout=60)
    t = int(time.time())
    old = (
        f"cpu_user,cluster={cluster},hostname=n1,type=node,type-id=0 value=27.709 {t}\n"
        f"cpu_user,cluster={cluster},hostname=n1,type=hwthread,type-id=0 value=7.589 {t}\n"
        f"cpu_user,cluster={cluster},hostname=n1,type=hwthread,type-id=1 value=20.358 {t}\n"
    ).encode()
    new = f"mem_used,cluster={cluster},hostname=n1,type=node value=3.0 {t}\n".encode()

    async def run() -> list[bytes]:
        seen: list[bytes] = []
        nc = await nats.connect(nats_server.url)
        try:

            async def on(msg: nats.aio.msg.Msg) -> None:
                seen.append(msg.data)

            await nc.subscribe(subjects.metrics(cluster), cb=on)
            await round_trip(nc, 5)
            js = nc.jetstream()
            for payload in (old, new):
                await js.publish(
                    subjects.ingest(cluster, "n1", subjects.metrics(cluster)), payload, timeout=10
                )
            deadline = asyncio.get_running_loop().time() + 30
            while len(seen) < 2 and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.05)
            return seen
        finally:
            await nc.close()

    seen = asyncio.run(run())
    assert len(seen) == 2, w.log()
    assert seen[1] == new
    store = MetricStore().decode_all(seen)
    assert assert_node_level_at_host(seen, store) == 2
    assert store.read(cluster, "n1", "cpu_user", t) == 27.709
