"""Stream settings of `[bus]` (replicas, storage, placement tags) on real servers: `auto` replicas are 1 on a
single nats-server and 3 on a 3-node cluster, every setting reaches the stream a command creates, and a
stream that exists with other settings is reported by name, setting and both values, and left unchanged."""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from nats.js.api import StreamInfo

from hpcbus.retry import Stopping
from hpcbus.service import Service
from hpcbus.settings import BusSettings, SettingsError, add_bus_arguments, bus_settings
from hpcbus.streams import StreamSpec, auto_replicas, ensure_stream, for_bus, telemetry_stream
from tests.services import NatsServer
from tests.services.nats_cluster import NatsCluster

pytestmark = pytest.mark.services


@pytest.fixture(scope="module")
def nats_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsCluster]:
    with NatsCluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


def parse(argv: list[str], environ: dict[str, str] | None = None) -> BusSettings:
    parser = argparse.ArgumentParser()
    add_bus_arguments(parser)
    return bus_settings(parser.parse_args(argv), environ or {})


def test_flags_environment_and_file(tmp_path: Path) -> None:
    assert parse([]).stream_replicas == 0  # auto
    s = parse(
        ["--stream-replicas", "3", "--stream-storage", "memory", "--stream-placement-tags", "ssd,rack1"]
    )
    assert (s.stream_replicas, s.stream_storage, s.stream_placement_tags) == (3, "memory", ["ssd", "rack1"])
    env = {
        "HPCBUS_STREAM_REPLICAS": "5",
        "HPCBUS_STREAM_STORAGE": "file",
        "HPCBUS_STREAM_PLACEMENT_TAGS": "a",
    }
    s = parse([], env)
    assert (s.stream_replicas, s.stream_storage, s.stream_placement_tags) == (5, "file", ["a"])
    config = tmp_path / "hpcbus.toml"
    config.write_text('[bus]\nstream_replicas = 3\nstream_storage = "memory"\n')
    assert parse(["--config", str(config)]).stream_replicas == 3
    assert parse(["--config", str(config), "--stream-replicas", "1"]).stream_replicas == 1

    config.write_text('[bus]\nstream_storage = "disk"\n')
    with pytest.raises(SettingsError, match=r"stream_storage.*'file', 'memory'"):
        parse(["--config", str(config)])
    config.write_text("[bus]\nstream_replicas = 7\n")
    with pytest.raises(SettingsError, match="stream_replicas"):
        parse(["--config", str(config)])


def test_auto_replicas_follow_the_server_info() -> None:
    assert auto_replicas({}) == 1
    assert auto_replicas({"cluster": "c", "connect_urls": ["a:1", "b:1", "c:1", "d:1", "e:1"]}) == 3
    assert auto_replicas({"cluster": "c", "connect_urls": ["a:1", "b:1"]}) == 2
    assert auto_replicas({"cluster": "c"}) == 3  # no_advertise: the cluster size is not told


async def _create_with_service(urls: list[str], spec: StreamSpec, bus_args: list[str]) -> StreamInfo:
    """Run a `Service` (the runtime every command runs on) with `spec` until the stream exists."""
    bus = parse(["--nats", ",".join(urls), "--cluster", "x", *bus_args])
    service = Service(bus, "stream-settings-test", streams=[spec], stopping=Stopping(3.0))
    found: list[StreamInfo] = []

    async def body(nc: nats.NATS) -> None:
        js = nc.jetstream()
        while not found:
            try:
                found.append(await js.stream_info(spec.name))
            except nats.js.errors.NotFoundError:
                await asyncio.sleep(0.1)

    assert await asyncio.wait_for(service.run(body, signals=False), 60) == 0
    return found[0]


def storage(info: StreamInfo) -> str:
    """The storage the server reports (nats-py leaves it a string in answers)."""
    return str(getattr(info.config.storage, "value", info.config.storage))


def test_auto_is_one_replica_on_a_single_server(nats_server: NatsServer, cluster: str) -> None:
    info = asyncio.run(_create_with_service([nats_server.url], telemetry_stream(cluster), []))
    assert info.config.num_replicas == 1


def test_auto_is_three_replicas_on_a_cluster_and_settings_reach_the_stream(
    nats_cluster: NatsCluster, cluster: str
) -> None:
    info = asyncio.run(_create_with_service(nats_cluster.urls, telemetry_stream(cluster), []))
    assert info.config.num_replicas == 3
    assert info.cluster is not None and len(info.cluster.replicas or []) == 2  # two followers
    assert storage(info) == "file"

    other = telemetry_stream(cluster + "b")
    info = asyncio.run(
        _create_with_service(
            nats_cluster.urls, other, ["--stream-replicas", "1", "--stream-storage", "memory"]
        )
    )
    assert info.config.num_replicas == 1
    assert storage(info) == "memory"


def test_placement_tags_reach_the_server(nats_cluster: NatsCluster, cluster: str) -> None:
    """No member carries the tag: the server refuses the placement, which proves it was asked for."""
    spec = for_bus(
        telemetry_stream(cluster), BusSettings(stream_replicas=1, stream_placement_tags=["no-such-tag"])
    )

    async def go() -> str:
        nc = await nats.connect(servers=nats_cluster.urls)
        try:
            with pytest.raises(nats.js.errors.APIError) as refused:
                await ensure_stream(nc.jetstream(), spec)
            return str(refused.value)
        finally:
            await nc.close()

    refusal = asyncio.run(go()).lower()
    assert "no suitable peers" in refusal or "placement" in refusal, refusal


def test_an_existing_stream_with_other_settings_is_reported_not_changed(
    nats_cluster: NatsCluster, cluster: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An R1 stream made earlier (the issue's SPOF) is named with what differs; it stays R1 until an
    operator changes it; subjects the command needs are still added."""
    old = for_bus(telemetry_stream(cluster, max_age=3600.0), BusSettings(stream_replicas=1))
    old.subjects = old.subjects[:1]
    wanted = for_bus(telemetry_stream(cluster), BusSettings())

    async def go() -> StreamInfo:
        nc = await nats.connect(servers=nats_cluster.urls)
        try:
            js = nc.jetstream()
            await ensure_stream(js, old)
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="hpcbus.bus"):
                await ensure_stream(js, wanted)
            return await js.stream_info(old.name)
        finally:
            await nc.close()

    info = asyncio.run(go())
    assert info.config.num_replicas == 1
    assert info.config.max_age == 3600.0
    assert info.config.subjects == wanted.subjects
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    name = old.name
    assert any(
        f"stream {name}: replicas (--stream-replicas) is 1, this command wants 3" in w for w in warnings
    ), warnings
    assert any(f"stream {name}: max_age in seconds (--stream-max-age) is 3600.0" in w for w in warnings)
    assert len(warnings) == 2, warnings
