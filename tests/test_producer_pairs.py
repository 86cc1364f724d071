"""`produce ocs` and `produce slurm` as active/standby pairs (`state = "jetstream"`) on a real nats-server:
the standby waits while the active producer holds the cluster's lease, takes over within the lease's TTL
plus 10 s when the active one is SIGKILLed in the middle of its work (no local state at all), and every
job's cc-backend start and stop and its Sonar job record is on the stream once: the dead holder's messages
written ahead are published again by the standby, byte for byte, and the stream's duplicate window drops
the ones it had stored already (`hpcbus.heldsources`)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import msgspec
import nats
import pytest

from hpcbus import cli
from hpcbus.heldsources import OUT
from hpcbus.lease import FencedStore, Lease
from hpcbus.retry import Stopping
from hpcbus.schemas.message import Message
from hpcbus.schemas.slurm.values import TERMINAL_STATES
from hpcbus.streams import roles_bucket
from tests.consumer_helpers import Process, ProducerProcess, Worker, make_telemetry_stream, wait_for
from tests.services import NatsServer, SlurmCluster
from tests.test_ocs_producer import append, record, write
from tests.test_ocs_producer_service import Bus
from tests.test_slurm_producer import bus_view
from tests.test_status import facts, status

pytestmark = pytest.mark.services

TTL = 3


def lease_holder(url: str, cluster: str, role: str) -> str:
    """Who holds the cluster's `role` lease ("" when nobody does)."""
    from tests.faults.scenarios import lease_entry

    return lease_entry(url, cluster, role)[1]


def ocs_side(workers: list[Process], tmp_path: Path, name: str, url: str, cluster: str, acct: Path) -> Worker:
    args = [
        "produce", "ocs", "--nats", url, "--cluster", cluster, "--accounting", str(acct),
        "--state", "jetstream", "--lease-ttl", str(TTL), "--state-file", str(tmp_path / name / "ocs.state"),
        "--interval", "0.1", "--max-chunk-bytes", "3000", "--stream-max-bytes", str(64 << 20),
    ]  # fmt: skip
    w = Worker(args, tmp_path / f"{name}.log")
    workers.append(w)
    return w


def stream(url: str, cluster: str) -> Callable[[], Bus]:
    reader = ProducerProcess(Path("."), url, cluster, [])
    return lambda: Bus(cluster, reader.messages())


def test_the_ocs_standby_takes_over_a_killed_producer_and_publishes_each_job_once(
    workers: list[Process], tmp_path: Path, nats_server: NatsServer
) -> None:
    cluster = f"ocspair{uuid.uuid4().hex[:6]}"
    url = nats_server.url
    acct = tmp_path / "accounting.jsonl"
    write(acct, *(record(job) for job in range(1, 11)))
    bus = stream(url, cluster)

    a = ocs_side(workers, tmp_path, "a", url, cluster, acct).start("holds the role now")
    b = ocs_side(workers, tmp_path, "b", url, cluster, acct).start(None)
    b.wait_log("standing by")
    assert lease_holder(url, cluster, "ocs").endswith(f":{a.pid}")
    wait_for(lambda: bus().stop_ids() == list(range(1, 11)), 30, "A publishes the first ten jobs")

    # a growing file: A is killed while it works through it (a chunk is about 3 records)
    append(acct, "".join(record(job) + "\n" for job in range(11, 401)))
    wait_for(lambda: len(bus().stops) > 40, 30, "A is in the middle of the new lines")
    a.signal(signal.SIGKILL)
    killed = time.monotonic()
    a.wait(10)
    append(acct, "".join(record(job) + "\n" for job in range(401, 421)))
    b.wait_log("holds the role now", timeout=TTL + 10)
    takeover = time.monotonic() - killed
    assert takeover <= TTL + 10, takeover
    assert lease_holder(url, cluster, "ocs").endswith(f":{b.pid}")

    jobs = list(range(1, 421))
    got = wait_for(lambda: (s := bus()).stop_ids() == jobs and s, 60, "B publishes the rest")
    assert sorted(s["jobId"] for s in got.starts) == jobs  # each start once
    assert sorted(got.jobs) == jobs  # each job in one envelope record
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()  # no local state at all

    # a clean stop hands the role over at once
    a2 = ocs_side(workers, tmp_path, "a", url, cluster, acct).start(None)
    a2.wait_log("standing by")
    stopped = time.monotonic()
    assert b.terminate() == 0
    a2.wait_log("holds the role now", timeout=TTL)
    assert time.monotonic() - stopped < TTL
    append(acct, record(421) + "\n")
    wait_for(lambda: bus().stop_ids() == [*jobs, 421], 30, "A again, from where B stopped")


def role_problems(url: str, cluster: str) -> tuple[list[dict[str, Any]], list[str]]:
    """`hpcbus status --json`: the cluster's roles and the problems about them."""
    _, report = facts(url, cluster)
    (c,) = report["clusters"]
    return c["roles"], [
        f"{p['where']}: {p['what']}" for p in report["problems"] if p["where"].startswith("role")
    ]


def test_status_counts_a_role_nobody_holds_as_unhealthy(
    workers: list[Process], tmp_path: Path, nats_server: NatsServer
) -> None:
    """A role a pair ran (its state saved in the bucket) that nobody holds is a problem (exit 1), named with
    the role; while held it is shown and no problem; roles no pair ever ran are not listed."""
    cluster = f"ocsgone{uuid.uuid4().hex[:6]}"
    url = nats_server.url
    acct = tmp_path / "accounting.jsonl"
    write(acct, record(1))
    a = ocs_side(workers, tmp_path, "a", url, cluster, acct).start("holds the role now")
    wait_for(lambda: stream(url, cluster)().stop_ids() == [1], 30, "A publishes")
    roles, problems = role_problems(url, cluster)
    assert [r["role"] for r in roles] == ["ocs"] and roles[0]["holder"].endswith(f":{a.pid}"), roles
    assert roles[0]["saved"] and not roles[0]["standby"] and not problems

    a.signal(signal.SIGKILL)
    a.wait(10)
    roles, problems = wait_for(
        lambda: (r := role_problems(url, cluster))[1] and r, TTL + 10, "the lease expired"
    )
    assert problems == [
        f"role ocs of {cluster}: nobody holds it (no standby either): a takeover under way, or both down"
    ]
    p = status(url, cluster)
    assert p.returncode == 1 and "role ocs: NOBODY holds it" in p.stdout, p.stdout


def slurm_side(
    workers: list[Process], tmp_path: Path, name: str, url: str, cluster: str, slurm: SlurmCluster, ttl: int
) -> Worker:
    args = [
        "produce", "slurm", "--nats", url, "--cluster", cluster, "--state", "jetstream", "--lease-ttl", str(ttl),
        "--state-file", str(tmp_path / name / "slurm.state"), "--interval", "1", "--tz", "UTC",
        "--stream-max-bytes", str(64 << 20),
    ]  # fmt: skip
    w = Worker(args, tmp_path / f"{name}.log", slurm.env())
    workers.append(w)
    return w


class SlurmPairRun(NamedTuple):
    ids: list[int]
    """The jobs submitted: two ended before the kill, two running across it, two submitted after it."""
    view: dict[str, list[Any]]
    """The stream at the end (`bus_view`)."""
    takeover: float
    b: Worker


def slurm_pair_killed(
    workers: list[Process], tmp_path: Path, url: str, one: str, cluster: str, slurm: SlurmCluster, ttl: int
) -> SlurmPairRun:
    """A `produce slurm` pair (`url`: the servers, `one`: a member to read from) on the real Slurm, the active
    one SIGKILLed with jobs running; returns once every job's stop_job is on the stream."""
    reader = ProducerProcess(Path("."), one, cluster, [])

    def seen() -> dict[str, list[Any]]:
        return bus_view(reader.messages(), cluster)

    a = slurm_side(workers, tmp_path, "a", url, cluster, slurm, ttl).start("holds the role now", timeout=60)
    b = slurm_side(workers, tmp_path, "b", url, cluster, slurm, ttl).start(None)
    b.wait_log("standing by", timeout=60)
    early = [slurm.sbatch(None, "--mem=50M", "-J", "hb-pair-early", wrap="sleep 1") for _ in range(2)]
    across = [slurm.sbatch(None, "--mem=50M", "-J", "hb-pair-across", wrap="sleep 8") for _ in range(2)]

    def stops(ids: list[int]) -> bool:
        return set(ids) <= {e["jobId"] for e in seen()["stop_job"]}

    def starts(ids: list[int]) -> bool:
        return set(ids) <= {e["jobId"] for e in seen()["start_job"]}

    wait_for(lambda: stops(early) and starts(across), 60, "A: the early jobs ended, the others started")
    assert not stops(across)
    a.signal(signal.SIGKILL)
    killed = time.monotonic()
    a.wait(10)
    late = [slurm.sbatch(None, "--mem=50M", "-J", "hb-pair-late", wrap="sleep 1") for _ in range(2)]
    b.wait_log("holds the role now", timeout=ttl + 10)
    takeover = time.monotonic() - killed
    ids = [*early, *across, *late]
    wait_for(lambda: stops(ids), 90, "B: every job's stop_job")
    return SlurmPairRun(ids, seen(), takeover, b)


def slurm_counts(run: SlurmPairRun) -> tuple[int, int, int]:
    """(stored, lost, duplicated) of the run's jobs: jobs with their stop_job stored, jobs without one, and
    every start_job and stop_job stored more than once and every Sonar record of a step sent again as it was
    (or a second time in an end state)."""
    ids, view = run.ids, run.view
    duplicated = 0
    for kind in ("start_job", "stop_job"):
        got = [e["jobId"] for e in view[kind] if e["jobId"] in ids]
        duplicated += len(got) - len(set(got))
    stored = len({e["jobId"] for e in view["stop_job"] if e["jobId"] in ids})
    records: dict[tuple[int, str], list[bytes]] = {}
    for r in view["records"]:
        if r.job_id in ids:
            records.setdefault((r.job_id, r.job_step), []).append(msgspec.json.encode(r))
    for sent in records.values():
        duplicated += len(sent) - len(set(sent))
        final = [s for s in sent if any(f'"job_state":"{st}"'.encode() in s for st in TERMINAL_STATES)]
        duplicated += max(0, len(final) - 1)
    return stored, len(ids) - stored, duplicated


def test_the_slurm_standby_takes_over_a_killed_producer_and_publishes_each_event_and_record_once(
    workers: list[Process], tmp_path: Path, nats_server: NatsServer, slurm: SlurmCluster
) -> None:
    """Real Slurm: jobs that end before the kill, jobs running across it, jobs submitted after it. Each has
    one start_job and one stop_job on the stream, and no Sonar record of a step twice (the standby goes on
    from the dead holder's state instead of resending its lookback window)."""
    cluster = f"slurmpair{uuid.uuid4().hex[:6]}"
    url = nats_server.url
    run = slurm_pair_killed(workers, tmp_path, url, url, cluster, slurm, TTL)
    assert run.takeover <= TTL + 10, run.takeover
    assert slurm_counts(run) == (len(run.ids), 0, 0)
    assert {r.job_id for r in run.view["records"]} >= set(run.ids)  # each job has its records
    for kind in ("start_job", "stop_job"):
        assert sorted(e["jobId"] for e in run.view[kind] if e["jobId"] in run.ids) == sorted(run.ids), kind
    # the cluster envelope goes out when partitions or node states change: B's first is not A's last again
    states = [{k: v for k, v in e["data"]["attributes"].items() if k != "time"} for e in run.view["cluster"]]
    assert all(x != y for x, y in itertools.pairwise(states)), states


@pytest.mark.parametrize("table", ["slurm", "ocs"])
def test_a_state_file_path_left_in_state_is_one_line_naming_state_file(
    table: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`state` was the state file's path before the pairs: such a config stops the command (and
    `--check-config`) with one line saying where the path goes now, never a traceback."""
    config = tmp_path / "hpcbus.toml"
    config.write_text(f'[{table}]\nstate = "/var/lib/hpcbus/{table}.state"\n')
    argv = ["--check-config", "produce", table, "--cluster", "x", "--config", str(config)]
    if table == "ocs":
        argv += ["--accounting", __file__]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"[{table}] state = '/var/lib/hpcbus/{table}.state' is not one of 'file', 'jetstream'" in err, err
    assert "`state_file`" in err and "Traceback" not in err


def test_the_standby_publishes_what_the_dead_holder_wrote_ahead_each_message_once(
    workers: list[Process], tmp_path: Path, nats_server: NatsServer
) -> None:
    """The write-ahead itself, made deterministic: a holder wrote two messages ahead and died (no release)
    after publishing the first. The standby that takes over publishes both again, byte for byte with their
    ids: the stream keeps the first once (its duplicate window drops the copy) and stores the second; then
    their entries are removed."""
    cluster = f"ocsahead{uuid.uuid4().hex[:6]}"
    url = nats_server.url
    make_telemetry_stream(url, cluster)
    subject = f"{cluster}.events.job"
    sent = Message(subject, b"ahead value=1i 1700000000\n", "ahead:1")
    unsent = Message(subject, b"ahead value=2i 1700000001\n", "ahead:2")

    async def die_after_writing_ahead() -> None:
        nc = await nats.connect(url)
        stopping = Stopping()
        lease = Lease(nc, roles_bucket(cluster), "ocs", ttl=TTL)
        keeper = asyncio.create_task(lease.keep(stopping))
        await asyncio.wait_for(lease.taken(), 10)
        store = FencedStore(lease)
        pack = msgspec.msgpack.encode
        await store.apply([(f"{OUT}{1:012d}", pack(sent)), (f"{OUT}{2:012d}", pack(unsent))], (), [])
        await nc.jetstream().publish(subject, sent.payload, headers={"Nats-Msg-Id": sent.msg_id})
        keeper.cancel()  # dead: no release, the lease expires after its TTL
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        await nc.close()

    asyncio.run(die_after_writing_ahead())
    acct = tmp_path / "accounting.jsonl"
    acct.write_text("")
    b = ocs_side(workers, tmp_path, "b", url, cluster, acct).start(None)
    b.wait_log("publishing the 2 messages the previous holder had written", timeout=TTL + 10)
    reader = ProducerProcess(Path("."), url, cluster, [])
    got = wait_for(lambda: len(m := reader.messages()) >= 2 and m, 30, "both messages")
    assert sorted((p, i) for s, p, i in got if s == subject) == [
        (sent.payload, sent.msg_id),
        (unsent.payload, unsent.msg_id),
    ]
    wait_for(lambda: not any(".out." in k for k in state_keys(url, cluster)), 30, "the entries removed")


def state_keys(url: str, cluster: str) -> list[str]:
    async def read() -> list[str]:
        nc = await nats.connect(url)
        try:
            return [k for k in await FencedStore(Lease(nc, roles_bucket(cluster), "ocs")).load()]
        finally:
            await nc.close()

    return [f"state.ocs.{k}" for k in asyncio.run(read())]
