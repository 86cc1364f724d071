"""`[bus] expected_nodes`: a command that creates the nodes' stream with room for less than an hour of them
says so (one WARNING naming the stream, its size and what an hour needs); sized for the hour, it is quiet."""

from __future__ import annotations

import argparse
import asyncio
import logging

import nats
import pytest

from hpcbus.retry import Stopping
from hpcbus.service import Service
from hpcbus.settings import SettingsError, add_bus_arguments, bus_settings, stream_overrides
from hpcbus.streams import NODE_BYTES_PER_SECOND, StreamSpec, deadletter_stream, hour_bytes, telemetry_stream
from tests.services import NatsServer

pytestmark = pytest.mark.services


async def _create(url: str, specs: list[StreamSpec], bus_args: list[str]) -> None:
    """Run a `Service` (the runtime every command runs on) until its streams exist."""
    parser = argparse.ArgumentParser()
    add_bus_arguments(parser)
    bus = bus_settings(parser.parse_args(["--nats", url, "--cluster", "x", *bus_args]), {})
    service = Service(bus, "stream-size-test", streams=specs, stopping=Stopping(3.0))

    async def body(nc: nats.NATS) -> None:
        js = nc.jetstream()
        for spec in specs:
            while True:
                try:
                    await js.stream_info(spec.name)
                    break
                except nats.js.errors.NotFoundError:
                    await asyncio.sleep(0.1)

    assert await asyncio.wait_for(service.run(body, signals=False), 60) == 0


def test_hour_of_nodes_matches_scaling_doc() -> None:
    assert NODE_BYTES_PER_SECOND * 30 == 135_000  # one 134 kB sample per node and 30 s
    assert round(hour_bytes(500) / 1e9) == 8 and round(hour_bytes(2000) / 1e9) == 32  # docs/scaling.md


def test_small_stream_for_the_node_count_is_a_warning(
    nats_server: NatsServer, cluster: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hpcbus.bus")
    telemetry = telemetry_stream(cluster)  # the default 1 GiB: about 8 minutes of 500 nodes
    specs = [telemetry, deadletter_stream(cluster)]
    asyncio.run(_create(nats_server.url, specs, ["--expected-nodes", "500"]))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings  # the dead-letter stream holds no samples: no warning for it
    assert telemetry.name in warnings[0] and f"an hour needs {hour_bytes(500)}" in warnings[0]
    assert "about 8 minutes of 500 nodes" in warnings[0]


def test_stream_sized_for_the_hour_is_quiet(
    nats_server: NatsServer, cluster: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hpcbus.bus")
    spec = telemetry_stream(cluster, max_bytes=hour_bytes(20))
    asyncio.run(_create(nats_server.url, [spec], ["--expected-nodes", "20"]))
    small = telemetry_stream(f"small.{cluster}", max_bytes=hour_bytes(20) - 1)
    asyncio.run(_create(nats_server.url, [small], ["--expected-nodes", "20"]))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and small.name in warnings[0], warnings


def test_stream_limits_from_the_environment_where_no_flag_gave_them() -> None:
    """A unit's command line is fixed: its worker's stream size comes from /etc/hpcbus/hpcbus.env."""
    env = {"HPCBUS_STREAM_MAX_BYTES": str(hour_bytes(500)), "HPCBUS_STREAM_MAX_AGE": "86400"}
    assert stream_overrides(None, None, env) == {"max_age": 86400.0, "max_bytes": hour_bytes(500)}
    assert stream_overrides(None, 5, env) == {"max_age": 86400.0, "max_bytes": 5}  # the flag wins
    assert stream_overrides(None, None, {}) == {}
    # a typed section reads a flag not given as 0: the environment counts then too (the gateway, simulate and
    # the workers read `STREAM` so; $HPCBUS_STREAM_MAX_BYTES was ignored by the first two)
    assert stream_overrides(0.0, 0, env) == {"max_age": 86400.0, "max_bytes": hour_bytes(500)}
    with pytest.raises(SettingsError, match="HPCBUS_STREAM_MAX_BYTES"):
        stream_overrides(None, None, {"HPCBUS_STREAM_MAX_BYTES": "8 GB"})
