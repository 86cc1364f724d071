"""How InfluxDB's answers are classified: the one place that decides retry, split, keep or give up."""

from __future__ import annotations

import pytest

from hpcbus.influx.writer import Partial, Rejected, Retryable, TooLarge, classify
from hpcbus.schemas.influxdb import (
    FieldTypes,
    aggregate_processes,
    lines_of,
    one_shard,
    stable_types,
    tag_splice,
    type_conflict,
    values_as,
)
from hpcbus.schemas.lineprotocol import Line


def test_success_is_none() -> None:
    assert classify(204, "", None) is None


@pytest.mark.parametrize(
    ("status", "retry_after", "wait"), [(429, "7", 7.0), (503, None, 0.0), (500, "soon", 0.0)]
)
def test_retryable(status: int, retry_after: str | None, wait: float) -> None:
    error = classify(status, "busy", retry_after)
    assert isinstance(error, Retryable) and error.retry_after == wait and error.status == status


def test_too_large_is_split_not_retried() -> None:
    assert isinstance(classify(413, "Request Entity Too Large", None), TooLarge)


def test_partial_write_counts_dropped_points() -> None:
    text = '{"error":"partial write: field type conflict: input field \\"value\\" ... dropped=3"}'
    error = classify(400, text, None)
    assert isinstance(error, Partial) and error.dropped == 3


@pytest.mark.parametrize("status", [400, 401, 403, 404])
def test_other_client_errors_are_permanent(status: int) -> None:
    assert isinstance(classify(status, "unable to parse", None), Rejected)


def test_value_types_follow_the_registry_else_float() -> None:
    reg = stable_types(Line("process_rss", {}, {"value": 12.0}, 1))  # registry: int
    unknown = stable_types(Line("my_metric", {}, {"value": 5}, 1))  # cc-lib sends 5i: stored as float
    assert (type(reg.fields["value"]), type(unknown.fields["value"])) == (int, float)


def test_node_agent_counters_follow_the_type_influxdb_holds_in_both_directions() -> None:
    """InfluxDB 1.6's answer when a shard holds `net_bytes_in` as float (an hpcbus from before the one
    registry wrote it so): that measurement is written as float from then on, the others keep their type; and
    when a newer shard holds it as integer again (or another worker created it so), integer it is. Integer
    only for what the registry declares int: another metric may carry fractions."""
    types = FieldTypes()
    assert types["net_bytes_in"] is int and types["ib_recv"] is int
    error = classify(
        400,
        '{"error":"partial write: field type conflict: input field \\"value\\" on measurement '
        '\\"net_bytes_in\\" is type integer, already exists as type float dropped=2"}\n',
        None,
    )
    assert isinstance(error, Partial)
    assert types.learn(str(error)) == "net_bytes_in"
    assert types["net_bytes_in"] is float and types["ib_recv"] is int
    assert stable_types(Line("net_bytes_in", {}, {"value": 7}, 1), types).fields["value"] == 7.0
    conflict = 'partial write: field type conflict: input field "value" on measurement "{}" is type float, '
    back = conflict.format("net_bytes_in") + "already exists as type integer dropped=1"
    assert types.learn(back) == "net_bytes_in" and types["net_bytes_in"] is int
    other = conflict.format("x") + "already exists as type integer dropped=1"
    assert types.learn(other) == "" and "x" not in types  # not declared int: its fractions would be lost
    assert types.learn(conflict.format("mem_used") + "already exists as type integer dropped=1") == ""
    assert types.writable("mem_used", "integer") is None and types.writable("mem_used", "float") is float
    assert types.writable("ib_recv", "string") is None
    assert type_conflict(other) == ("x", "float", "integer")
    assert type_conflict(str(error)) == ("net_bytes_in", "integer", "float")
    assert types.learn("partial write: points beyond retention policy dropped=1") == ""


def test_lines_of_a_measurement_are_told_by_their_prefix() -> None:
    assert lines_of("mem_used") == ("mem_used,", "mem_used ")
    assert not "my\\ metric,a=b value=1 1".startswith(lines_of("my metric"))  # escaped: never matched


def test_values_as_writes_each_lines_value_in_the_other_type() -> None:
    texts = [
        "net_bytes_in,cluster=c,hostname=n,stype=network,stype-id=eth0,type=node,type-id=network value=5i 17",
        "net_bytes_in,cluster=c,hostname=n value=0i 17",
        "net_bytes_in,cluster=c,cmd=a\\ value=3i value=-4i 17",  # a tag holding " value=": the field is read
    ]
    floats = [
        "net_bytes_in,cluster=c,hostname=n,stype=network,stype-id=eth0,type=node,type-id=network value=5.0 17",
        "net_bytes_in,cluster=c,hostname=n value=0.0 17",
        "net_bytes_in,cluster=c,cmd=a\\ value=3i value=-4.0 17",
    ]
    assert values_as(texts, float) == floats
    assert values_as(floats, int) == texts
    assert values_as(texts, int) == texts and values_as(floats, float) == floats
    big = "net_bytes_in,cluster=c value=9007199254740993i 17"  # beyond 2^53: kept exact as an integer
    assert values_as([big], int) == [big] and values_as([big], float) == [big.replace("3i", "2.0")]
    assert values_as([big.replace("3i", "2.0")], int) == [big.replace("3i", "2i")]
    for refused in (
        "net_bytes_in,cluster=c value=2.5 17",  # a fraction: no integer
        "net_bytes_in,cluster=c value=1e+19 17",  # beyond int64
        "net_bytes_in,cluster=c,cmd=a\\ value=3i 17",  # only a tag holds it: no field after it
        'net_bytes_in,cluster=c value="x" 17',
    ):
        assert values_as([texts[0], refused], int) is None, refused
    assert values_as(['net_bytes_in,cluster=c value="x" 17'], float) is None


def test_one_shard_is_one_utc_hour_of_timestamps() -> None:
    hour = 1768399200  # a whole UTC hour
    assert one_shard([f"m value=1 {hour}", f"m,a=b value=2i {hour + 3599}"], "s")
    assert not one_shard([f"m value=1 {hour - 1}", f"m value=2 {hour}"], "s")
    assert one_shard([f'h log="x" {hour * 10**9 + 5}', f'h log="y" {(hour + 3599) * 10**9}'], "ns")
    assert not one_shard(["m value=1 17", "m value=1"], "s")  # no timestamp: said as possibly spanning


def test_process_lines_fold_per_job_with_the_registry_aggregation() -> None:
    def proc(name: str, pid: int, value: float) -> Line:
        tags = {
            "hostname": "n",
            "type": "node",
            "type-id": "0",
            "stype": "process",
            "stype-id": f"7/{pid}",
            "pid": str(pid),
            "cmd": "x",
            "job": "7",
            "user": "u",
        }
        return Line(name, tags, {"value": value}, 5)

    node = Line("mem_used", {"hostname": "n"}, {"value": 1.0}, 5)
    out = aggregate_processes(
        [proc("process_rss", 1, 10), node, proc("process_rss", 2, 5), proc("process_cpu_util", 1, 50.0)]
    )
    assert [
        (ln.measurement, ln.fields["value"], ln.tags.get("stype-id"), "pid" in ln.tags) for ln in out
    ] == [
        ("process_rss", 15, "7", False),
        ("mem_used", 1.0, None, False),
        ("process_cpu_util", 50.0, "7", False),
    ]


def test_tag_splice_puts_the_tag_after_the_measurement() -> None:
    old, new = tag_splice("m", ",cluster=x") or ("", "")
    text = "m,a=b value=1 5"
    assert text.startswith(old) and new + text[len(old) :] == "m,cluster=x,a=b value=1 5"
    assert tag_splice("cpu_load", ",cluster=a\\ b") == ("cpu_load,", "cpu_load,cluster=a\\ b,")
    for escaped in ("m x", "m,x", "m\\x", ""):  # such a name is written escaped: the line is formatted
        assert tag_splice(escaped, ",cluster=x") is None


def test_cluster_tag_is_escaped_on_the_pass_through_path() -> None:
    """Subjects allow `,` and `=` in a cluster name; forwarded lines must still be valid line protocol."""
    from line_protocol_parser import parse_line

    from hpcbus.consumers.influx.sink import InfluxSink
    from hpcbus.influx.settings import InfluxSettings
    from hpcbus.schemas.lineprotocol import parse_payload

    class Msg:
        subject = "lab,a=b.metrics"
        data = b"cpu_load,hostname=n1,type=node,type-id=0 value=1.5 1700000000\n"
        reply = ""

    class Bus:
        def jetstream(self) -> None:
            return None

    sink = InfluxSink(Bus(), None, InfluxSettings(), "lab,a=b", "test")  # type: ignore[arg-type]
    sink.take(Msg())  # type: ignore[arg-type]
    (text,) = sink._body(sink.cut())
    assert text == r"cpu_load,cluster=lab\,a\=b,hostname=n1,type=node,type-id=0 value=1.5 1700000000"
    # valid line protocol; `parse_payload` would refuse the name itself (not a cluster name: schemas.names)
    assert parse_line(text)["tags"]["cluster"] == "lab,a=b"
    assert parse_payload(text, now=0).errors[0].path == "tag cluster"


def test_the_body_splices_per_cluster_and_formats_names_that_need_escapes() -> None:
    """The two ways through `_body` for metric lines (every valid one has tags: `type` at least): a canonical
    line gets its cluster spliced in; a name that needs escapes is formatted; a second cluster's splice
    table is kept apart from the first's."""
    from hpcbus.consumers.influx.sink import InfluxSink
    from hpcbus.influx.settings import InfluxSettings

    class Bus:
        def jetstream(self) -> None:
            return None

    def msg(subject: str, data: bytes) -> object:
        return type("Msg", (), {"subject": subject, "data": data, "reply": ""})()

    sink = InfluxSink(Bus(), None, InfluxSettings(), "lab", "test")  # type: ignore[arg-type]
    node = "hostname=n1,type=hwthread,type-id=3"  # (a node-level line is formatted: the next test)
    first = f"cpu_load,{node} value=1.5 1700000000\nm\\,x,{node} value=1i 1700000000\n"
    sink.take(msg("lab.metrics", first.encode()))  # type: ignore[arg-type]
    sink.take(msg("lab2.metrics", f"cpu_load,{node} value=3.5 1700000000\n".encode()))  # type: ignore[arg-type]
    assert sink._body(sink.cut()) == [
        f"cpu_load,cluster=lab,{node} value=1.5 1700000000",
        f"m\\,x,cluster=lab,{node} value=1.0 1700000000",  # formatted: its type made stable too
        f"cpu_load,cluster=lab2,{node} value=3.5 1700000000",
    ]
    assert set(sink.bodies._by_cluster) == {"lab", "lab2"}


def test_node_level_lines_keep_their_influx_series() -> None:
    """On the bus a node-level line has no `type-id` (a device its `stype` as one): InfluxDB gets `type-id=0`
    as it always did, on the pass-through path too, so series, dashboards and retention queries stay."""
    from hpcbus.consumers.influx.sink import InfluxSink
    from hpcbus.influx.settings import InfluxSettings

    class Bus:
        def jetstream(self) -> None:
            return None

    sink = InfluxSink(Bus(), None, InfluxSettings(processes="full"), "lab", "test")  # type: ignore[arg-type]
    data = (
        b"cpu_load,hostname=n1,type=node value=1.5 1700000000\n"
        b"mem_used,cluster=lab,hostname=n1,type=node value=2.5 1700000000\n"
        b"io_util,hostname=n1,stype=disk,stype-id=sda,type=node,type-id=disk value=3.5 1700000000\n"
        b"load,hostname=n1,type=node,type-id=0 value=4.5 1700000000\n"  # an older agent's
    )
    sink.take(type("Msg", (), {"subject": "lab.metrics", "data": data, "reply": ""})())  # type: ignore[arg-type]
    assert sink._body(sink.cut()) == [
        "cpu_load,cluster=lab,hostname=n1,type=node,type-id=0 value=1.5 1700000000",
        "mem_used,cluster=lab,hostname=n1,type=node,type-id=0 value=2.5 1700000000",
        "io_util,cluster=lab,hostname=n1,stype=disk,stype-id=sda,type=node,type-id=0 value=3.5 1700000000",
        "load,cluster=lab,hostname=n1,type=node,type-id=0 value=4.5 1700000000",
    ]


def test_log_lines_get_distinct_nanoseconds_inside_their_second() -> None:
    """Reports of one second share tags and second: each gets its own ns (one point each in InfluxDB), the
    same one again when its message is redelivered (merged, not doubled), and never leaves its second."""
    from hpcbus.schemas.influxbody import log_time_ns

    second = 1_700_000_000
    stamps = [log_time_ns(second, seq, i) for seq in range(1_000, 1_600) for i in range(3)]
    assert len(set(stamps)) == len(stamps)
    assert {t // 1_000_000_000 for t in stamps} == {second}
    assert log_time_ns(second, 1_234, 1) == log_time_ns(second, 1_234, 1)
    assert log_time_ns(second, 999_999, 999) // 1_000_000_000 == second
