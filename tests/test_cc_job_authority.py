"""Who tells cc-backend about a job, and what the node producer says instead (issue 10, parts 3b-3e).

- Node producers publish `nodejob` events (never cc-backend's `job,function=start_job`) unless a site without
  a batch-system producer sets `cc_job_events`; the Slurm producer gives each job one start_job with every
  node; `produce ocs` sends the start_job before the stop_job by default.
- GPU `type-id` = NVML uuid or PCI bus id (`gpu_type_id`), the same in every accelerator line and in the job
  events' accelerators.
- Nothing any producer publishes on a subject cc-metric-store or cc-backend reads can make them drop the rest
  of a message: a checker modelled on their rules reads every message of the node, Slurm and OCS producers.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hpcbus.producers.node import NodeCollector, NodeCollectorConfig
from hpcbus.producers.node.cc_jobs import JobEvents
from hpcbus.producers.node.cc_lines import cc_lines
from hpcbus.producers.node.cpuset import job_cpus, parse_cpu_list
from hpcbus.producers.node.gpu_nvml import NvmlGpuReader, pci_bus_id
from hpcbus.producers.node.jobs import JobEnded, JobOptions, JobStarted
from hpcbus.producers.node.pipeline import AgentConfig, Pipeline
from hpcbus.producers.node.to_sonar import sample_envelope
from hpcbus.producers.ocs.follow import Follower
from hpcbus.producers.ocs.pipeline import Pipeline as OcsPipeline
from hpcbus.producers.ocs.settings import OcsSettings
from hpcbus.producers.slurm.producer import SlurmProducer
from hpcbus.producers.slurm.settings import SlurmSettings
from hpcbus.producers.slurm.state import SlurmState
from hpcbus.schemas.ccbackend import StartJob, StopJob
from hpcbus.schemas.lineprotocol import Line, parse_payload
from hpcbus.schemas.message import Message
from hpcbus.schemas.nodejob import NodeJob
from hpcbus.schemas.translate import Assembler
from tests.node_fixtures import tree
from tests.test_node_gpu_nvml import Card, FakeNvml
from tests.test_node_producer import BTIME, CLUSTER
from tests.test_ocs_producer import COLON_FILE, JSONL_FILE, read_all
from tests.test_slurm_producer_state import COMPLETED, RUNNING_PENDING, corpus_poll

JOB = 1392969  # the Slurm job of the slurm-cgroup-v2 fixture
JOB_CGROUP = "sys/fs/cgroup/system.slice/slurmstepd.scope/job_1392969"


def collector(root: Path, nvml: Any = None, **kw: Any) -> NodeCollector:
    kw.setdefault("jobs", JobOptions(min_uid=0))
    if nvml is None:
        kw.setdefault("gpus", False)
    return NodeCollector(NodeCollectorConfig(root=str(root), **kw), nvml=nvml)


def events_of(lines: list[Line], measurement: str) -> list[Line]:
    return [ln for ln in lines if ln.measurement == measurement]


# --- 3b: the node producer's own job events -------------------------------------------------------------


def test_node_producer_sends_nodejob_events_not_cc_backend_ones_by_default(tmp_path: Path) -> None:
    root = tree(tmp_path, "slurm-cgroup-v2")
    (root / JOB_CGROUP).mkdir(parents=True)
    (root / JOB_CGROUP / "cpuset.cpus.effective").write_text("0-3,8\n")
    c = collector(root, FakeNvml([Card(0)]))
    pipe = Pipeline(CLUSTER, "c1-10", AgentConfig())
    lines, _ = pipe.sample_lines(c.collect(now=BTIME + 800.0))
    assert events_of(lines, "job") == []  # cc-backend's form only with cc_job_events
    (start,) = events_of(lines, "nodejob")
    assert start.tags == {"cluster": CLUSTER, "hostname": "c1-10", "function": "start"}
    seen = msgspec.json.decode(str(start.fields["event"]), type=NodeJob)  # forbids unknown fields
    assert (seen.job_id, seen.hostname, seen.epoch, seen.at_startup) == (JOB, "c1-10", 0, True)
    assert seen.hwthreads == [0, 1, 2, 3, 8]
    assert seen.accelerators == ["GPU-00000000-926f-e54f-9828-ad1d8680469a"]
    assert start.time == seen.start_time
    for pid in (2001, 2010, 2011, 2020, 2021):
        shutil.rmtree(root / "proc" / str(pid))
    lines, _ = pipe.sample_lines(c.collect(now=BTIME + 830.0))
    (end,) = events_of(lines, "nodejob")
    gone = msgspec.json.decode(str(end.fields["event"]), type=NodeJob)
    assert end.tags["function"] == "end" and end.time == gone.stop_time == BTIME + 830
    assert gone.start_time == seen.start_time and events_of(lines, "job") == []
    subjects = {m.subject for m in pipe.messages([start, end], 1 << 20)}
    assert subjects == {f"{CLUSTER}.events.nodejob"}  # not cc-backend's subject
    c.close()


def test_cc_job_events_setting_adds_cc_backends_form_with_the_node_view() -> None:
    ev = JobEvents(CLUSTER, "c1-10", cc_events=True)
    started = JobStarted(
        job=42, epoch=0, user="alice", slurm=True, time=1000.0, start_time=990.0, hwthreads=(4, 5)
    )
    seen, start = ev.lines([started], [])
    assert (seen.measurement, start.measurement) == ("nodejob", "job")
    job = msgspec.json.decode(str(start.fields["event"]), type=StartJob)
    assert [(r.hostname, r.hwthreads) for r in job.resources] == [("c1-10", [4, 5])]
    assert (job.num_nodes, job.num_hwthreads) == (1, 2) and start.tags["origin"] == "node"
    ended = JobEnded(
        job=42, epoch=0, user="alice", slurm=True, time=1060.0, last_seen=1030.0, start_time=991.0
    )
    end, stop = ev.lines([ended], [])
    assert (end.tags["function"], stop.tags["function"]) == ("end", "stop_job")
    assert msgspec.json.decode(str(stop.fields["event"]), type=StopJob).start_time == 990


def test_four_nodes_and_slurm_give_cc_backend_one_complete_start() -> None:
    """A multi-node job: the nodes only say what they saw; the one start_job on cc-backend's subject is the
    Slurm producer's, with every node of the job."""
    nodes = [f"c1-{i}" for i in range(1, 5)]
    lines: list[Line] = []
    for host in nodes:
        pipe = Pipeline(CLUSTER, host, AgentConfig())
        started = JobStarted(job=7, epoch=0, user="alice", slurm=True, time=100.0, start_time=99.0)
        lines += pipe.jobs.lines([started], [])
    assert events_of(lines, "job") == []
    assert sorted(ln.tags["hostname"] for ln in events_of(lines, "nodejob")) == nodes

    out = SlurmProducer(SlurmSettings(), "fox", SlurmState("fox")).build(
        corpus_poll(RUNNING_PENDING.read_text())
    )
    starts = [
        msgspec.json.decode(str(ln.fields["event"]), type=StartJob)
        for subject, group in out.lines.items()
        if subject.endswith(".events.job")
        for ln in group
        if ln.tags["function"] == "start_job"
    ]
    assert starts and max(Counter(s.job_id for s in starts).values()) == 1  # one start per job
    for s in starts:
        assert len(s.resources) == s.num_nodes >= 1 and s.user  # cc-backend's checks
        # sacct names nodes, not CPUs or cards: those stay empty rather than guessed
        assert all(r.hwthreads == [] and r.accelerators == [] for r in s.resources)


def test_cpu_lists_and_job_cpus(tmp_path: Path) -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("") == [] and parse_cpu_list("3-1") == [] and parse_cpu_list("x") == []
    root = tmp_path / "n"
    proc = root / "proc"
    # cgroup v1: the cpuset controller's job directory
    (proc / "10").mkdir(parents=True)
    (proc / "10" / "cgroup").write_text("7:cpuset:/slurm/uid_1/job_5/step_0\n4:memory:/slurm/uid_1/job_5\n")
    v1 = root / "sys/fs/cgroup/cpuset/slurm/uid_1/job_5"
    v1.mkdir(parents=True)
    (v1 / "cpuset.cpus").write_text("2,6\n")
    assert job_cpus(str(root), [10]) == [2, 6]
    # cgroup v2, Slurm 26.05: the job's directory named by its SLUID (cgroup_v2.c, `cgroup_p_step_create`)
    (proc / "11").mkdir()
    scope = "/system.slice/slurmstepd.scope"
    (proc / "11" / "cgroup").write_text(f"0::{scope}/sEKNKTV3WPV500/step_batch/user/task_0\n")
    v2 = root / f"sys/fs/cgroup{scope}/sEKNKTV3WPV500"
    v2.mkdir(parents=True)
    (v2 / "cpuset.cpus.effective").write_text("4-5\n")
    assert job_cpus(str(root), [11]) == [4, 5]
    # no cgroup cpuset: the processes' affinity, joined
    for pid, cpus in ((20, "0-1"), (21, "3")):
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "status").write_text(f"Name:\tx\nCpus_allowed_list:\t{cpus}\n")
    assert job_cpus(str(root), [20, 21]) == [0, 1, 3]
    assert job_cpus(str(root), [99]) == []  # nothing readable: nothing guessed


# --- 3c: OCS sends the start before the stop ------------------------------------------------------------


def test_ocs_sends_start_job_before_stop_job_by_default() -> None:
    assert OcsSettings().start_jobs is True
    follower = Follower(str(JSONL_FILE))
    batches = [OcsPipeline("fox", hostname="m").process(c, now=1) for c in read_all(follower)]
    follower.close()
    job_messages = [m for b in batches for m in b.messages if m.subject.endswith(".events.job")]
    assert job_messages
    for m in job_messages:
        functions = [(ln.tags["function"], _job_id(ln)) for ln in parse_payload(m.payload, now=0).lines]
        # every stop has its start earlier in the same message (cc-backend reads a message's lines in order)
        for i, (function, job) in enumerate(functions):
            if function == "stop_job":
                assert ("start_job", job) in functions[:i]


def _job_id(line: Line) -> int:
    return int(msgspec.json.decode(str(line.payload))["jobId"])


# --- 3d: GPU type-id ---------------------------------------------------------------------------------------


def test_pci_bus_id_is_cc_metric_collectors_spelling() -> None:
    assert pci_bus_id("00000000:49:00.0") == "00000000:49:00.0"
    assert pci_bus_id("0000:b1:00.0") == "00000000:B1:00.0"  # legacy 4-digit domain, lower case
    assert pci_bus_id(" 00000000:18:00.0\x00") == "00000000:18:00.0"
    assert pci_bus_id("weird") == "WEIRD"


def test_pynvml_returns_the_bus_id_as_text() -> None:
    """The real binding decodes char arrays to str (nvidia-ml-py's _PrintableStructure); older ones gave bytes,
    which the reader decodes too."""
    import pynvml

    info = pynvml.nvmlPciInfo_t()
    info.busId = b"00000000:49:00.0"
    assert info.busId == "00000000:49:00.0" and isinstance(info.busId, str)
    fake = FakeNvml([Card(0, bus=b"00000000:49:00.0")])
    (reading,) = NvmlGpuReader(fake, type_id="pci").read()
    assert reading.uuid == reading.bus_id == "00000000:49:00.0"


@pytest.mark.parametrize("mode", ["uuid", "pci"])
def test_gpu_type_id_is_the_same_everywhere(tmp_path: Path, mode: str) -> None:
    c = collector(tree(tmp_path, "slurm-cgroup-v2"), FakeNvml([Card(0)]), gpu_type_id=mode)
    s = c.collect(now=BTIME + 800.0)
    expected = "00000000:18:00.0" if mode == "pci" else "GPU-00000000-926f-e54f-9828-ad1d8680469a"
    (g,) = s.gpus
    assert g.nvml_uuid == "GPU-00000000-926f-e54f-9828-ad1d8680469a" and g.bus_id == "00000000:18:00.0"
    pipe = Pipeline(CLUSTER, "c1-10", AgentConfig(cc_job_events=True))
    lines, _ = pipe.sample_lines(s)
    accel = {ln.tags["type-id"] for ln in lines if ln.tags.get("type") == "accelerator"}
    assert accel == {expected}  # Sonar-mapped acc_*, per-process GPU lines and CC nv_* lines alike
    assert {ln.tags["type-id"] for ln in cc_lines(s, CLUSTER, node="c1-10") if "nv_" in ln.measurement} == {
        expected
    }
    (start,) = events_of(lines, "job")
    assert msgspec.json.decode(str(start.fields["event"]), type=StartJob).resources[0].accelerators == [
        expected
    ]
    (seen,) = events_of(lines, "nodejob")
    assert msgspec.json.decode(str(seen.fields["event"]), type=NodeJob).accelerators == [expected]
    # the bus still reassembles into the sample the node built
    (done,) = Assembler().add_lines(lines, now=0.0)
    assert done.complete and done.envelope == sample_envelope(s, CLUSTER, node="c1-10")
    c.close()


# --- 3e: nothing on a subject cc-metric-store or cc-backend reads can cost them the rest of a message ----

_TIMESTAMP = re.compile(r"\d+")
_CC_FUNCTIONS = {"start_job", "stop_job"}


def cc_reader_losses(message: Message) -> list[str]:
    """Why cc-metric-store (`<cluster>.metrics`) or cc-backend (`<cluster>.events.job`, `.events.nodestate`)
    would drop lines of this message; [] when every line is read.

    Their rules (../shared/FACTS.md): cc-metric-store aborts the rest of a message at a line it cannot parse
    or whose field is not `value` (a number); cc-backend decodes every line with cc-lib's decoder, which
    needs a timestamp (read as ns) and aborts the rest on a decode error, and then decodes the event JSON of
    `job,function=start_job|stop_job` with unknown fields forbidden.
    """
    subject = message.subject
    metrics = subject.endswith(".metrics")
    jobs = subject.endswith(".events.job")
    if not (metrics or jobs or subject.endswith(".events.nodestate")):
        return []
    losses = []
    raw_lines = [r for r in message.payload.decode("utf-8").split("\n") if r.strip()]
    parsed = parse_payload(message.payload, now=0, place=subject)
    if parsed.problems or len(parsed.lines) != len(raw_lines):
        return [f"{subject}: not clean line protocol: {[str(p) for p in parsed.problems]}"]
    for n, (raw, line) in enumerate(zip(raw_lines, parsed.lines, strict=True), 1):
        where = f"{subject}:{n}"
        if not _TIMESTAMP.fullmatch(raw.rsplit(" ", 1)[-1]):
            losses.append(f"{where}: no timestamp")
        if metrics:
            value = line.fields.get("value")
            if set(line.fields) != {"value"} or isinstance(value, (str, bool)):
                losses.append(f"{where}: field {sorted(line.fields)} is not a numeric `value`")
        elif jobs:
            function = line.tags.get("function")
            if line.measurement != "job" or function not in _CC_FUNCTIONS:
                losses.append(
                    f"{where}: {line.measurement},function={function} is not a cc-backend job event"
                )
                continue
            try:
                if function == "start_job":
                    start = msgspec.json.decode(str(line.fields["event"]), type=StartJob)
                    if not start.user or start.num_nodes < 1 or len(start.resources) != start.num_nodes:
                        losses.append(f"{where}: start_job fails cc-backend's sanity checks")
                else:
                    stop = msgspec.json.decode(str(line.fields["event"]), type=StopJob)
                    if stop.stop_time < stop.start_time:
                        losses.append(f"{where}: stopTime before startTime")
            except msgspec.DecodeError as exc:  # ValidationError included: an unknown or mistyped key
                losses.append(f"{where}: {exc}")
    return losses


def node_messages(tmp_path: Path, *, cc_job_events: bool) -> list[Message]:
    out: list[Message] = []
    root = tree(tmp_path, "slurm-cgroup-v2")
    c = collector(root, FakeNvml([Card(0), Card(1)]))
    pipe = Pipeline(CLUSTER, "c1-10", AgentConfig(cc_job_events=cc_job_events, sonar_subjects=True))
    info_lines, _ = pipe.sysinfo_lines(c.sysinfo(now=BTIME + 790.0))
    out += pipe.messages(info_lines, 1 << 20)
    for t in (800.0, 830.0):
        if t == 830.0:
            for pid in (2001, 2010, 2011, 2020, 2021):
                shutil.rmtree(root / "proc" / str(pid))
        lines, sonar = pipe.sample_lines(c.collect(now=BTIME + t), queued=3, dropped=0)
        assert sonar is not None
        out += pipe.messages(lines, 1 << 20, sonar=("sample", sonar))
        out += pipe.messages(lines, 4000)  # cut at the size limit too
    c.close()
    hpc = tree(tmp_path, "hpc")
    c = collector(hpc, jobs=JobOptions(), job_events="all")
    for t in (0.0, 30.0):
        lines, _ = pipe.sample_lines(c.collect(now=1_700_000_000.0 + t))
        out += pipe.messages(lines, 1 << 20)
    return out


@pytest.mark.parametrize("cc_job_events", [False, True])
def test_node_messages_lose_nothing_in_cc_readers(tmp_path: Path, cc_job_events: bool) -> None:
    messages = node_messages(tmp_path, cc_job_events=cc_job_events)
    subjects = Counter(m.subject.removeprefix(CLUSTER + ".") for m in messages)
    # each sample built twice (one message per subject, and cut at 4000 bytes): a start and an end
    assert subjects["metrics"] > 4 and subjects["events.nodejob"] == 4
    assert subjects["events.job"] == (4 if cc_job_events else 0)
    assert [loss for m in messages for loss in cc_reader_losses(m)] == []


def test_slurm_messages_lose_nothing_in_cc_readers() -> None:
    producer = SlurmProducer(SlurmSettings(), "fox", SlurmState("fox"))
    messages = []
    for text in (RUNNING_PENDING.read_text(), COMPLETED.read_text()):
        out = producer.build(corpus_poll(text))
        messages += [Message(s, p, i) for s, p, i in out.messages()]
    assert any(m.subject.endswith(".events.job") for m in messages)
    assert [loss for m in messages for loss in cc_reader_losses(m)] == []


@pytest.mark.parametrize("path", [JSONL_FILE, COLON_FILE], ids=["jsonl", "colon"])
def test_ocs_messages_lose_nothing_in_cc_readers(path: Path) -> None:
    follower = Follower(str(path))
    messages = [
        m for c in read_all(follower) for m in OcsPipeline("fox", hostname="m").process(c, now=1).messages
    ]
    follower.close()
    assert any(m.subject.endswith(".events.job") for m in messages)
    assert [loss for m in messages for loss in cc_reader_losses(m)] == []


def test_the_checker_catches_what_would_cost_lines() -> None:
    good = "cpu_load,cluster=fox,hostname=n,type=node,type-id=0 value=1 1700000000\n"
    assert cc_reader_losses(Message("fox.metrics", good.encode(), "")) == []
    mixed = good + 'job,cluster=fox,function=stop_job event="{}" 1700000000\n'
    assert cc_reader_losses(Message("fox.metrics", mixed.encode(), ""))
    no_time = 'job,cluster=fox,function=stop_job event="{\\"jobId\\":1,\\"stopTime\\":2}"\n'
    assert any("no timestamp" in x for x in cc_reader_losses(Message("fox.events.job", no_time.encode(), "")))
    extra = 'job,cluster=fox,function=stop_job event="{\\"jobId\\":1,\\"stopTime\\":2,\\"x\\":1}" 5\n'
    assert cc_reader_losses(Message("fox.events.job", extra.encode(), ""))
    node = 'nodejob,cluster=fox,function=start,hostname=n event="{}" 5\n'
    assert cc_reader_losses(Message("fox.events.job", node.encode(), ""))  # never on cc-backend's subject
