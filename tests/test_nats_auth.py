"""`hpcbus deploy nats-auth` on a real nats-server that loads the generated authorization: each identity can
do what its role needs (the real producers and workers run with their seeds, no permission refused), and the
server refuses what the role must not do (publish where another role publishes, read what it need not,
touch the dead letter or the JetStream API beyond its own streams)."""

from __future__ import annotations

import asyncio
import os
import stat
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from hpcbus import cli
from hpcbus.bus import round_trip
from hpcbus.schemas import subjects
from hpcbus.streams import deadletter_stream, ingest_stream, roles_bucket, telemetry_stream
from tests.consumer_helpers import Process, Worker, count_points, wait_for
from tests.node_fixtures import tree
from tests.services import InfluxDB, NatsServer
from tests.test_ocs_producer import record

pytestmark = pytest.mark.services

NODES = ["n001", "n002"]


class AuthNatsServer(NatsServer):
    """The test nats-server with the generated `auth.conf` included, as deploy/nats/nats-server.conf does."""

    def __init__(self, base_dir: Path, include: Path) -> None:
        super().__init__(base_dir)
        self.include = include

    def _write_config(self) -> None:
        super()._write_config()
        # nats-server resolves `include` beside the including file, as in /etc/nats/.
        (self.base_dir / "auth.conf").write_text(self.include.read_text())
        with self.config_path.open("a") as f:
            f.write('include "auth.conf"\n')


class Secured(msgspec.Struct):
    server: AuthNatsServer
    cluster: str
    out: Path

    @property
    def url(self) -> str:
        return self.server.url

    def env(self, identity: str) -> dict[str, str]:
        """The identity's environment file as written (its seed path points into `out`)."""
        lines = (self.out / f"{identity}.env").read_text().splitlines()
        return dict(line.split("=", 1) for line in lines if line)

    async def connect(self, identity: str, errors: list[str] | None = None) -> NATS:
        env = self.env(identity)
        seen = errors if errors is not None else []

        async def on_error(exc: Exception) -> None:
            seen.append(str(exc))

        return await nats.connect(
            self.url,
            nkeys_seed=env["NATS_NKEY"],
            inbox_prefix=env["NATS_INBOX_PREFIX"],
            error_cb=on_error,
            allow_reconnect=False,
            connect_timeout=5,
        )


def generate(out: Path, cluster: str, *extra: str) -> int:
    argv = ["deploy", "nats-auth", "--cluster", cluster, "--nodes", "n[001-002]", "--out", str(out)]
    return cli.main([*argv, "--seed-dir", str(out), "--cc-job-subject", "cc.job.event", *extra])


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    base = tmp_path_factory.mktemp("auth")
    cluster = f"t{uuid.uuid4().hex[:8]}.example.org"
    assert generate(base / "auth", cluster) == 0
    with AuthNatsServer(base / "nats", base / "auth" / "auth.conf") as server:
        s = Secured(server, cluster, base / "auth")
        asyncio.run(_streams(s))
        yield s


async def _streams(s: Secured) -> None:
    """The streams the workers create, made by the admin so that the refusal tests need no worker."""
    from hpcbus.streams import ensure_stream

    nc = await s.connect("admin")
    try:
        for spec in (telemetry_stream(s.cluster), deadletter_stream(s.cluster), ingest_stream(s.cluster)):
            await ensure_stream(nc.jetstream(), spec)
    finally:
        await nc.close()


def test_files_hold_no_secret_where_they_need_not_and_keys_survive_a_rerun(tmp_path: Path) -> None:
    out = tmp_path / "auth"
    assert generate(out, "fox") == 0
    conf = (out / "auth.conf").read_text()
    seed = (out / "node-n001.nk").read_text().strip()
    assert seed.startswith("SU") and seed not in conf
    assert stat.S_IMODE(os.stat(out / "node-n001.nk").st_mode) == 0o600
    env = (out / "node-n001.env").read_text()
    assert f"NATS_NKEY={out}/node-n001.nk" in env and "HPCBUS_NODE_INGEST=1" in env
    assert generate(out, "fox") == 0  # adding nothing changes nothing
    assert (out / "auth.conf").read_text() == conf
    assert generate(out, "fox", "--rotate") == 0
    assert (out / "node-n001.nk").read_text().strip() != seed
    assert (out / "auth.conf").read_text() != conf


def test_bad_host_list_is_a_settings_error(tmp_path: Path) -> None:
    rc = cli.main(["deploy", "nats-auth", "--cluster", "fox", "--nodes", "n[3-1]", "--out", str(tmp_path)])
    assert rc == 2


def test_a_broken_seed_file_or_out_directory_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "auth"
    assert generate(out, "fox") == 0
    conf = (out / "auth.conf").read_text()
    (out / "node-n002.nk").write_text("not a seed\n")
    capsys.readouterr()
    assert generate(out, "fox") == 1
    err = capsys.readouterr().err
    assert f"{out}/node-n002.nk: not an nkey seed" in err and "--rotate" in err
    assert (out / "auth.conf").read_text() == conf  # nothing half-written
    (tmp_path / "file").write_text("")
    assert generate(tmp_path / "file" / "auth", "fox") == 1
    err = capsys.readouterr().err
    assert "--out" in err and "Traceback" not in err


def test_an_unknown_key_cannot_connect(secured: Secured, tmp_path: Path) -> None:
    from hpcbus.commands.deploy.nats_auth import new_seed

    stranger = tmp_path / "stranger.nk"
    stranger.write_bytes(new_seed())

    async def go() -> None:
        await nats.connect(secured.url, nkeys_seed=str(stranger), allow_reconnect=False, connect_timeout=5)

    with pytest.raises(Exception, match=r"(?i)authorization"):
        asyncio.run(go())


Action = Callable[[NATS], Awaitable[object]]


def pub(subject: str) -> Action:
    async def act(nc: NATS) -> None:
        await nc.publish(subject, b"x,hostname=n001,type=node value=1 1700000000\n")

    return act


def sub(subject: str) -> Action:
    async def act(nc: NATS) -> None:
        await nc.subscribe(subject)

    return act


def refusals(c: str) -> list[tuple[str, str, Action]]:
    """(identity, what, action) the server must refuse."""
    T, D, R = telemetry_stream(c).name, deadletter_stream(c).name, roles_bucket(c)
    return [
        ("node-n001", "publish the cluster's metrics directly", pub(subjects.metrics(c))),
        ("node-n001", "publish on another node's ingest subject", pub(f"{c}.ingest.n002.metrics")),
        ("node-n001", "send cc-backend job events", pub(f"{c}.ingest.n001.events.job")),
        ("node-n001", "send Sonar job records", pub(f"{c}.ingest.n001.sonar.job")),
        ("node-n001", "send Slurm records as events", pub(f"{c}.ingest.n001.events.slurm")),
        ("node-n001", "send an event class no node sends", pub(f"{c}.ingest.n001.events.nodestate")),
        ("node-n001", "read the cluster's metrics", sub(subjects.metrics(c))),
        ("node-n001", "read another identity's replies", sub("_INBOX.worker-influx.>")),
        ("node-n001", "create streams", pub(f"$JS.API.STREAM.CREATE.{T}")),
        ("master", "publish on a node's ingest subject", pub(f"{c}.ingest.n001.metrics")),
        ("master", "write the dead letter", pub(f"{c}.deadletter.metrics")),
        ("gateway", "send cc-backend job events", pub(subjects.events(c, "job"))),
        ("worker-influx", "publish measurements", pub(subjects.metrics(c))),
        ("worker-influx", "send cc-backend job events", pub(subjects.events(c, "job"))),
        ("worker-influx", "delete a stream", pub(f"$JS.API.STREAM.DELETE.{T}")),
        ("worker-ingest", "send cc-backend job events", pub(subjects.events(c, "job"))),
        ("worker-jobs", "publish measurements", pub(subjects.metrics(c))),
        ("reader", "publish anything", pub(subjects.log(c, "x"))),
        ("reader", "read the dead letter", sub(subjects.deadletter_wildcard(c))),
        ("reader", "purge a stream", pub(f"$JS.API.STREAM.PURGE.{D}")),
        ("inject", "write the dead letter", pub(f"{c}.deadletter.metrics")),
        ("monitor", "publish measurements", pub(subjects.metrics(c))),
        ("monitor", "publish self-telemetry", pub(subjects.telemetry(c))),
        ("monitor", "acknowledge a worker's message", pub(f"$JS.ACK.{T}.hpcbus-influx.1.1.1.1700000000.0")),
        ("monitor", "create a durable", pub(f"$JS.API.CONSUMER.DURABLE.CREATE.{T}.mine")),
        ("monitor", "delete a consumer", pub(f"$JS.API.CONSUMER.DELETE.{T}.hpcbus-influx")),
        ("monitor", "purge a stream", pub(f"$JS.API.STREAM.PURGE.{T}")),
        ("monitor", "read the dead letter", sub(subjects.deadletter_wildcard(c))),
        (
            "monitor",
            "read the jobs worker's state",
            pub(f"$JS.API.DIRECT.GET.KV_{R}.$KV.{R}.state.jobs.meta"),
        ),
        ("monitor", "take a role", pub(f"$KV.{R}.lease.jobs")),
        ("master", "take the jobs worker's role", pub(f"$KV.{R}.lease.jobs")),
        ("worker-influx", "write the jobs worker's state", pub(f"$KV.{R}.state.jobs.meta")),
        # job summaries are the jobs worker's alone: `consume influx` writes a job_summary point of each
        ("gateway", "send job summaries", pub(subjects.jobsummary(c))),
        ("master", "send job summaries", pub(subjects.jobsummary(c))),
        ("worker-sonar", "send job summaries", pub(subjects.jobsummary(c))),
        ("worker-ingest", "send job summaries", pub(subjects.jobsummary(c))),
        ("worker-influx", "send job summaries", pub(subjects.jobsummary(c))),
    ]


@pytest.mark.parametrize(
    "index", range(len(refusals("c"))), ids=[f"{who}: {what}" for who, what, _ in refusals("c")]
)
def test_each_role_is_refused_what_it_must_not_do(secured: Secured, index: int) -> None:
    identity, what, action = refusals(secured.cluster)[index]

    async def go() -> list[str]:
        errors: list[str] = []
        nc = await secured.connect(identity, errors)
        try:
            await action(nc)
            await round_trip(nc, 5)
            await wait_refused(errors)
        finally:
            await nc.close()
        return errors

    errors = asyncio.run(go())
    assert any(violation(e) for e in errors), f"{identity} could {what}: {errors}"


def violation(text: str) -> bool:
    return "permissions violation" in text.lower()


async def wait_refused(errors: list[str], timeout: float = 10.0) -> None:
    """Wait for the server's `-ERR 'Permissions Violation ...'` (sent right after the refused operation)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not any(violation(e) for e in errors) and loop.time() < deadline:
        await asyncio.sleep(0.02)


def test_refused_publish_is_not_delivered_and_allowed_ones_are(secured: Secured) -> None:
    """A reader sees the injection user's line, the master's job event and the jobs worker's summary, never
    the node's direct publish nor the master's or the gateway's summary: each identity's refused message is
    dropped by the server, its allowed one delivered."""
    c = secured.cluster

    async def go() -> list[tuple[str, bytes]]:
        got: list[tuple[str, bytes]] = []
        reader = await secured.connect("reader")
        node = await secured.connect("node-n001")
        inject = await secured.connect("inject")
        master = await secured.connect("master")
        jobs = await secured.connect("worker-jobs")
        gateway = await secured.connect("gateway")
        try:

            async def on(msg: Msg) -> None:
                got.append((msg.subject, msg.data))

            await reader.subscribe(subjects.metrics(c), cb=on)
            await reader.subscribe(subjects.wildcard(c, "events"), cb=on)
            await reader.subscribe("cc.job.event", cb=on)
            await round_trip(reader, 5)
            await node.publish(subjects.metrics(c), b"forged")
            await round_trip(node, 5)
            await inject.publish(subjects.metrics(c), b"injected")
            await master.publish(subjects.events(c, "job"), b"job event")
            await master.publish("cc.job.event", b"cc job event")
            await master.publish(subjects.jobsummary(c), b"master's summary")
            await gateway.publish(subjects.jobsummary(c), b"gateway's summary")
            await jobs.publish(subjects.jobsummary(c), b"summary")
            for nc in (inject, master, gateway, jobs):
                await round_trip(nc, 5)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 10
            while len(got) < 4 and loop.time() < deadline:
                await asyncio.sleep(0.02)
            await round_trip(reader, 5)  # whatever the server had sent the reader is read by now
        finally:
            for nc in (reader, node, inject, master, jobs, gateway):
                await nc.close()
        return got

    got = asyncio.run(go())
    assert sorted(data for _, data in got) == [b"cc job event", b"injected", b"job event", b"summary"]


async def _control_reply(s: Secured) -> str:
    """The injection user asks node n001 for its interval (request/reply on `<cluster>.control.get`)."""
    nc = await s.connect("inject")
    try:
        request = 'config,hostname=n001,method=GET,type=node,type-id=0 control="interval"'
        reply = await nc.request(subjects.control(s.cluster, "get"), request.encode(), timeout=10)
        assert b"status=ok" in reply.data, reply.data
        return reply.data.decode()
    finally:
        await nc.close()


async def _stored_on(s: Secured, subject: str) -> bool:
    """Whether the telemetry stream holds a message on `subject` (read as admin)."""
    nc = await s.connect("admin")
    try:
        await nc.jetstream().get_last_msg(telemetry_stream(s.cluster).name, subject)
        return True
    except nats.js.errors.NotFoundError:
        return False
    finally:
        await nc.close()


def test_the_real_pipeline_runs_with_least_privilege(
    secured: Secured, influxdb: InfluxDB, tmp_path: Path, workers: list[Process]
) -> None:
    """Node (through ingest), master (OCS), the ingest, two InfluxDB groups and Sonar workers, each role with its own seed:
    the node's samples and the master's job events reach InfluxDB, the Sonar translator publishes its
    envelopes, the node answers a control request, and no one was refused anything it does."""
    c, url = secured.cluster, secured.url
    db = f"auth_{uuid.uuid4().hex[:8]}"
    bus = ["--nats", url, "--cluster", c]
    accounting = tmp_path / "accounting.jsonl"
    accounting.write_text(record(1) + "\n")
    influx_args = ["consume", "influx", *bus, "--influx-url", influxdb.url]
    runs = {
        "worker-ingest": Worker(
            ["consume", "ingest", *bus], tmp_path / "ingest.log", secured.env("worker-ingest")
        ),
        "worker-influx": Worker(
            [*influx_args, "--db", db, "--stats-seconds", "0.5", "--peers", "hpcbus-influx-b"],
            tmp_path / "influx.log",
            secured.env("worker-influx"),
        ),
        # A second group for a second InfluxDB (here another database), with the same identity: its own
        # durable, created by whichever group binds first ([delivery] peers).
        "worker-influx-b": Worker(
            [*influx_args, "--db", f"{db}_b", "--durable", "hpcbus-influx-b", "--peers", "hpcbus-influx"],
            tmp_path / "influx-b.log",
            secured.env("worker-influx"),
        ),
        "node-n001": Worker(
            ["produce", "node", *bus, "--root", str(tree(tmp_path)), "--interval", "1", "--hostname", "n001"],
            tmp_path / "node.log",
            secured.env("node-n001"),
        ),
        "master": Worker(
            ["produce", "ocs", *bus, "--accounting", str(accounting), "--interval", "0.2"],
            tmp_path / "ocs.log",
            secured.env("master"),
        ),
        "worker-sonar": Worker(
            ["consume", "sonar", *bus, "--directory", str(tmp_path / "sonar")],
            tmp_path / "sonar.log",
            secured.env("worker-sonar"),
        ),
    }
    for name, w in runs.items():
        workers.append(w)
        w.start(ready="consuming" if name.startswith("worker") else None, timeout=60)

    where = "WHERE hostname = 'n001'"
    wait_for(lambda: count_points(influxdb, db, "mem_used", where) >= 2, 90, "node samples in InfluxDB")
    wait_for(lambda: count_points(influxdb, f"{db}_b", "mem_used", where) >= 2, 90, "and in the second copy")
    wait_for(
        lambda: influxdb.points('SELECT count("event") FROM "job"', db),
        90,
        "the master's job events in InfluxDB",
    )
    # the workers' own counters go to <cluster>.telemetry, which they may publish on (not <cluster>.metrics)
    wait_for(
        lambda: count_points(influxdb, db, "hpcbus_received", "WHERE \"stype-id\" = 'hpcbus-influx'"),
        90,
        "the InfluxDB worker's own counters in InfluxDB",
    )
    assert asyncio.run(_control_reply(secured)).startswith("config,")
    wait_for(lambda: asyncio.run(_stored_on(secured, subjects.sonar(c, "sample"))), 90, "Sonar envelopes")
    for name, w in runs.items():
        assert w.terminate() == 0, w.log()
        text = w.log()
        refused = [line for line in text.splitlines() if violation(line)]
        assert not refused, f"{name} was refused what it needs:\n{text}"
        assert "Traceback" not in text, text


def monitor_status(secured: Secured) -> dict[str, Any]:
    """`hpcbus status --json` run with the monitor's seed (its env file names the cluster): the report,
    after checking that it ran and that the server refused it nothing."""
    import json
    import subprocess
    import sys

    from tests.consumer_helpers import ROOT

    env = {**os.environ, **secured.env("monitor"), "NATS_URL": secured.url}
    p = subprocess.run(
        [sys.executable, "-m", "hpcbus", "status", "--json", "--rate-seconds", "0"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert p.returncode in (0, 1), p.stderr
    assert "violation" not in p.stderr.lower(), p.stderr
    report: dict[str, Any] = json.loads(p.stdout)
    return report


def test_a_jobs_worker_pair_runs_with_least_privilege_and_the_monitor_sees_who_holds_the_role(
    secured: Secured, influxdb: InfluxDB, tmp_path: Path, workers: list[Process]
) -> None:
    """Two `consume jobs --state jetstream` with the `worker-jobs` seed: one takes the lease, creating the
    roles bucket, and loads and saves its state there; the other stands by; neither is refused anything;
    `hpcbus status` with the monitor's seed shows the holder."""

    c, url = secured.cluster, secured.url
    args = ["consume", "jobs", "--nats", url, "--cluster", c, "--influx-url", influxdb.url, "--db", "pairs"]
    args += ["--state", "jetstream", "--lease-ttl", "3", "--ack-wait", "2", "--window", "5"]
    a = Worker(args, tmp_path / "a.log", secured.env("worker-jobs"))
    b = Worker(args, tmp_path / "b.log", secured.env("worker-jobs"))
    workers += [a, b]
    a.start("consuming", timeout=60)
    b.start(None).wait_log("standing by", timeout=60)
    asyncio.run(
        _inject_line(
            secured,
            subjects.metrics(c),
            b"job_processes,hostname=n001,job=7,type=node,type-id=0,user=u value=1i 1700000000\n",
        )
    )
    (cluster,) = monitor_status(secured)["clusters"]
    (role,) = cluster["roles"]
    assert role["role"] == "jobs" and role["holder"].endswith(f":{a.pid}") and role["ttl_s"] == 3
    assert role["standby"].endswith(f":{b.pid}") and role["standby_seen_s"] < 3

    async def saved() -> bytes | None:
        nc = await secured.connect("admin")
        try:
            kv = await nc.jetstream().key_value(roles_bucket(c))
            return (await kv.get("state.jobs.meta")).value
        finally:
            await nc.close()

    assert asyncio.run(saved())  # A saved its state in the bucket, under its lease's fence
    stop_pair(a, b)


def stop_pair(holder: Worker, standby: Worker) -> None:
    """Both of a pair stop cleanly, neither was refused anything nor logged a traceback, and the holder
    released its lease on the way out."""
    assert standby.terminate() == 0 and holder.terminate() == 0
    for w in (holder, standby):
        text = w.log()
        assert not [line for line in text.splitlines() if violation(line)], text
        assert "Traceback" not in text, text
    assert "released" in holder.log()


def test_a_producer_pair_runs_with_the_master_seed_and_the_monitor_sees_who_holds_the_role(
    secured: Secured, tmp_path: Path, workers: list[Process]
) -> None:
    """Two `produce ocs --state jetstream` with the `master` seed: one takes the `ocs` lease and writes its
    state and messages ahead in the roles bucket, the other stands by; neither is refused anything; `hpcbus
    status` with the monitor's seed shows the holder and the standby."""
    c, url = secured.cluster, secured.url
    acct = tmp_path / "accounting.jsonl"
    acct.write_text(record(77) + "\n")
    args = ["produce", "ocs", "--nats", url, "--cluster", c, "--accounting", str(acct), "--interval", "0.2"]
    args += ["--state", "jetstream", "--lease-ttl", "3"]
    a = Worker(args, tmp_path / "ocs-a.log", secured.env("master"))
    b = Worker(args, tmp_path / "ocs-b.log", secured.env("master"))
    workers += [a, b]
    a.start("holds the role now", timeout=60)
    b.start(None).wait_log("standing by", timeout=60)

    def ocs_role() -> dict[str, Any] | None:
        (cluster,) = monitor_status(secured)["clusters"]
        roles = {r["role"]: r for r in cluster["roles"]}
        role = roles.get("ocs")
        return role if role and role["standby"] and role["saved"] else None

    role = wait_for(ocs_role, 30, "the ocs role with its standby")
    assert role["holder"].endswith(f":{a.pid}") and role["standby"].endswith(f":{b.pid}")
    stop_pair(a, b)


def test_an_inbox_prefix_that_is_no_subject_is_a_settings_error() -> None:
    rc = cli.main(["pub", "--cluster", "fox", "--inbox-prefix", "_INBOX.a b", "fox.log.x", "body"])
    assert rc == 2


def test_the_monitor_identity_runs_status_and_tail_and_cannot_publish(
    secured: Secured, tmp_path: Path
) -> None:
    """`hpcbus status` and `hpcbus tail` with the monitor's seed: status reads streams, durables and the
    stream's messages without a refusal, tail prints what another identity published, and the monitor's own
    publish to a data subject is refused and never delivered."""
    import sys

    c = secured.cluster
    env = {**os.environ, **secured.env("monitor"), "NATS_URL": secured.url}  # monitor.env names the cluster
    asyncio.run(
        _inject_line(
            secured, subjects.metrics(c), b"cpu_load,hostname=n001,type=node,type-id=0 value=1 1700000000\n"
        )
    )
    report = monitor_status(secured)
    (cluster,) = report["clusters"]
    assert (
        cluster["streams"][0]["name"] == telemetry_stream(c).name and cluster["streams"][0]["messages"] >= 1
    )
    assert cluster["deadletters"] is not None

    log = tmp_path / "tail.log"
    tail = Process(
        [sys.executable, "-m", "hpcbus", "tail", subjects.metrics(c), "--count", "1"], log, env=env
    )
    tail.start()
    try:
        line = b"mem_used,hostname=n002,type=node,type-id=0 value=5 1700000001\n"

        def printed() -> bool:
            asyncio.run(_inject_line(secured, subjects.metrics(c), line))
            return "mem_used,hostname=n002" in tail.log()

        wait_for(printed, 30, "tail to print the injected line")
        assert tail.wait(10) == 0, tail.log()
    finally:
        tail.stop()

    async def monitor_publishes() -> tuple[list[str], int]:
        errors: list[str] = []
        admin = await secured.connect("admin")
        mon = await secured.connect("monitor", errors)
        try:
            seen = await admin.subscribe(subjects.metrics(c))
            await round_trip(admin, 5)
            await mon.publish(subjects.metrics(c), b"forged,hostname=n001 value=1 1700000000\n")
            await round_trip(mon, 5)
            await wait_refused(errors)
            await round_trip(
                admin, 5
            )  # after the monitor's round trip: a delivered message would be here by now
            return errors, seen.pending_msgs
        finally:
            await mon.close()
            await admin.close()

    errors, delivered = asyncio.run(monitor_publishes())
    assert any(violation(e) for e in errors) and delivered == 0


async def _inject_line(secured: Secured, subject: str, line: bytes) -> None:
    nc = await secured.connect("inject")
    try:
        await nc.publish(subject, line)
        await round_trip(nc, 5)
    finally:
        await nc.close()


def test_pub_says_a_publish_the_server_refuses_is_not_sent(secured: Secured) -> None:
    """Issue 33 item 3: with a node identity, `hpcbus pub` to another node's subject (JetStream: the ingest
    stream stores it) and to a subject no stream stores (core NATS) is refused by the server: exit 1 with the
    server's reason, never `sent on ...` / `stored as ...`."""
    import subprocess
    import sys

    from tests.consumer_helpers import ROOT

    c = secured.cluster
    env = {**os.environ, **secured.env("node-n001"), "NATS_URL": secured.url}
    line = "mem_used,hostname=n002,type=node value=1 1700000000"
    for subject in (f"{c}.ingest.n002.metrics", f"{c}.control.put"):
        p = subprocess.run(
            [sys.executable, "-m", "hpcbus", "pub", "--raw", "--cluster", c, subject, line],
            capture_output=True,
            text=True,
            env=env,
            cwd=ROOT,
            timeout=60,
        )
        assert p.returncode == 1, (subject, p.returncode, p.stderr)
        assert "permissions violation" in p.stderr.lower() and "sent on" not in p.stderr, p.stderr
        assert "stored as" not in p.stderr and "Traceback" not in p.stderr, p.stderr
