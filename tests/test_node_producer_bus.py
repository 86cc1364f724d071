"""`hpcbus produce node` against a real nats-server: control GET/PUT by request/reply, a broker outage in the
middle of a run (every sample taken arrives exactly once, in order), and SIGTERM of the real command.

Samples are read from fixture trees (fast, and the same values every time) at a 1 s interval.
"""

from __future__ import annotations

import asyncio
import datetime
import itertools
import json
import re
import time
from collections import Counter
from pathlib import Path

import msgspec
import nats
import pytest

from hpcbus.outbox import OutboxSettings
from hpcbus.producers.node import NodeCollectorConfig
from hpcbus.producers.node.agent import NodeAgent
from hpcbus.producers.node.pipeline import AgentConfig
from hpcbus.schemas.lineprotocol import parse_payload
from hpcbus.schemas.translate import Assembler, SampleHeader, msg_id
from hpcbus.schemas.translate.common import epoch_of
from hpcbus.settings import BusSettings
from hpcbus.streams import stream_name
from tests.consumer_helpers import Worker, bus_messages, stream_messages, wait_for, wait_for_async
from tests.node_fixtures import tree

pytestmark = pytest.mark.services


async def cluster_messages(url: str, cluster: str) -> list:
    """Every message stored in the cluster's stream, in order."""
    return await stream_messages(url, stream_name("HPCBUS", cluster))


def sample_times(msgs: list, cluster: str) -> list[int]:
    """Timestamps of the sample skeleton events in the stream, one per stored sample."""
    times = []
    for m in msgs:
        if m.subject == f"{cluster}.events.sample":
            for line in parse_payload(m.data, now=0).lines:
                header = msgspec.json.decode(str(line.fields["event"]), type=SampleHeader)
                assert header.skeleton.data is not None
                times.append(line.time)
    return times


def assert_ids_are_content_ids(msgs: list) -> None:
    ids = [m.headers["Nats-Msg-Id"] for m in msgs]
    assert len(ids) == len(set(ids))  # no message stored twice
    for m in msgs:
        assert m.headers["Nats-Msg-Id"] == msg_id(m.subject, m.data)


def make_agent(url: str, cluster: str, root: Path, **agent_options) -> NodeAgent:
    agent_options.setdefault("interval", 1.0)
    agent_options.setdefault("stream_max_bytes", 64 * 2**20)  # the test server allows 2 GB in all
    return NodeAgent(
        BusSettings(nats=[url], cluster=cluster),
        NodeCollectorConfig(root=str(root), gpus=False),
        AgentConfig(hostname="c1-10", **agent_options),
        OutboxSettings(publish_timeout=2.0),
    )


# --- control ---------------------------------------------------------------------------------------------


async def test_control_get_put_over_nats(nats_factory, tmp_path):
    server = nats_factory()
    cluster = "ctl.node.test"
    agent = make_agent(server.url, cluster, tree(tmp_path))
    taken: list[float] = []
    agent.on_sample = lambda s: taken.append(s.time)
    stopping = asyncio.Event()
    run = asyncio.create_task(agent.run(stopping))
    nc = await nats.connect(server.url)
    get_subject, put_subject = f"{cluster}.control.get", f"{cluster}.control.put"

    async def ask(subject: str, text: str, timeout: float = 2.0):
        msg = await nc.request(subject, text.encode(), timeout=timeout)
        (line,) = parse_payload(msg.data, now=0).lines
        return line.tags["status"], json.loads(line.fields["control"])

    async def answered():
        try:
            return await ask(get_subject, 'config,hostname=c1-10,method=GET control="interval"', 0.5)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError):
            return None

    try:
        assert await wait_for_async(answered, 20, "the agent to answer") == ("ok", {"interval": 1.0})
        status, config = await ask(
            get_subject, 'config,hostname=c1-10,method=GET,type=node,type-id=0 control=""'
        )
        assert status == "ok" and config["hostname"] == "c1-10" and config["cluster"] == cluster
        assert config["node"]["root"].endswith("hpc") and config["state"]["connected"] is True

        assert await ask(put_subject, 'config,hostname=c1-10,method=PUT control="interval=2"') == (
            "ok",
            {"interval": 2.0},
        )
        status, err = await ask(put_subject, 'config,hostname=c1-10,method=PUT control="interval=abc"')
        assert status == "error" and "not a number" in err["error"]
        status, err = await ask(put_subject, 'config,hostname=c1-10,method=PUT control="interval=-5"')
        assert status == "error" and "between" in err["error"]
        assert await ask(get_subject, 'config,hostname=c1-10,method=GET control="interval"') == (
            "ok",
            {"interval": 2.0},
        )  # the bad PUTs changed nothing
        with pytest.raises(nats.errors.TimeoutError):  # another host's request: this agent stays silent
            await nc.request(
                put_subject, b'config,hostname=c9-99,method=PUT control="interval=5"', timeout=0.5
            )
        assert agent.interval == 2.0

        # the new interval is in force: samples on the 2 s grid from now on
        n = len(taken)
        await wait_for_async(lambda: len(taken) >= n + 3, 15, "three samples at the new interval")
        later = taken[n:]
        assert all(b - a == 2.0 for a, b in itertools.pairwise(later[1:]))  # [0] may predate the PUT
        assert all(t % 2 == 0 for t in later[1:])
    finally:
        stopping.set()
        assert await asyncio.wait_for(run, 10) == 0
        await nc.close()


# --- outage ---------------------------------------------------------------------------------------------------


async def test_broker_outage_loses_nothing_and_duplicates_nothing(nats_factory, tmp_path):
    server = nats_factory()
    cluster = "outage.node.test"
    agent = make_agent(server.url, cluster, tree(tmp_path))
    taken: list[int] = []
    agent.on_sample = lambda s: taken.append(int(s.time))
    stopping = asyncio.Event()
    run = asyncio.create_task(agent.run(stopping))

    async def stored(n: int):
        return len(sample_times(await cluster_messages(server.url, cluster), cluster)) >= n

    try:
        await wait_for_async(lambda: stored(2), 20, "two samples stored")
        server.stop()  # JetStream store kept on disk
        down_at = len(taken)
        await wait_for_async(lambda: len(taken) >= down_at + 3, 20, "three samples taken while NATS is down")
        assert agent.outbox is not None and len(agent.outbox) >= 3  # queued, not lost
        server.start()
        back_at = len(taken)
        await wait_for_async(
            lambda: len(taken) >= back_at + 2 and agent.outbox is not None and len(agent.outbox) == 0,
            30,
            "the backlog to drain",
        )
    finally:
        stopping.set()
        assert await asyncio.wait_for(run, 15) == 0
    msgs = await cluster_messages(server.url, cluster)
    times = sample_times(msgs, cluster)
    assert Counter(times) == Counter(taken)  # every sample taken, exactly once
    assert times == sorted(times)  # and in order
    assert len(taken) >= 7 and len(set(taken)) == len(taken)
    metrics = [m for m in msgs if m.subject == f"{cluster}.metrics"]
    metric_times = Counter(parse_payload(m.data, now=0).lines[0].time for m in metrics)
    assert metric_times == Counter(taken)  # one metrics message per sample, none twice
    assert_ids_are_content_ids(msgs)
    assert any(m.subject == f"{cluster}.events.sysinfo" for m in msgs)  # sysinfo at start


# --- SIGTERM of the real command ----------------------------------------------------------------------------


def test_sigterm_flushes_and_exits_0(nats_server, tmp_path):
    cluster = "sigterm.node.test"
    root = tree(tmp_path)
    config = tmp_path / "node.toml"
    config.write_text("[node]\ngpus = false\n\n[node_agent]\nstream_max_bytes = 67108864\n")
    args = ["produce", "node", "--nats", nats_server.url, "--cluster", cluster, "--interval", "1"]
    args += ["--root", str(root), "--hostname", "c1-10", "--config", str(config)]
    agent = Worker(args, tmp_path / "agent.log").start(ready=None)
    try:

        def stored() -> int:
            assert agent.running(), agent.log()
            return len(sample_times(bus_messages(nats_server.url, cluster), cluster))

        # SIGTERM right after the third sample is stored: inside the interval before the fourth.
        wait_for(lambda: stored() >= 3, 30, agent.log)
        sent = time.monotonic()
        rc = agent.terminate(15)
        elapsed = time.monotonic() - sent
    finally:
        agent.stop()
    text = agent.log()
    assert rc == 0, text
    assert elapsed < 5.0, text
    m = re.search(r"stopped after (\d+) samples; last sample at (\S+); (\d+) messages sent, 0 unsent", text)
    assert m, text
    samples = int(m[1])
    last = int(datetime.datetime.fromisoformat(m[2].replace("Z", "+00:00")).timestamp())
    times = sample_times(bus_messages(nats_server.url, cluster), cluster)
    assert times[-1] == last  # the last sample taken is stored
    assert len(times) == samples == len(set(times))  # and every one before it, once


# --- message size ---------------------------------------------------------------------------------------------


async def test_messages_fit_a_small_max_payload_even_when_built_before_connecting(nats_factory, tmp_path):
    """Samples taken before the agent knew the server's limit (it was down) are cut at publish time; every
    sample still arrives complete (the assembler rebuilds each envelope from the stored lines)."""
    limit = 4096
    server = nats_factory(max_payload=limit)
    server.stop()  # the agent starts while NATS is down: the first samples are batched for 1 MiB
    cluster = "small.node.test"
    agent = make_agent(server.url, cluster, tree(tmp_path))
    taken: list[int] = []
    agent.on_sample = lambda s: taken.append(int(s.time))
    stopping = asyncio.Event()
    run = asyncio.create_task(agent.run(stopping))
    try:
        await wait_for_async(lambda: len(taken) >= 2, 20, "two samples taken offline")
        server.start()
        n = len(taken)
        await wait_for_async(
            lambda: len(taken) >= n + 2 and agent.outbox is not None and len(agent.outbox) == 0,
            30,
            "two more samples, all sent",
        )
    finally:
        stopping.set()
        assert await asyncio.wait_for(run, 15) == 0
    msgs = await cluster_messages(server.url, cluster)
    assert msgs and all(len(m.data) <= limit for m in msgs)
    assert_ids_are_content_ids(msgs)
    asm = Assembler()
    done = []
    for m in msgs:
        done += asm.add_lines(parse_payload(m.data, now=0).lines, cluster=cluster, now=0.0)
    done += asm.flush_all()
    complete = sorted(epoch_of(a.envelope.data.attributes.time) for a in done if a.complete)
    assert complete == taken and agent.oversized == 0


async def test_spilled_samples_survive_a_restart_of_the_agent(nats_factory, tmp_path):
    """NATS down for a whole agent run: with a spill directory, the next run sends what the first one took."""
    server = nats_factory()
    server.stop()
    cluster = "spill.node.test"
    root = tree(tmp_path)
    spill = tmp_path / "spill"

    def spilling_agent() -> NodeAgent:
        agent = make_agent(server.url, cluster, root, stop_timeout=1.0)
        agent.outbox_settings = OutboxSettings(spill_dir=str(spill), publish_timeout=2.0)
        return agent

    first = spilling_agent()
    taken: list[int] = []
    first.on_sample = lambda s: taken.append(int(s.time))
    stopping = asyncio.Event()
    run = asyncio.create_task(first.run(stopping))
    await wait_for_async(lambda: len(taken) >= 2, 20, "two samples taken offline")
    stopping.set()
    assert await asyncio.wait_for(run, 10) == 0
    assert len(list(spill.glob("*.msg"))) >= 2 * len(taken)  # skeleton + metrics per sample, on disk

    server.start()
    second = spilling_agent()
    second.on_sample = lambda s: taken.append(int(s.time))
    stopping = asyncio.Event()
    run = asyncio.create_task(second.run(stopping))
    try:
        n = len(taken)
        await wait_for_async(
            lambda: len(taken) > n and second.outbox is not None and len(second.outbox) == 0,
            30,
            "the spilled samples and a new one sent",
        )
    finally:
        stopping.set()
        assert await asyncio.wait_for(run, 10) == 0
    times = sample_times(await cluster_messages(server.url, cluster), cluster)
    assert Counter(times) == Counter(taken)
    assert not list(spill.glob("*.msg"))
