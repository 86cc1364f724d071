"""Node-level metric lines take the InfluxDB sink's splice path: `cluster=` and `type-id=0` written into the
bus text, byte for byte what formatting the line would give; anything unusual is formatted as before. On the
compiled path `_influxdb.c` writes them (its tags sorted, so a line the Python splice formats is the C's too):
the body is the same."""

from __future__ import annotations

import contextlib

import msgspec
import pytest

from hpcbus.consumers.influx.sink import InfluxSink
from hpcbus.contract import BadInput
from hpcbus.influx.settings import InfluxSettings
from hpcbus.schemas.influxdb import stable_types
from hpcbus.schemas.lineprotocol import INFLUX_NODE_ID, format_line, parse_payload

T = 1700000000
SPLICED = [
    f"cpu_load,hostname=n1,type=node value=1.5 {T}",
    f"mem_used,hostname=n1,type=node,user=alice value=2.5 {T}",  # a tag after `type`
    f"rapl_power,hostname=n1,stype=rapl,stype-id=pkg0,type=node,type-id=rapl value=3.5 {T}",
    f"io_util,hostname=n1,stype=disk,stype-id=sda,type=node,type-id=disk value=4.5 {T}",
    f"process_cpu_util,hostname=n1,job=42,stype=process,stype-id=42/7,type=node,type-id=process,user=u value=5.5 {T}",
    f"io_util,hostname=n1,stype=disk,stype-id=sda,type=node,type-id=disk,x=type-id value=6.5 {T}",
    f"cpu_load,hostname=n1,type=node,type+x=1 value=1.5 {T}",  # a key sorting between `type` and `type-id`
    f"cpu_load,hostname=n1,type=node value=1 {T}",  # the value written as `format_line` writes it: 1.0
    f"cpu_system,hostname=n1,type=node value=0.0 {T}",
    f"cpu_idle,hostname=n1,type=node value=-0.0 {T}",
]
FORMATTED = [
    f"cpu_load,hostname=n1,job=a\\,type=node,type=node value=1.5 {T}",  # an escaped value holding `,type=node`
    f"io_util,hostname=n1,stype=disk,stype-id=a\\,type-id=disk,type=node,type-id=disk value=2.5 {T}",
    f"cpu_load,type=node,hostname=n1 value=1.5 {T}",  # tags out of order
    f"cpu_load,arch=x,hostname=n1,type=node value=1.5 {T}",  # a key sorting before `cluster`
    f"mem_used,hostname=n1,type=node,type-id=0 value=7i {T}",  # an older agent's: not in bus form, no text
]


class Bus:
    def jetstream(self) -> None:
        return None


def sink_body(
    texts: list[str], processes: str = "full", compiled: bool = False
) -> tuple[list[str], list[str], InfluxSink]:
    """(the sink's body for `texts` sent on `lab.metrics`, what formatting each parsed line gives, the sink);
    the pure path unless `compiled`."""
    data = "".join(t + "\n" for t in texts).encode()
    settings = msgspec.convert({"processes": processes}, InfluxSettings)
    sink = InfluxSink(Bus(), None, settings, "lab", "test", compiled=compiled)  # type: ignore[arg-type]
    with contextlib.suppress(BadInput):  # lines the parser refuses: dead-lettered by the runner, not here
        sink.take(type("Msg", (), {"subject": "lab.metrics", "data": data, "reply": ""})())  # type: ignore[arg-type]
    expected = []
    for line in parse_payload(data, now=T).lines:
        tags = {**line.tags, "type-id": INFLUX_NODE_ID, "cluster": "lab"}
        expected.append(format_line(stable_types(msgspec.structs.replace(line, tags=tags))))
    return sink._body(sink.cut()), expected, sink


@pytest.mark.parametrize("text", SPLICED)
def test_node_lines_are_spliced_byte_for_byte_as_formatted(text: str) -> None:
    body, expected, sink = sink_body([text])
    assert body == expected
    measurement = text.split(",", 1)[0]
    assert measurement in sink.bodies._by_cluster["lab"], "taken by the splice path, not formatted"


@pytest.mark.parametrize("text", FORMATTED)
def test_unusual_node_lines_are_formatted(text: str) -> None:
    body, expected, sink = sink_body([text])
    assert body == expected
    assert not sink.bodies._by_cluster.get("lab"), "formatted, not spliced"


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("processes", ["full", "aggregate"])
def test_a_mixed_payload_matches_formatting(compiled: bool, processes: str) -> None:
    texts = SPLICED + FORMATTED
    body, expected, _ = sink_body(texts, processes, compiled)
    if processes == "full":
        assert body == expected
    assert body == sink_body(texts, processes, not compiled)[0]


@pytest.mark.parametrize("text", SPLICED + FORMATTED)
def test_node_lines_in_c(text: str) -> None:
    """Where the extension is built, the C writes every node-level line of the bus shape (no Python splice)."""
    from hpcbus.schemas.influxdb import SPLICE

    body, expected, sink = sink_body([text], compiled=True)
    assert body == expected
    if SPLICE is not None and "\\" not in text and "type-id=0 value=7i" not in text:
        assert not sink.bodies._by_cluster.get("lab"), "written by the C, not the Python splice"
