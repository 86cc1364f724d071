"""`hpcbus produce node`, without NATS: fixture trees -> Sonar envelope -> lines, with units and types pinned;
job events as cc-backend payloads; control requests; `--once` through `hpcbus.cli.main` and `hpcbus validate`.

The bus half (control over a real nats-server, an outage, SIGTERM) is in test_node_producer_bus.py.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import msgspec
import pytest

from hpcbus import cli
from hpcbus.producers.node import NodeCollector, NodeCollectorConfig
from hpcbus.producers.node._io import page_size
from hpcbus.producers.node.cc_jobs import JobEvents
from hpcbus.producers.node.cc_lines import CC_METRICS, cc_lines, markdown_table
from hpcbus.producers.node.control import Control, Setting, float_in
from hpcbus.producers.node.jobs import JobEnded, JobOptions, JobStarted
from hpcbus.producers.node.pipeline import AgentConfig, Pipeline
from hpcbus.producers.node.sysinfo import SysinfoReader
from hpcbus.producers.node.to_sonar import sample_envelope, sonar_time, sysinfo_envelope, utc_time
from hpcbus.schemas.ccbackend import StartJob, StopJob
from hpcbus.schemas.lineprotocol import Line, format_lines, parse_payload
from hpcbus.schemas.nodejob import NodeJob
from hpcbus.schemas.sonar.validate import decode_envelope, encode_envelope, validate_envelope
from hpcbus.schemas.translate import REGISTRY, Assembler, msg_id
from tests.test_node_gpu_nvml import Card, FakeNvml

FIX = Path(__file__).parent / "fixtures" / "node"
BTIME = 1795305053  # btime of the slurm-* trees
HPC_T0, HPC_T1 = 1768400000.0, 1768400010.0
CLUSTER = "fox.educloud.no"


@pytest.fixture(autouse=True)
def oslo_time(monkeypatch):
    """Sonar writes local time with its offset; pin the zone so the strings are testable."""
    monkeypatch.setenv("TZ", "Europe/Oslo")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def tree(tmp_path: Path, case: str) -> Path:
    root = tmp_path / case
    shutil.copytree(FIX / case, root)
    return root


def hpc_sample(tmp_path: Path, **kw):
    root = tree(tmp_path, "hpc")
    kw.setdefault("gpus", False)
    c = NodeCollector(NodeCollectorConfig(root=str(root), **kw))
    first = c.collect(now=HPC_T0)
    shutil.copytree(FIX / "hpc-later", root, dirs_exist_ok=True)
    return first, c.collect(now=HPC_T1)


def by_key(lines: list[Line]) -> dict[tuple[str, str, str, str], Line]:
    """(measurement, type, type-id, stype-id) -> line; asserts the key is unique per sample."""
    out: dict[tuple[str, str, str, str], Line] = {}
    for line in lines:
        t = line.tags
        key = (line.measurement, t.get("type", ""), t.get("type-id", ""), t.get("stype-id", ""))
        assert key not in out, f"two lines for {key}"
        out[key] = line
    return out


def value(lines: dict, name: str, type_: str = "node", type_id: str = "0", stype_id: str = ""):
    """A line's value; a node-level one by measurement and stype-id (its type-id is none or its `stype`)."""
    if type_ == "node":
        [line] = [ln for (n, t, _, s), ln in lines.items() if n == name and t == "node" and s == stype_id]
        return line.fields["value"]
    return lines[(name, type_, type_id, stype_id)].fields["value"]


# --- Sonar envelope -------------------------------------------------------------------------------------


def test_sample_envelope_system_part_follows_sonar(tmp_path):
    _, s = hpc_sample(tmp_path)
    env = sample_envelope(s, CLUSTER)
    assert validate_envelope(env) == []
    assert env.meta.producer == "hpcbus" and env.meta.version
    a = env.data.attributes
    assert a.time == "2026-01-14T15:13:30+01:00"  # local time with its offset, never Z
    assert (a.cluster, a.node) == (CLUSTER, "c1-10")
    sy = a.system
    assert sy.boot == "2026-01-14T11:39:00+00:00"  # UTC
    assert sy.cpus == [5223, 5223, 5223, 5223, 5215, 5215, 5215, 5215]  # busy seconds since boot
    assert sy.used_memory == 196608000 - 26643940  # KiB, MemTotal - MemAvailable
    assert (sy.load1, sy.load5, sy.load15) == (4.12, 3.98, 3.5)
    assert (sy.runnable_entities, sy.existing_entities) == (9, 1850)
    assert [(d.name, len(d.stats)) for d in sy.disks] == [("sda", 17), ("nvme0n1", 17), ("dm-0", 17)]
    assert a.errors == [] and a.jobs == []
    # and it survives the strict decoder as JSON, as `--format sonar` prints it
    assert decode_envelope(encode_envelope(env), expect="sample") == env


def test_jobs_and_processes_in_sonar_units(tmp_path):
    root = tree(tmp_path, "slurm-cgroup-v2")
    io = root / "proc" / "2011" / "io"
    io.write_text(io.read_text().replace("read_bytes: 8192", "read_bytes: 1025"))  # 1025 B -> 2 KiB (up)
    c = NodeCollector(NodeCollectorConfig(root=str(root), gpus=False, jobs=JobOptions(min_uid=0)))
    c.collect(now=BTIME + 800.0)
    stat = root / "proc" / "2010" / "stat"
    head, _, tail = stat.read_text().rpartition(") ")
    f = tail.split(" ")
    f[11] = str(int(f[11]) + 500)  # 5 s more user time in a 10 s interval
    stat.write_text(head + ") " + " ".join(f))
    s = c.collect(now=BTIME + 810.0)
    env = sample_envelope(s, CLUSTER, node="c1-10")
    assert validate_envelope(env) == []
    jobs = {(j.job, j.epoch): j for j in env.data.attributes.jobs}
    slurm = jobs[(1392969, 0)]  # Slurm job: epoch 0 (omitted on the wire)
    procs = {p.pid: p for p in slurm.processes}
    kib = page_size() // 1024
    p = procs[2011]
    assert p.resident_memory == (2000 - 500) * kib  # RssAnon = statm resident - shared, KiB
    assert p.virtual_memory == 1500 * kib  # data + stack, KiB
    assert p.num_threads == 10  # 11 threads, main one not counted
    assert p.cpu_time == 6273  # (627000 + 280) ticks = 6272.8 s, rounded half up
    assert (p.data_read, p.data_written, p.data_cancelled) == (2, 4, 0)  # KiB, rounded up
    assert p.ppid == 2001 and p.cmd == "gambit"
    assert procs[2010].cpu_util == pytest.approx(50.0)  # 5 s of CPU in 10 s
    assert procs[2010].cpu_avg == round(procs[2010].cpu_avg, 1)  # ps-style one decimal
    bash = jobs[(2030, BTIME - 1577836800)]  # process-group job: epoch = boot - 2020-01-01
    assert bash.user and bash.processes[0].pid == 2030
    raw = json.loads(encode_envelope(env))
    slurm_json = next(j for j in raw["data"]["attributes"]["jobs"] if j["job"] == 1392969)
    assert "epoch" not in slurm_json  # Sonar omits zero fields


def test_sample_lines_are_the_translators(tmp_path):
    root = tree(tmp_path, "slurm-cgroup-v2")
    c = NodeCollector(NodeCollectorConfig(root=str(root), gpus=False, jobs=JobOptions(min_uid=0)))
    s = c.collect(now=BTIME + 800.0)
    lines, sonar = Pipeline(CLUSTER, "c1-10", AgentConfig(cc_lines=False)).sample_lines(s)
    assert sonar is None
    k = by_key(lines[1:])
    assert value(k, "process_rss", stype_id="1392969/2011") == (2000 - 500) * page_size() // 1024
    assert value(k, "process_read", stype_id="1392969/2011") == 8  # int KiB
    assert value(k, "process_threads", stype_id="1392969/2011") == 10
    assert value(k, "job_processes", stype_id="1392969") == 5
    assert type(value(k, "cpu_time", "hwthread", "0")) is int  # Sonar-only counter: int
    # the skeleton announces exactly the Sonar lines; the assembler rebuilds the envelope from them
    asm = Assembler()
    (done,) = asm.add_lines(lines, now=0.0)
    assert done.complete and done.envelope == sample_envelope(s, CLUSTER, node="c1-10")
    assert lines[0].measurement == "sample" and lines[0].tags["function"] == "skeleton"


def test_gpus_in_envelope_and_cc_lines(tmp_path):
    fake = FakeNvml([Card(0, power_mw=209900, pstate=2)])
    root = tree(tmp_path, "slurm-cgroup-v2")
    c = NodeCollector(NodeCollectorConfig(root=str(root), jobs=JobOptions(min_uid=0)), nvml=fake)
    s = c.collect(now=BTIME + 800.0)
    env = sample_envelope(s, CLUSTER, node="c1-10")
    assert validate_envelope(env) == []
    (g,) = env.data.attributes.system.gpus
    assert g.uuid == "GPU-00000000-926f-e54f-9828-ad1d8680469a"
    assert g.performance_state == 3  # P2 + 1, Sonar's encoding
    assert g.power == 209 and g.power_limit == 250  # whole watts, truncated
    assert g.memory == 9731768320 // 1024  # KiB
    assert (g.ce_util, g.memory_util, g.temperature, g.fan) == (48, 17, 75, 42)
    gambit = next(p for j in env.data.attributes.jobs for p in j.processes if p.pid == 2010)
    assert [(pg.uuid, pg.gpu_memory, pg.gpu_util) for pg in gambit.gpus] == [(g.uuid, 9050112, 60.0)]
    k = by_key(cc_lines(s, CLUSTER, node="c1-10"))
    assert value(k, "nv_fb_mem_total", "accelerator", g.uuid) == 11811160064 / 1024 / 1024  # MiB
    assert value(k, "nv_energy_abs", "accelerator", g.uuid) == 123456  # J, int
    assert value(k, "nv_compute_processes", "accelerator", g.uuid) == 1
    events = JobEvents(CLUSTER, "c1-10", cc_events=True).lines(s.job_events, s.jobs)
    assert [ln.measurement for ln in events] == ["nodejob", "job"]
    start = msgspec.json.decode(events[1].fields["event"], type=StartJob)
    assert start.resources[0].accelerators == [g.uuid] and start.num_acc == 1
    seen = msgspec.json.decode(events[0].fields["event"], type=NodeJob)
    assert seen.accelerators == [g.uuid] and seen.hostname == "c1-10"
    c.close()


def test_sysinfo_envelope(tmp_path):
    fake = FakeNvml([Card(0)])
    root = tree(tmp_path, "hpc")
    c = NodeCollector(NodeCollectorConfig(root=str(root)), nvml=fake)
    info = c.sysinfo(now=HPC_T0)
    env = sysinfo_envelope(info, CLUSTER, node="c1-10")
    assert validate_envelope(env) == []
    a = env.data.attributes
    assert (a.sockets, a.cores_per_socket, a.threads_per_core) == (2, 2, 2)
    assert a.memory == 196608000 and a.node == "c1-10" and a.time == sonar_time(HPC_T0)
    (card,) = a.cards
    assert card.firmware == "12.6"  # CUDA version, what Sonar puts there
    assert (card.power_limit, card.min_power_limit, card.max_power_limit) == (250, 100, 280)
    assert card.memory == 11811160064 // 1024 and card.address == "00000000:18:00.0"
    lines, _ = Pipeline(CLUSTER, "c1-10", AgentConfig()).sysinfo_lines(info)
    assert [(ln.measurement, ln.tags["function"]) for ln in lines] == [("sysinfo", "sonar")]
    broken = msgspec.structs.replace(info, memory_kib=0)
    errors_only = sysinfo_envelope(broken, CLUSTER, node="c1-10")
    assert errors_only.data is None and "memory" in errors_only.errors[0].detail
    assert validate_envelope(errors_only) == []
    assert SysinfoReader  # the reader the collector uses for this


def test_reader_errors_become_sample_errors(tmp_path):
    root = tree(tmp_path, "hpc")
    (root / "proc" / "meminfo").write_text("garbage\n")
    s = NodeCollector(NodeCollectorConfig(root=str(root), gpus=False)).collect(now=HPC_T0)
    env = sample_envelope(s, CLUSTER)
    assert validate_envelope(env) == []
    (err,) = env.data.attributes.errors
    assert err.detail.startswith("memory:") and err.node == "c1-10" and err.time == sonar_time(HPC_T0)


def test_time_strings():
    assert sonar_time(1784000000.9) == "2026-07-14T05:33:20+02:00"  # summer time, floored second
    assert utc_time(1768390740) == "2026-01-14T11:39:00+00:00"


# --- ClusterCockpit lines --------------------------------------------------------------------------------


def test_cc_lines_values_units_and_types(tmp_path):
    first, s = hpc_sample(tmp_path)
    k = by_key(cc_lines(s, CLUSTER))
    sonar_lines = by_key(Pipeline(CLUSTER, "c1-10", AgentConfig(cc_lines=False)).sample_lines(s)[0][1:])
    assert value(sonar_lines, "mem_used") == 196608000.0 - 26643940  # kB float, CC's type for mem_used
    # CPU: percent per hwthread; node level = cpustat's sum over hwthreads (8 hwthreads here)
    assert value(k, "cpu_user", "hwthread", "0") == pytest.approx(70.0)
    assert value(k, "cpu_used", "hwthread", "4") == pytest.approx(15.0)  # 100 - idle: iowait counts
    assert value(k, "cpu_iowait", "hwthread", "4") == pytest.approx(5.0)
    assert value(k, "cpu_user") == pytest.approx(300.0)
    assert value(k, "cpu_used") == pytest.approx(420.0)
    assert value(k, "cpufreq", "hwthread", "0") == 2400.0  # MHz
    assert value(k, "mem_total") == 196608000.0  # kB, float like memstat
    assert value(k, "swap_free") == 8388000.0
    # counters are ints, their rates `_bw` floats (netstat, ibstat, lustrestat)
    assert value(k, "net_bytes_in", stype_id="eno1") == 51250000000
    assert value(k, "net_bytes_in_bw", stype_id="eno1") == pytest.approx(125e6)  # bytes/s
    assert value(k, "ib_recv_bw", stype_id="mlx5_0:1") == pytest.approx(1e9)  # bytes/s, x4 octets
    assert value(k, "lustre_read_bw", stype_id="scratch") == pytest.approx(100 * 2**20)
    assert value(k, "lustre_read_requests_rate", stype_id="scratch") == pytest.approx(25.0)
    assert value(k, "io_util", stype_id="sda") == pytest.approx(5.0)
    assert value(k, "io_read_bw", stype_id="sda") == pytest.approx(104857.6)
    # RAPL: packages are sockets, their sub-zones carry the zone name as stype-id
    assert value(k, "rapl_average_power", "socket", "0") == pytest.approx(100.0)
    assert value(k, "rapl_average_power", "socket", "0", "dram") == pytest.approx(20.0)
    assert value(k, "rapl_average_power", "socket", "1", "dram") == pytest.approx(15.0)
    kinds = {}
    for m in CC_METRICS:
        kinds[m.name] = m.kind
    for line in k.values():
        assert type(line.fields["value"]) is kinds[line.measurement], line.measurement
    # the first reading has counters but no rates and no percentages
    k0 = by_key(cc_lines(first, CLUSTER))
    assert ("net_bytes_in", "node", "network", "eno1") in k0
    assert not any(name.endswith(("_bw", "_rate")) or name.startswith("cpu_") for name, *_ in k0)


def test_cc_registry_is_consistent():
    translated = {m.name for m in REGISTRY}
    names = {m.name for m in CC_METRICS}
    assert not names & translated  # one name, one meaning: nothing the translator already writes
    for m in CC_METRICS:
        assert m.kind in (int, float) and m.unit
    table = markdown_table()
    assert all(f"`{name}`" in table for name in names)


def test_cc_lines_format_and_parse_back(tmp_path):
    _, s = hpc_sample(tmp_path)
    lines, _ = Pipeline(
        CLUSTER, "c1-10", AgentConfig(cpu_fields=["user", "steal", "guest_nice"])
    ).sample_lines(s)
    parsed = parse_payload(format_lines(lines), now=0)
    assert parsed.problems == [] and len(parsed.lines) == len(lines)
    cpu = {ln.measurement for ln in lines if ln.measurement.startswith("cpu_")}
    assert cpu - {"cpu_time", "cpu_load"} == {"cpu_user", "cpu_steal", "cpu_guest_nice"}
    with pytest.raises(msgspec.ValidationError, match="cpu_fields"):
        msgspec.convert({"cpu_fields": ["user", "usr"]}, AgentConfig)


def test_messages_routed_split_and_identified(tmp_path):
    _, s = hpc_sample(tmp_path)
    pipe = Pipeline(CLUSTER, "c1-10", AgentConfig(sonar_subjects=True))
    lines, sonar = pipe.sample_lines(s)
    msgs = pipe.messages(lines, 1 << 20, sonar=("sample", sonar))
    assert [m.subject for m in msgs] == [
        f"{CLUSTER}.events.sample",
        f"{CLUSTER}.metrics",
        f"{CLUSTER}.sonar.sample",
    ]  # one message per subject per sample
    for m in msgs:
        assert m.msg_id == msg_id(m.subject, m.payload)
    assert decode_envelope(msgs[2].payload, expect="sample").data.attributes.node == "c1-10"
    again = Pipeline(CLUSTER, "c1-10", AgentConfig(sonar_subjects=True)).messages(lines, 1 << 20)
    assert [m.msg_id for m in again] == [m.msg_id for m in msgs[:2]]  # deterministic ids
    small = pipe.messages(lines, 2000)
    metrics = [m for m in small if m.subject.endswith(".metrics")]
    assert len(metrics) > 1 and all(len(m.payload) <= 2000 for m in metrics)
    assert b"".join(m.payload for m in metrics) == msgs[1].payload  # cut at line ends, nothing lost


# --- job events ---------------------------------------------------------------------------------------------


def cc_only(lines: list[Line]) -> list[Line]:
    """cc-backend's `job` lines among a JobEvents output (the `nodejob` lines are tested on their own)."""
    return [ln for ln in lines if ln.measurement == "job"]


def test_job_events_are_cc_backend_payloads():
    ev = JobEvents(CLUSTER, "c1-10", cc_events=True)
    started = JobStarted(job=42, epoch=0, user="alice", slurm=True, time=1000.0, start_time=990.7)
    (line,) = cc_only(ev.lines([started], []))
    assert line.tags == {"cluster": CLUSTER, "hostname": "c1-10", "origin": "node", "function": "start_job"}
    assert line.time == 990
    start = msgspec.json.decode(line.fields["event"], type=StartJob)  # forbids unknown fields, as cc-backend
    assert (start.job_id, start.user, start.num_nodes, start.start_time) == (42, "alice", 1, 990)
    assert [r.hostname for r in start.resources] == ["c1-10"] and start.meta_data == {}
    # the end repeats the announced start time even if the earliest process changed meanwhile
    ended = JobEnded(
        job=42, epoch=0, user="alice", slurm=True, time=1060.0, last_seen=1030.0, start_time=995.0
    )
    (stop_line,) = cc_only(ev.lines([ended], []))
    stop = msgspec.json.decode(stop_line.fields["event"], type=StopJob)
    assert (stop.job_id, stop.start_time, stop.stop_time, stop.job_state) == (42, 990, 1060, "")
    assert stop_line.tags["function"] == "stop_job" and stop_line.time == 1060
    parsed = parse_payload(format_lines([line, stop_line]), now=0)
    assert parsed.problems == []
    # process-group jobs say which boot they belong to; jobs found at start-up can be left out
    pg = JobStarted(job=7, epoch=5, user="bob", slurm=False, time=1.0, start_time=1.0, at_startup=True)
    (pg_line,) = cc_only(ev.lines([pg], []))
    assert msgspec.json.decode(pg_line.fields["event"], type=StartJob).meta_data == {"epoch": "5"}
    assert cc_only(JobEvents(CLUSTER, "c1-10", at_startup=False, cc_events=True).lines([pg], [])) == []


def test_job_events_from_the_collector(tmp_path):
    root = tree(tmp_path, "slurm-cgroup-v2")
    c = NodeCollector(NodeCollectorConfig(root=str(root), gpus=False, jobs=JobOptions(min_uid=0)))
    pipe = Pipeline(CLUSTER, "c1-10", AgentConfig(cc_job_events=True))
    lines, _ = pipe.sample_lines(c.collect(now=BTIME + 800.0))
    (start,) = [ln for ln in lines if ln.measurement == "job"]
    for pid in (2001, 2010, 2011, 2020, 2021):
        shutil.rmtree(root / "proc" / str(pid))
    lines, _ = pipe.sample_lines(c.collect(now=BTIME + 830.0))
    (stop,) = [ln for ln in lines if ln.measurement == "job"]
    s = msgspec.json.decode(start.fields["event"], type=StartJob)
    e = msgspec.json.decode(stop.fields["event"], type=StopJob)
    assert s.job_id == e.job_id == 1392969 and e.start_time == s.start_time and e.stop_time == BTIME + 830
    routes = Pipeline(CLUSTER, "c1-10", AgentConfig(cc_job_events=True)).messages([start, stop], 1 << 20)
    assert [m.subject for m in routes] == [f"{CLUSTER}.events.job"]


# --- control -----------------------------------------------------------------------------------------------


def make_control():
    state = {"interval": 30.0}
    ctl = Control(
        CLUSTER,
        "c1-10",
        lambda: {"interval": state["interval"], "align": True},
        {"interval": Setting(float_in(1.0, 86400.0), lambda v: state.update(interval=v))},
    )
    return ctl, state


def reply(ctl: Control, text: str, method: str) -> Line:
    out = ctl.handle(text.encode(), method, now=5.0)
    assert out is not None
    parsed = parse_payload(out, now=0)
    assert parsed.problems == []
    (line,) = parsed.lines
    return line


def test_control_get_and_put():
    ctl, state = make_control()
    got = reply(ctl, 'config,hostname=c1-10,method=GET,type=node,type-id=0 control=""', "get")
    assert got.tags["status"] == "ok" and json.loads(got.fields["control"]) == {
        "interval": 30.0,
        "align": True,
    }
    one = reply(ctl, 'config,hostname=c1-10,method=GET control="interval"', "get")
    assert json.loads(one.fields["control"]) == {"interval": 30.0}
    put = reply(ctl, 'config,hostname=c1-10,method=PUT control="interval=60"', "put")
    assert put.tags["status"] == "ok" and state["interval"] == 60.0
    assert (put.measurement, put.tags["method"], put.tags["hostname"]) == ("config", "PUT", "c1-10")


@pytest.mark.parametrize(
    "request_line, method, reason",
    [
        ('config,hostname=c1-10,method=PUT control="interval=abc"', "put", "not a number"),
        ('config,hostname=c1-10,method=PUT control="interval=0.1"', "put", "between 1 and 86400"),
        ('config,hostname=c1-10,method=PUT control="interval=nan"', "put", "between"),
        ('config,hostname=c1-10,method=PUT control="align=false"', "put", "cannot be changed"),
        ('config,hostname=c1-10,method=PUT control="interval"', "put", "expected <setting>=<value>"),
        ('config,hostname=c1-10,method=PUT control="interval=60"', "get", "sent on the control.get"),
        ('rapl,hostname=c1-10,method=PUT control="interval=60"', "put", "unsupported control class"),
        ('config,hostname=c1-10,method=GET control="nosuch"', "get", "unknown setting"),
    ],
)
def test_control_bad_requests_change_nothing(request_line, method, reason):
    ctl, state = make_control()
    line = reply(ctl, request_line, method)
    assert line.tags["status"] == "error" and reason in json.loads(line.fields["control"])["error"]
    assert state["interval"] == 30.0


def test_control_ignores_other_hosts_and_garbage():
    ctl, _ = make_control()
    assert ctl.handle(b'config,hostname=c1-11,method=PUT control="interval=60"', "put") is None
    assert ctl.handle(b"this is not line protocol", "put") is None
    assert ctl.requests == 0


# --- `hpcbus produce node --once` through the real CLI ---------------------------------------------------------


@pytest.fixture
def produce_node(monkeypatch):
    """`hpcbus produce node` whether or not hpcbus/cli.py lists it yet (it is added there by hand)."""
    if ("produce", "node") not in cli.COMMANDS:
        monkeypatch.setitem(cli.COMMANDS, ("produce", "node"), "hpcbus.producers.node.command")


@pytest.mark.parametrize("fmt", ["lp", "sonar"])
def test_once_output_passes_validate(produce_node, capsys, tmp_path, fmt):
    root = tree(tmp_path, "hpc")
    argv = ["produce", "node", "--once", "--cluster", CLUSTER, "--root", str(root), "--settle", "0.05"]
    assert cli.main([*argv, "--format", fmt]) == 0
    out = capsys.readouterr().out
    path = tmp_path / f"once.{fmt}"
    path.write_text(out)
    assert cli.main(["validate", str(path)]) == 0, capsys.readouterr().out
    if fmt == "sonar":
        env = decode_envelope(out, expect="sample")
        assert env.data.attributes.node == "c1-10"
    else:
        lines = parse_payload(out, now=0).lines
        names = {ln.measurement for ln in lines}
        # a fixture tree does not change between the readings: rates are 0, CPU shares undefined
        assert {"sample", "mem_used", "cpu_time", "mem_total", "net_bytes_in_bw"} <= names
        assert "cpu_user" not in names


def test_once_on_this_machine_passes_validate(produce_node, capsys, tmp_path):
    config = tmp_path / "node.toml"
    config.write_text("[node.jobs]\nmin_uid = 0\n")  # also report root's processes: this machine's jobs
    argv = ["produce", "node", "--once", "--cluster", "test", "--config", str(config), "--settle", "0.2"]
    assert cli.main(argv) == 0
    path = tmp_path / "once.lp"
    path.write_text(capsys.readouterr().out)
    assert cli.main(["validate", str(path)]) == 0, capsys.readouterr().out
    names = {ln.measurement for ln in parse_payload(path.read_text(), now=0).lines}
    assert {"process_rss", "job_processes", "cpu_user", "mem_used"} <= names


def test_settings_errors_exit_2(produce_node, tmp_path, capsys):
    assert cli.main(["produce", "node", "--once", "--min-uid", "-1"]) == 2  # (--once needs no cluster)
    assert "--min-uid -1: a uid is 0 or more" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[node_agent]\nintervall = 5\n")
    assert cli.main(["produce", "node", "--once", "--cluster", "x", "--config", str(bad)]) == 2
    assert "unknown field `intervall`" in capsys.readouterr().err
    assert cli.main(["produce", "node", "--once", "--cluster", "x", "--interval", "0.2"]) == 2
    assert cli.main(["produce", "node", "--once", "--cluster", "a b", "--settle", "0"]) == 2
    assert "not a valid subject prefix" in capsys.readouterr().err


def test_sample_config_holds_the_defaults(produce_node):
    """deploy/node.toml lists every key with its default (the stream size, one hour of 500 nodes, aside): it
    loads, and it matches the structs' defaults."""
    from hpcbus.outbox import OutboxSettings
    from hpcbus.producers.node.command import load_settings
    from hpcbus.samples import STREAM_SIZE

    path = Path(__file__).parent.parent / "deploy" / "node.toml"
    args = cli.build_parser().parse_args(["produce", "node", "--config", str(path), "--cluster", "x"])
    bus, node, agent, outbox = load_settings(args)
    assert bus.cluster == "x" and bus.nats == ["nats://127.0.0.1:4222"]
    assert node == NodeCollectorConfig()
    assert agent == AgentConfig(stream_max_bytes=STREAM_SIZE)
    assert outbox == OutboxSettings()
    args = cli.build_parser().parse_args(
        ["produce", "node", "--config", str(path), "--interval", "5", "--root", "/tmp", "--spill-dir", "/s"]
    )
    _, node, agent, outbox = load_settings(args)
    assert (agent.interval, node.root, outbox.spill_dir) == (5.0, "/tmp", "/s")  # flags win


def test_sample_grid(tmp_path):
    from hpcbus.producers.node.agent import NodeAgent
    from hpcbus.settings import BusSettings

    def agent(**kw):
        return NodeAgent(
            BusSettings(cluster="grid"),
            NodeCollectorConfig(root=str(tmp_path), gpus=False),
            AgentConfig(hostname="c1-10", **kw),
        )

    a = agent(interval=30.0)
    assert a._next_tick(100.2) == 120.0  # wall-clock multiples
    a._last_tick = 120.0
    assert a._next_tick(119.999) == 150.0  # woken a hair early: not the same tick twice
    assert a._next_tick(200.0) == 210.0  # after a stall: the next grid point, no catch-up burst
    a._last_tick = 1000.0
    assert a._next_tick(500.0) == 510.0  # clock stepped back: no sleeping until 1030
    a.set_interval(7.0)
    a._last_tick = 0.0
    assert a._next_tick(100.0) == 105.0
    b = agent(interval=10.0, align=False)
    assert b._next_tick(5.0) == 15.0
    b._last_tick = 15.0
    assert b._next_tick(15.3) == 25.0
    assert b._next_tick(40.0) == 50.0
    b._last_tick = 1000.0
    assert b._next_tick(500.0) == 510.0


def test_zero_floats_are_omitted_like_sonar(tmp_path):
    """A computed 0.0 must not show up as `"cpu_util":0.0`: Sonar omits zero fields, and so must we."""
    root = tree(tmp_path, "slurm-cgroup-v2")
    c = NodeCollector(NodeCollectorConfig(root=str(root), gpus=False, jobs=JobOptions(min_uid=0)))
    c.collect(now=BTIME + 800.0)
    env = sample_envelope(c.collect(now=BTIME + 830.0), CLUSTER, node="c1-10")  # nothing ran: cpu_util 0
    procs = [
        p for j in json.loads(encode_envelope(env))["data"]["attributes"]["jobs"] for p in j["processes"]
    ]
    assert procs and all("cpu_util" not in p for p in procs)


def test_mapping_doc_lists_the_node_cc_lines() -> None:
    """docs/mapping.md section 10 is the generated table of producers/node/cc_lines.py, not a copy that drifts."""
    import subprocess
    import sys
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "mapping.md").read_text()
    table = doc.split("<!-- cc-lines:begin -->\n", 1)[1].split("<!-- cc-lines:end -->", 1)[0]
    generated = subprocess.run(
        [sys.executable, "-m", "hpcbus.producers.node.cc_lines"], capture_output=True, text=True, check=True
    ).stdout
    assert table == generated, (
        "run `python -m hpcbus.producers.node.cc_lines` and paste it into docs/mapping.md"
    )
