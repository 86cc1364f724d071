"""`hpcbus consume sonar` without services: file names, settings, and the acknowledgement rule of the LP -> Sonar
sink driven by a fake clock and a fake NATS connection (what it publishes and acknowledges, and when)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import resource
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.msg import Msg

from hpcbus.consumers.sonar.command import directory_for, runner_settings, sonar_settings
from hpcbus.consumers.sonar.directory import DirectoryWriter, relative_path, short_component
from hpcbus.consumers.sonar.settings import SonarSettings
from hpcbus.consumers.sonar.to_lp import ToLpSink, decode_all
from hpcbus.consumers.sonar.to_sonar import HOST_EPISODE_END, ToSonarSink
from hpcbus.contract import BadInput
from hpcbus.deadletters import Reject, dead_letter
from hpcbus.delivery import RunnerSettings
from hpcbus.outlet import ORIGIN_HEADER, TRANSLATED, Outlet
from hpcbus.permanent import Permanent, TooLarge, Transient
from hpcbus.retry import Stopping
from hpcbus.runner import Runner
from hpcbus.schemas.sonar import decode_envelope, encode_envelope, iter_envelopes
from hpcbus.schemas.sonar.types import Error, SampleEnvelope
from hpcbus.schemas.translate import batch, envelope_to_lines, msg_id, route
from hpcbus.settings import SettingsError
from tests.corpus import CORPUS

SONAR = CORPUS / "sonar"


def envelopes(name: str, kind: str) -> list[Any]:
    return [env for _, env in iter_envelopes((SONAR / name).read_text(), expect=kind)]


# --- Sonar's file names ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind", "basename"),
    [
        # The corpus files are copies of real directory-sink files; PROVENANCE.md names their source paths.
        ("jobanalyzer__n1_sample_gpu_v0.14.jsonl", "sample", "0+sample-n1.cluster1.uio.no.json"),
        ("jobanalyzer__n1_sysinfo_gpu_v0.14.jsonl", "sysinfo", "0+sysinfo-n1.cluster1.uio.no.json"),
        ("jobanalyzer__cluster1_jobs_v0.14_trimmed.jsonl", "job", "0+job-slurm.json"),
        ("jobanalyzer__cluster1_cluster_v0.14.jsonl", "cluster", "0+cluzter-slurm.json"),
    ],
)
def test_file_names_are_sonars(name: str, kind: str, basename: str) -> None:
    for env in envelopes(name, kind):
        rel = relative_path(env, kind)
        assert rel.split("/")[-1] == basename
    # The date is the envelope's own time, in UTC, like Sonar's clock (UTC) at posting time.
    assert relative_path(envelopes(name, kind)[0], kind).startswith(
        {"sample": "2025/04/13/", "sysinfo": "2025/04/13/", "job": "2025/05/03/", "cluster": "2025/05/03/"}[
            kind
        ]
    )


def test_file_date_is_utc_and_errors_only_envelopes_use_the_error() -> None:
    (first, _bad, errors_only) = list(
        iter_envelopes((SONAR / "sonar__newfmt_sysinfo.json").read_text(), "sysinfo")
    )
    assert relative_path(first[1], "sysinfo") == "2025/02/28/0+sysinfo-ml1.hpc.uio.no.json"  # 00:00:01+01:00
    env = errors_only[1]
    assert not env.errors[0].time  # only a detail: the clock decides, the host is unknown
    assert relative_path(env, "sysinfo", now=86400 * 365) == "1971/01/01/0+sysinfo-unknown.json"
    raw = (
        b'{"meta":{"producer":"sonar","version":"0.13.0"},"errors":[{"time":"2025-05-01T23:30:00-02:00",'
        b'"detail":"no gpu","node":"c1-1.fox"}]}'
    )
    env = decode_envelope(raw, expect="sample")
    assert relative_path(env, "sample") == "2025/05/02/0+sample-c1-1.fox.json"
    # Host names are validated on decoding; an envelope built in Python is not, and still never escapes.
    env = SampleEnvelope(meta=env.meta, errors=[Error(detail="x", node="../../etc")])
    assert relative_path(env, "sample", now=0) == "1970/01/01/0+sample-.._.._etc.json"


def test_directory_writer_appends_lines_and_resumes_after_a_failure(tmp_path: Path) -> None:
    writer = DirectoryWriter(tmp_path / "tree")
    items = [("2025/01/01/0+job-slurm.json", b'{"a":1}'), ("2025/01/01/0+job-slurm.json", b'{"a":2}\n')]
    writer.append(items)
    assert items == [] and writer.written == 2
    blocker = tmp_path / "tree" / "2025" / "01" / "02"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("a file where a directory should be")
    items = [("2025/01/01/0+job-slurm.json", b'{"a":3}'), ("2025/01/02/0+job-slurm.json", b'{"a":4}')]
    with pytest.raises(Permanent):  # raised typed (`hpcbus.permanent.outcome`), with no `refused` list
        writer.append(items)
    assert items == [("2025/01/02/0+job-slurm.json", b'{"a":4}')]  # the written one is not written again
    text = (tmp_path / "tree/2025/01/01/0+job-slurm.json").read_text()
    assert text == '{"a":1}\n{"a":2}\n{"a":3}\n'


def test_directory_writer_refuses_what_no_retry_can_write_and_writes_the_rest(tmp_path: Path) -> None:
    writer = DirectoryWriter(tmp_path / "tree")
    (tmp_path / "tree/2025/01").mkdir(parents=True)
    (tmp_path / "tree/2025/01/02").write_text("a file where a directory should be")
    blocked = ("2025/01/02/0+job-slurm.json", b'{"a":1}')
    items = [blocked, ("2025/01/03/0+job-slurm.json", b'{"a":2}')]
    refused: list[tuple[tuple[str, bytes], str]] = []
    writer.append(items, refused)
    assert items == [] and writer.written == 1
    ((item, reason),) = refused
    assert item is blocked and "2025/01/02/0+job-slurm.json" in reason
    assert (tmp_path / "tree/2025/01/03/0+job-slurm.json").read_text() == '{"a":2}\n'


@contextlib.contextmanager
def unwritable(path: Path) -> Iterator[None]:
    """`path` takes no new entries from this process: immutable for root (who ignores modes), mode 0555
    for anyone else."""
    root = os.geteuid() == 0
    if root:
        subprocess.run(["chattr", "+i", str(path)], check=True)
    else:
        path.chmod(0o555)
    try:
        yield
    finally:
        if root:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        else:
            path.chmod(0o755)


def test_a_permission_refused_under_a_writable_tree_is_the_items_own(tmp_path: Path) -> None:
    writer = DirectoryWriter(tmp_path / "tree")
    day = tmp_path / "tree/2025/01/02"
    day.mkdir(parents=True)
    blocked = ("2025/01/02/0+job-slurm.json", b'{"a":1}')
    items = [blocked, ("2025/01/03/0+job-slurm.json", b'{"a":2}')]
    refused: list[tuple[tuple[str, bytes], str]] = []
    with unwritable(day):
        writer.append(items, refused)
    ((item, reason),) = refused
    assert item is blocked and "2025/01/02/0+job-slurm.json" in reason
    assert (tmp_path / "tree/2025/01/03/0+job-slurm.json").read_text() == '{"a":2}\n'


def test_a_tree_root_that_cannot_be_written_is_transient_and_refuses_nothing(tmp_path: Path) -> None:
    """A read-only remount or a mis-chowned tree root refuses every file alike: `Transient` (the runtime
    retries), nothing refused for good, and written once the tree can be written again."""
    tree = tmp_path / "tree"
    tree.mkdir()
    writer = DirectoryWriter(tree)
    items = [("2025/01/02/0+job-slurm.json", b'{"a":1}'), ("2025/01/03/0+job-slurm.json", b'{"a":2}')]
    refused: list[tuple[tuple[str, bytes], str]] = []
    with unwritable(tree), pytest.raises(Transient):
        writer.append(items, refused)
    assert refused == [] and len(items) == 2 and writer.written == 0
    writer.append(items, refused)  # the runtime's retry
    assert refused == [] and items == [] and writer.written == 2
    assert (tree / "2025/01/03/0+job-slurm.json").read_text() == '{"a":2}\n'


def test_a_write_failing_midway_leaves_no_half_line(tmp_path: Path) -> None:
    """EFBIG after part of a line went out (here: the process' file size limit): the part is taken back."""
    writer = DirectoryWriter(tmp_path / "tree")
    rel = "2025/01/02/0+job-slurm.json"
    writer.append([(rel, b'{"a":"' + b"x" * 90 + b'"}')])
    path = tmp_path / "tree" / rel
    size = path.stat().st_size
    refused: list[tuple[tuple[str, bytes], str]] = []
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_signal = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size + 50, old_limit[1]))
    try:
        writer.append([(rel, b'{"b":"' + b"y" * 90 + b'"}')], refused)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_signal)
    ((_, reason),) = refused
    assert "File too large" in reason
    assert path.stat().st_size == size and path.read_bytes().endswith(b'"}\n')


def test_a_file_name_over_255_bytes_is_shortened_deterministically() -> None:
    host = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])
    other = host[:-1] + "e"
    name = short_component("sysinfo", host, host)
    assert len(name.encode()) == 255 and name.startswith("0+sysinfo-aaa") and name.endswith(".json")
    assert name == short_component("sysinfo", host, host)  # every envelope of the host: one file
    assert short_component("sysinfo", other, other) != name  # same start, another host: another file
    assert "~" in name and short_component("sample", "n1", "n1") == "0+sample-n1.json"


# --- settings --------------------------------------------------------------------------------------------


def args(tmp_path: Path, toml: str = "", **flags: Any) -> argparse.Namespace:
    config = None
    if toml:
        config = tmp_path / "hpcbus.toml"
        config.write_text(toml)
    base = {"to": None, "directory": None, "grace": None, "on_stop": None, "mode": None, "durable": None}
    return argparse.Namespace(config=str(config) if config else None, **{**base, **flags})


def test_settings_from_toml_and_flags(tmp_path: Path) -> None:
    toml = (
        '[sonar]\nto = "lp"\ngrace = 5.0\ndirectory = "/srv/sonar/{cluster}"\n[delivery]\nack_wait = 30.0\n'
    )
    s = sonar_settings(args(tmp_path, toml, to="both"))
    assert (s.to, s.grace, s.directory) == ("both", 5.0, "/srv/sonar/{cluster}")  # the flag wins
    r = runner_settings(args(tmp_path, toml, durable="site"), s)
    assert r["to_sonar"].durable == "site-to-sonar" and r["to_lp"].durable == "site-to-lp"
    assert r["to_lp"].ack_wait == 30.0 and r["to_sonar"].ack_wait == 30.0  # >= 2 x 5 + 10
    assert r["to_sonar"].max_ack_pending == 20_000 and r["to_lp"].max_ack_pending == 1000
    s = sonar_settings(args(tmp_path, grace=60.0))
    assert runner_settings(args(tmp_path), s)["to_sonar"].ack_wait == 130.0  # a held message never times out
    toml = "[delivery]\nmax_ack_pending = 500\n"
    assert runner_settings(args(tmp_path, toml), s)["to_sonar"].max_ack_pending == 500  # the operator's


@pytest.mark.parametrize(
    ("toml", "flags", "wrong"),
    [
        ('[sonar]\nto = "influx"\n', {}, "to = 'influx'"),
        ("[sonar]\ncolour = 1\n", {}, "colour"),
        ("", {"on_stop": "drop"}, "on_stop"),
        ("", {"durable": "a.b"}, "durable"),
    ],
)
def test_bad_settings_are_named(tmp_path: Path, toml: str, flags: dict[str, Any], wrong: str) -> None:
    with pytest.raises(SettingsError, match=wrong):
        a = args(tmp_path, toml, **flags)
        runner_settings(a, sonar_settings(a))


@pytest.mark.parametrize(
    ("flags", "wrong"),
    [
        (["--cluster", "fox_1"], "Clustername"),  # the bus takes `_`, Sonar 0.19's Clustername does not
        (["--cluster", "fox,saga_2"], "'saga_2'"),
        (["--cluster", "fox", "--hostname-form", "domain", "--hostname-domain", "fox_x.org"], "fox_x.org"),
        (["--cluster", "fox", "--hostname-form", "domain", "--hostname-domain", "a" * 64 + ".org"], "label"),
    ],
)
def test_names_no_sonar_envelope_may_carry_stop_it_at_start(
    flags: list[str], wrong: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """LP -> Sonar stamps every envelope with the cluster and the node's name: a name Sonar refuses would make
    every envelope of every interval a dead letter. `--check-config` and the start both say so in one line,
    exit 2, no traceback; Sonar -> LP alone stamps nothing and takes them."""
    from hpcbus import cli

    assert cli.main(["--check-config", "consume", "sonar", *flags]) == 2
    err = capsys.readouterr().err
    assert wrong in err and "Traceback" not in err
    assert cli.main(["--check-config", "consume", "sonar", *flags, "--to", "lp"]) == 0
    # Started for real, it stops before connecting (nothing listens on port 1: a connection would be retried).
    started = subprocess.run(
        [sys.executable, "-m", "hpcbus.cli", "consume", "sonar", *flags, "--nats", "nats://127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 2 and wrong in started.stderr and "Traceback" not in started.stderr


def test_sonar_names_that_are_fine_pass_check_config() -> None:
    from hpcbus import cli

    domain = ["--hostname-form", "domain", "--hostname-domain", "fox.example.org"]
    assert cli.main(["--check-config", "consume", "sonar", "--cluster", "fox.example.org,saga", *domain]) == 0


def test_directory_per_cluster() -> None:
    assert directory_for("/srv/{cluster}/data", "fox", ["fox"]) == "/srv/fox/data"
    assert directory_for("/srv/data", "fox", ["fox"]) == "/srv/data"
    with pytest.raises(SettingsError, match="cluster"):
        directory_for("/srv/data", "fox", ["fox", "saga"])


# --- Sonar -> LP: one message, many envelopes --------------------------------------------------------------


def test_a_bad_envelope_never_hides_the_good_ones_beside_it() -> None:
    lines = (SONAR / "jobanalyzer__n1_sample_gpu_v0.14.jsonl").read_bytes().splitlines()
    raw = lines[0] + b"\n" + b'{"meta":{"producer":""},"data":{"type":"sample"}}\n' + lines[1] + b"\n"
    good, problems = decode_all(raw, "sample", "fox.sonar.sample")
    assert good == envelopes("jobanalyzer__n1_sample_gpu_v0.14.jsonl", "sample")
    assert (
        problems and {p.line for p in problems} == {2} and {p.place for p in problems} == {"fox.sonar.sample"}
    )
    good, problems = decode_all(lines[0], "sysinfo", "fox.sonar.sysinfo")
    assert good == [] and any(p.path == "data.type" for p in problems)


# --- LP -> Sonar: when messages are acknowledged ------------------------------------------------------------


class FakeAck:
    def __init__(self, duplicate: bool) -> None:
        self.duplicate = duplicate
        self.stream, self.seq = "S", 1


class FakeJS:
    def __init__(self, nc: FakeNC) -> None:
        self.nc = nc

    async def publish(self, subject: str, payload: bytes, timeout: float = 0, headers: Any = None) -> FakeAck:
        if self.nc.refusing and self.nc.refusing in subject:
            raise TimeoutError(f"nothing answers on {subject}")
        ids = {h.get("Nats-Msg-Id") for _, _, h in self.nc.stored if h}
        duplicate = bool(headers) and headers.get("Nats-Msg-Id") in ids
        if not duplicate:
            self.nc.stored.append((subject, payload, headers or {}))
        return FakeAck(duplicate)


class FakeNC:
    is_connected = True
    max_payload = 1024 * 1024

    def __init__(self) -> None:
        self.stored: list[tuple[str, bytes, dict[str, str]]] = []
        self.replies: list[tuple[str, bytes]] = []
        self.refusing = ""
        """Publishing to a subject holding this times out."""

    def jetstream(self) -> FakeJS:
        return FakeJS(self)

    async def publish(self, subject: str, payload: bytes = b"", headers: Any = None) -> None:
        if subject.startswith("reply."):
            self.replies.append((subject, payload or b"+ACK"))  # `Msg.ack` sends an empty payload


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def sample_messages(cluster: str) -> tuple[Any, list[Msg]]:
    env = envelopes("jobanalyzer__n1_sample_gpu_v0.14.jsonl", "sample")[0]
    msgs = []
    for subject, group in route(envelope_to_lines(env), cluster).items():
        ours = cluster + subject[len("cluster1.uio.no") :]
        for payload in batch(group):
            msgs.append(Msg(None, ours, f"reply.{len(msgs)}", payload))  # type: ignore[arg-type]
    return env, msgs


def make_sink(tmp_path: Path, **settings: Any) -> tuple[ToSonarSink, FakeNC, Clock]:
    nc, clock = FakeNC(), Clock()
    outlet = Outlet(nc, "fox", jetstream=True)  # type: ignore[arg-type]
    sink = ToSonarSink(
        outlet,
        "test-to-sonar",
        SonarSettings(grace=30.0, **settings),
        DirectoryWriter(tmp_path / "tree"),
        acks=True,
        clock=clock,
    )
    return sink, nc, clock


class Worker:
    """The runner around a `ToSonarSink` on the fake connection (`hpcbus.runner.Runner`: it holds what the
    sink holds, acknowledges what the sink settles, dead-letters first): `deliver` a batch, `tick`, `stop`."""

    def __init__(self, sink: ToSonarSink, nc: FakeNC) -> None:
        self.sink, self.nc = sink, nc
        settings = RunnerSettings(durable="test-to-sonar")
        self.runner = Runner(nc, settings, "S", ["fox.metrics"], sink)  # type: ignore[arg-type]

    def deliver(self, msgs: list[Msg], stopping: Stopping | None = None) -> list[Reject]:
        """Take `msgs` (their problems, as the runner keeps them) and deliver them as one batch."""
        self.runner.stopping = stopping or Stopping(1.0)
        rejects = []
        for m in msgs:
            m._client = self.nc  # type: ignore[assignment]
            _, found = take(self.sink, m)
            rejects += found
        kept = list(rejects)
        run(self.runner._deliver_and_ack(self.sink.cut(), msgs, rejects))
        return kept

    def tick(self, stopping: Stopping | None = None) -> bool:
        """A step, then what the runner does with what the sink settled; False when the stop came first."""
        self.runner.stopping = stopping or Stopping(1.0)
        run(self.runner.attempt(functools.partial(self.sink.tick, self.runner.stopping)))
        return bool(run(self.runner.settle()))

    def stop(self, stopping: Stopping) -> None:
        self.runner.stopping = stopping
        run(self.sink.close(stopping))
        run(self.runner.settle())


def acked(nc: FakeNC, what: bytes = b"+ACK") -> list[str]:
    return sorted(r for r, p in nc.replies if p == what)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_complete_sample_is_published_at_once_and_its_input_acked_after_the_grace_window(
    tmp_path: Path,
) -> None:
    sink, nc, clock = make_sink(tmp_path)
    env, msgs = sample_messages("fox")
    worker = Worker(sink, nc)
    worker.deliver(msgs)
    ((subject, payload, headers),) = nc.stored
    assert subject == "fox.sonar.sample" and decode_envelope(payload, expect="sample") == env
    assert headers == {"Nats-Msg-Id": msg_id(subject, payload), ORIGIN_HEADER: TRANSLATED}
    assert acked(nc) == []  # a group that opened before these lines could still be waiting for them
    clock.now += 29.0
    worker.tick()
    assert acked(nc) == []
    clock.now += 1.0
    worker.tick()
    assert acked(nc) == sorted(m.reply for m in msgs)
    assert (tmp_path / "tree/2025/04/13/0+sample-n1.cluster1.uio.no.json").read_bytes() == payload + b"\n"
    c = sink.counters  # counted by the runner, as for every sink
    assert (c.delivered, c.deadlettered, c.pending) == (2, 0, 0)


def test_a_waiting_sample_keeps_its_input_unacked_until_it_is_published(tmp_path: Path) -> None:
    sink, nc, clock = make_sink(tmp_path)
    env, msgs = sample_messages("fox")
    skeleton, metrics = msgs  # events.sample, then metrics
    worker = Worker(sink, nc)
    worker.deliver([skeleton])
    clock.now += 10.0
    late = Msg(None, "fox.metrics", "reply.late", metrics.data[: metrics.data.index(b"\n") + 1])  # type: ignore[arg-type]
    clock.now += 20.0  # the skeleton's group is 30 s old: published partial
    worker.deliver([late])
    ((_, payload, _),) = nc.stored
    assert decode_envelope(payload, expect="sample") != env
    assert acked(nc) == ["reply.0"]
    # The late line's group is out too, but the rule is by arrival time only (no assembler internals): the
    # message is acknowledged once its own grace window has passed.
    clock.now += 29.0
    worker.tick()
    assert acked(nc) == ["reply.0"]
    clock.now += 1.0
    worker.tick()
    assert acked(nc) == ["reply.0", "reply.late"] and len(nc.stored) == 1


def test_own_output_is_acked_without_translation(tmp_path: Path) -> None:
    sink, nc, _clock = make_sink(tmp_path)
    _, msgs = sample_messages("fox")
    for m in msgs:
        m.headers = {ORIGIN_HEADER: TRANSLATED}
    Worker(sink, nc).deliver(msgs)
    assert nc.stored == [] and acked(nc) == ["reply.0", "reply.1"]
    assert sink.counters.skipped_messages == 2 and sink.translator.samples.open_groups == 0


def test_stopping_returns_waiting_input_and_a_rebuilt_envelope_is_a_duplicate(tmp_path: Path) -> None:
    sink, nc, _clock = make_sink(tmp_path)
    env, msgs = sample_messages("fox")
    skeleton, metrics = msgs
    worker = Worker(sink, nc)
    worker.deliver([skeleton])
    stopping = Stopping(1.0)
    stopping.set()
    worker.stop(stopping)
    assert nc.stored == [] and acked(nc, b"-NAK") == ["reply.0"] and acked(nc) == []
    assert sink.counters.returned_messages == 1
    # The next worker gets the skeleton again, then the metrics: one complete envelope; a third worker
    # rebuilding it after another redelivery publishes a duplicate that JetStream drops (and no second line).
    for _ in range(2):
        sink2, _, _ = make_sink(tmp_path)
        sink2.outlet.nc = nc  # type: ignore[assignment]
        sink2.outlet.js = nc.jetstream()  # type: ignore[assignment]
        Worker(sink2, nc).deliver([skeleton, metrics])
    ((_, payload, _),) = nc.stored
    assert decode_envelope(payload, expect="sample") == env
    assert sink2.counters.duplicate_envelopes == 1
    assert (tmp_path / "tree/2025/04/13/0+sample-n1.cluster1.uio.no.json").read_bytes().count(b"\n") == 1


def test_on_stop_flush_publishes_partial_and_acks_everything(tmp_path: Path) -> None:
    sink, nc, _clock = make_sink(tmp_path, on_stop="flush")
    _, (skeleton, _metrics) = sample_messages("fox")
    worker = Worker(sink, nc)
    worker.deliver([skeleton])
    stopping = Stopping(1.0)
    stopping.set()
    worker.stop(stopping)
    assert len(nc.stored) == 1 and acked(nc) == ["reply.0"] and acked(nc, b"-NAK") == []


def test_bad_lines_are_refused_in_take_and_dead_lettered_by_the_runner_before_the_ack(tmp_path: Path) -> None:
    sink, nc, _clock = make_sink(tmp_path)
    bad = Msg(None, "fox.metrics", "reply.bad", b"garbage here\n")  # type: ignore[arg-type]
    (reject,) = Worker(sink, nc).deliver([bad])
    assert reject.msg is bad and reject.problems
    (dead,) = [s for s in nc.stored if s[0] == "fox.deadletter.metrics"]
    assert dead[1] == b"garbage here\n" and dead[2]["Hpcbus-Subject"] == "fox.metrics"
    assert any(s[0] == "fox.log.hpcbus" and b"fox.metrics:1" in s[1] for s in nc.stored)
    assert acked(nc) == ["reply.bad"]  # nothing of it waits in the assembler
    c = sink.counters  # `delivered` as the runtime means it: a dead-lettered message is not delivered too
    assert (c.delivered, c.deadlettered) == (0, 1)


def test_an_envelope_whose_file_can_never_be_written_is_dead_lettered_and_its_input_acked(
    tmp_path: Path,
) -> None:
    sink, nc, clock = make_sink(tmp_path)
    (tmp_path / "tree/2025/04").mkdir(parents=True)
    (tmp_path / "tree/2025/04/13").write_text("a file where the day's directory should be")
    _, msgs = sample_messages("fox")
    worker = Worker(sink, nc)
    worker.deliver(msgs)  # not retried forever
    (published, dead) = [s for s in nc.stored if ".log." not in s[0]]
    assert published[0] == "fox.sonar.sample"
    assert dead[0] == "fox.deadletter.sonar" and dead[1] == published[1]
    assert "file can never be written" in dead[2]["Hpcbus-Problems"]
    assert sink.counters.deadlettered_merged == 1 and sink.counters.files_written == 0
    clock.now += 30.0
    worker.tick()
    assert acked(nc) == sorted(m.reply for m in msgs)
    assert (sink.counters.delivered, sink.counters.deadlettered) == (2, 0)  # the messages were fine


def test_an_envelope_that_could_not_be_dead_lettered_before_the_stop_keeps_its_input(
    tmp_path: Path,
) -> None:
    """Its file can never be written and the dead-letter stream does not answer before the stop deadline:
    the envelope is neither written nor dead-lettered, so its inputs must stay unacknowledged."""
    sink, nc, clock = make_sink(tmp_path)
    (tmp_path / "tree/2025/04").mkdir(parents=True)
    (tmp_path / "tree/2025/04/13").write_text("a file where the day's directory should be")
    nc.refusing = ".deadletter."
    _, msgs = sample_messages("fox")
    stopping = Stopping(0.2)
    stopping.set()
    worker = Worker(sink, nc)
    worker.deliver(msgs, stopping)
    clock.now += 30.0  # the inputs are settled as delivered now, but their envelope's dead letter waits
    assert not worker.tick(stopping)
    assert acked(nc) == [] and sink.counters.deadlettered_merged == 0
    nc.refusing = ""
    assert worker.tick()  # the next settle dead-letters it, then acknowledges
    assert [s for s, _, _ in nc.stored if ".log." not in s] == ["fox.sonar.sample", "fox.deadletter.sonar"]
    assert acked(nc) == sorted(m.reply for m in msgs)


def jobs_with_a_huge_record(limit: int) -> tuple[Any, bytes]:
    raw = (SONAR / "jobanalyzer__cluster1_jobs_v0.14_trimmed.jsonl").read_bytes().splitlines()[0]
    env = decode_envelope(raw, expect="job")
    assert env.data is not None
    jobs = list(env.data.attributes.slurm_jobs)
    assert len(jobs) > 2
    jobs[1] = msgspec.structs.replace(jobs[1], reservation='"' * limit)  # escaped: longer than a message
    attrs = msgspec.structs.replace(env.data.attributes, slurm_jobs=jobs)
    env = msgspec.structs.replace(env, data=msgspec.structs.replace(env.data, attributes=attrs))
    return env, encode_envelope(env)


def test_a_record_whose_event_cannot_fit_costs_only_its_own_line_and_the_envelope_is_filed(
    tmp_path: Path,
) -> None:
    """Was: one oversized `slurm` event refused the whole envelope (no line of any record, no file)."""
    nc = FakeNC()
    nc.max_payload = 64 * 1024
    sink = ToLpSink(Outlet(nc, "fox", jetstream=True), "t", DirectoryWriter(tmp_path / "tree"))  # type: ignore[arg-type]
    env, payload = jobs_with_a_huge_record(40_000)
    msg = Msg(None, "fox.sonar.job", "reply.0", payload)  # type: ignore[arg-type]
    items, rejects = take(sink, msg)
    assert items > 0
    run(sink.deliver(sink.cut(), Stopping(1.0)))
    assert run(dead_letter(sink.outlet, rejects, sink.counters, Stopping(1.0)))  # the runner's next step
    published = [(s, p) for s, p, _ in nc.stored if ".deadletter." not in s]
    assert published and all(len(p) <= 64 * 1024 for _, p in published)
    dead = next(h for s, _, h in nc.stored if ".deadletter." in s)  # the message, in parts if need be
    assert (
        "longer than one NATS message" in dead["Hpcbus-Problems"]
        and "part=2,parts=3" in dead["Hpcbus-Problems"]
    )
    assert "the rest of the envelope is" in dead["Hpcbus-Problems"]
    (path,) = (tmp_path / "tree").rglob("0+job-slurm.json")
    assert decode_envelope(path.read_bytes(), expect="job") == env


def test_each_message_whose_file_cannot_be_written_gets_its_own_reason_in_one_dead_letter(
    tmp_path: Path,
) -> None:
    """Two messages refused for two different files, one of them with a bad envelope beside: each dead
    letter names its own file, and the bad envelope's problems ride in the same dead letter."""
    nc = FakeNC()
    sink = ToLpSink(Outlet(nc, "fox", jetstream=True), "t", DirectoryWriter(tmp_path / "tree"))  # type: ignore[arg-type]
    samples = (SONAR / "jobanalyzer__n1_sample_gpu_v0.14.jsonl").read_bytes().splitlines()
    jobs = (SONAR / "jobanalyzer__cluster1_jobs_v0.14_trimmed.jsonl").read_bytes().splitlines()[0]
    for rel in ("2025/04/13", "2025/05/03"):
        (tmp_path / "tree" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tree" / rel).write_text("a file where a directory should be")
    bad = b'{"meta":{"producer":""},"data":{"type":"sample"}}'
    one = Msg(None, "fox.sonar.sample", "reply.0", samples[0] + b"\n" + bad + b"\n" + samples[1])  # type: ignore[arg-type]
    two = Msg(None, "fox.sonar.job", "reply.1", jobs)  # type: ignore[arg-type]
    _, found = take(sink, one)
    assert take(sink, two)[1] == []
    with pytest.raises(Permanent) as raised:
        run(sink.deliver(sink.cut(), Stopping(1.0)))
    exc = raised.value
    assert exc.msgs == [one, two]
    assert "2025/04/13/0+sample-" in exc.reasons[id(one)] and "2025/05/03" not in exc.reasons[id(one)]
    assert "2025/05/03/0+job-slurm.json" in exc.reasons[id(two)]
    # the bad envelope's problems go to the runner, which puts them in `one`'s dead letter
    assert [r.msg for r in found] == [one] and found[0].problems
    assert not [s for s, _, _ in nc.stored if ".deadletter." in s]  # the runner dead-letters them, once


def take(sink: ToLpSink | ToSonarSink, msg: Msg) -> tuple[int, list[Reject]]:
    """What the runner does with a message (`hpcbus.runner.Runner._take`): the items, and the message to
    dead-letter (with its problems) when the sink refused part of it."""
    try:
        return sink.take(msg), []
    except BadInput as exc:
        return exc.items, [Reject(msg, exc.problems)]


def host_messages(node: str, seconds: int, tag: str) -> list[Msg]:
    """The node agent's messages of the corpus sample from `node`, `seconds` later (reply subjects
    `reply.<tag>.<n>`): written by a producer that does not check names against Sonar's rule."""
    env = envelopes("jobanalyzer__n1_sample_gpu_v0.14.jsonl", "sample")[0]
    attrs = env.data.attributes
    moved = datetime.fromisoformat(attrs.time) + timedelta(seconds=seconds)
    attrs = msgspec.structs.replace(attrs, node=node, time=moved.isoformat(timespec="seconds"))
    env = msgspec.structs.replace(env, data=msgspec.structs.replace(env.data, attributes=attrs))
    msgs = []
    for subject, group in route(envelope_to_lines(env), "fox").items():
        ours = "fox" + subject[len("cluster1.uio.no") :]
        for payload in batch(group):
            msgs.append(Msg(None, ours, f"reply.{tag}.{len(msgs)}", payload))  # type: ignore[arg-type]
    return msgs


def test_a_refused_host_is_said_again_only_after_an_hour_of_silence(tmp_path: Path) -> None:
    """A host Sonar refuses (`c1_5`) costs one dead letter an episode; its episode ends once it has been
    silent for `HOST_EPISODE_END` seconds (INFO), and its return is a new episode, said and dead-lettered
    again. Nothing of it is ever published, and every message is acknowledged."""
    sink, nc, clock = make_sink(tmp_path)
    worker = Worker(sink, nc)

    def dead() -> int:
        return sum(1 for s in nc.stored if ".deadletter." in s[0])

    for i in range(3):
        worker.deliver(host_messages("c1_5", 30 * i, str(i)))
        clock.now += 30.0
        worker.tick()
    assert dead() == 1 and sink.counters.refused_hosts == 1
    assert not [s for s in nc.stored if ".sonar." in s[0]] and sink.translator.samples.open_groups == 0
    assert len(acked(nc)) == 6
    clock.now += HOST_EPISODE_END - 31.0
    worker.tick()
    assert dead() == 1  # silent for less than the hour: the same episode
    worker.deliver(host_messages("c1_5", 9000, "back"))
    assert dead() == 1
    clock.now += HOST_EPISODE_END
    worker.tick()
    worker.deliver(host_messages("c1_5", 9000 + int(HOST_EPISODE_END), "new"))
    assert dead() == 2 and sink.counters.refused_hosts == 2
    c = sink.counters
    assert c.refused_host_lines > 0 and c.invalid_envelopes == 0  # `rejected` too: the runner counts


class RefusingTheFirstBatch(ToSonarSink):
    """A `ToSonarSink` whose first delivery fails as a whole (`TooLarge`: the far end refuses the batch for its
    size, no message named), as a server's answer would: the runner then takes each message again, alone."""

    failed = False

    async def deliver(self, batch: object, stopping: Stopping) -> None:
        if not self.failed:
            self.failed = True
            raise TooLarge("batch too large for the far end")
        await super().deliver(batch, stopping)


@pytest.mark.parametrize("jetstream", [True, False], ids=["jetstream", "core"])
def test_a_refused_hosts_first_message_taken_again_is_still_dead_lettered(
    tmp_path: Path, jetstream: bool
) -> None:
    """The runner discards the dead letters of a batch that fails as a whole and takes each of its messages
    again (`again`): the message that began a refused host's episode must be refused again, or it would be
    acknowledged with no dead letter and no warning; the host's other messages stay unsaid. The episode knows
    its first message by its stream sequence (JetStream, a reply subject `$JS.ACK...`), else as the object."""
    nc, clock = FakeNC(), Clock()
    outlet = Outlet(nc, "fox", jetstream=True)  # type: ignore[arg-type]
    sink = RefusingTheFirstBatch(outlet, "t", SonarSettings(grace=30.0), None, acks=True, clock=clock)
    worker = Worker(sink, nc)
    msgs = host_messages("c1_5", 0, "a")
    assert len(msgs) > 1  # a batch of one is dead-lettered as it is
    for n, m in enumerate(msgs):
        m._client = nc  # type: ignore[assignment]
        if jetstream:  # `reply.` + nats-py's ack subject: the fake connection records it as an ack
            m.reply = f"reply.$JS.ACK.S.test-to-sonar.1.{100 + n}.{n + 1}.1700000000000000000.0"
    runner = worker.runner
    runner.stopping = Stopping(1.0)
    for m in msgs:
        runner._take(m)
    run(runner._drain())
    assert sink.failed and sink.counters.refused_hosts == 1
    dead = [h for s, _, h in nc.stored if ".deadletter." in s]
    assert len(dead) == 1 and "Sonar Hostname 'c1_5'" in dead[0]["Hpcbus-Problems"]
    assert len(acked(nc)) == len(msgs)  # every message acknowledged, once its dead letter is stored


def test_a_host_is_judged_in_the_configured_form(tmp_path: Path) -> None:
    """`hostname_form = "short"` names the node `n1` in the envelope: a domain Sonar would refuse
    (`n1.lab_2`) costs nothing, while a short name it refuses (`c1_5.fox`) is refused."""
    sink, nc, _clock = make_sink(tmp_path, hostname_form="short")
    worker = Worker(sink, nc)
    worker.deliver(host_messages("n1.lab_2", 0, "a") + host_messages("c1_5.fox", 0, "b"))
    ((_, payload, _),) = [s for s in nc.stored if ".sonar." in s[0]]
    assert decode_envelope(payload, expect="sample").data.attributes.node == "n1"  # type: ignore[union-attr]
    assert sink.counters.refused_hosts == 1
    ((_, _, headers),) = [s for s in nc.stored if ".deadletter." in s[0]]
    assert "Sonar Hostname 'c1_5'" in headers["Hpcbus-Problems"]
