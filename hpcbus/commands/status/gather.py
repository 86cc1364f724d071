"""The facts of `hpcbus status`, read from the bus: the JetStream API as JSON (`$JS.API.STREAM.LIST`,
`CONSUMER.LIST`, `STREAM.MSG.GET`; all the read-only monitor identity may use) and short reads of the
telemetry stream (`scan`). Each cluster is the `HPCBUS_<cluster>` stream whose subjects name it."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import msgspec
import nats.errors
from nats.aio.client import Client as NATS

from hpcbus.commands.status import facts
from hpcbus.commands.status.nodes import judge as judge_nodes
from hpcbus.commands.status.nodes import last_samples, merge_known
from hpcbus.commands.status.scan import read_since
from hpcbus.commands.status.settings import StatusSettings
from hpcbus.commands.status.workers import Reports, error_text
from hpcbus.connection import Unreachable, check_urls, connect_once
from hpcbus.schemas import subjects
from hpcbus.settings import BusSettings
from hpcbus.streams import stream_name

if TYPE_CHECKING:
    from hpcbus.influx.settings import InfluxSettings
from hpcbus.schemas.lineprotocol import parse_payload

LATEST_ERRORS = 5


class ApiError(Exception):
    pass


async def api(nc: NATS, subject: str, body: Mapping[str, Any] | None, timeout: float) -> dict[str, Any]:
    """One JetStream API request; `ApiError` with the server's description when it answers an error."""
    msg = await nc.request(f"$JS.API.{subject}", json.dumps(body or {}).encode(), timeout=timeout)
    answer: dict[str, Any] = json.loads(msg.data or b"{}")
    if "error" in answer:
        err = answer["error"]
        raise ApiError(f"{subject}: {err.get('description', err)} ({err.get('code', '?')})")
    return answer


def epoch(text: str | None) -> float:
    """RFC 3339 with nanoseconds (as the server writes it) -> epoch seconds; 0 for none or the zero time."""
    if not text or text.startswith("0001-"):
        return 0.0
    head, _, frac = text.rstrip("Z").partition(".")
    base = dt.datetime.fromisoformat(head).replace(tzinfo=dt.UTC).timestamp()
    digits = "".join(c for c in frac if c.isdigit())
    return base + (float("0." + digits) if digits else 0.0)


async def probe_server(bus: BusSettings, url: str, timeout: float) -> facts.Server:
    """One server on its own: does it answer, and what does it say about itself."""
    try:
        nc = await connect_once(msgspec_replace(bus, [url]), "hpcbus-status-probe", timeout)
    except Unreachable as exc:
        return facts.Server(url=url, reachable=False, error=str(exc).split(": ", 1)[-1])
    try:
        info: Mapping[str, Any] = getattr(nc, "_server_info", None) or {}
        return facts.Server(
            url=url,
            reachable=True,
            name=str(info.get("server_name", "")),
            version=str(info.get("version", "")),
            cluster=str(info.get("cluster", "")),
            jetstream=bool(info.get("jetstream")),
        )
    finally:
        await nc.close()


def msgspec_replace(bus: BusSettings, urls: list[str]) -> BusSettings:
    """`bus` with only these servers."""
    return msgspec.structs.replace(bus, nats=urls)


def cluster_of(stream: Mapping[str, Any], prefix: str) -> str | None:
    """The cluster an `HPCBUS_<cluster>` stream serves (from its `<cluster>.metrics` subject)."""
    for subject in stream.get("config", {}).get("subjects") or []:
        if subject.endswith(".metrics"):
            try:
                parsed = subjects.parse(subject, prefix)
            except subjects.SubjectError:
                continue
            if stream_name("HPCBUS", parsed.cluster) == stream["config"]["name"]:
                return parsed.cluster
    return None


def stream_facts(info: Mapping[str, Any], now: float) -> facts.Stream:
    config, state = info["config"], info["state"]
    first, last = epoch(state.get("first_ts")), epoch(state.get("last_ts"))
    size, limit = int(state.get("bytes", 0)), int(config.get("max_bytes", -1))
    rate = size / (last - first) if state.get("messages") and last > first else 0.0
    headroom = (limit - size) / rate / 60.0 if limit > 0 and rate > 0 else None
    cluster = info.get("cluster") or {}
    followers = [
        facts.Replica(
            name=str(p.get("name", "")),
            current=bool(p.get("current")),
            offline=bool(p.get("offline")),
            lag=int(p.get("lag", 0) or 0),
            active_s=round(int(p.get("active", 0) or 0) / 1e9, 3),
        )
        for p in cluster.get("replicas") or []
    ]
    return facts.Stream(
        name=config["name"],
        subjects=list(config.get("subjects") or []),
        messages=int(state.get("messages", 0)),
        bytes=size,
        max_bytes=limit,
        max_age_s=int(config.get("max_age", 0)) / 1e9,
        first_time=first,
        last_time=last,
        ingest_bytes_per_s=round(rate, 1),
        headroom_minutes=round(headroom, 1) if headroom is not None else None,
        replicas=int(config.get("num_replicas", 1)),
        leader=str(cluster.get("leader", "")),
        followers=followers,
        messages_per_subject={k: int(v) for k, v in (state.get("subjects") or {}).items()},
    )


async def list_all(nc: NATS, subject: str, key: str, timeout: float) -> list[Any]:
    """Every entry of a paged JetStream list (`STREAM.NAMES`, `CONSUMER.LIST.<stream>`)."""
    out: list[Any] = []
    while True:
        page = await api(nc, subject, {"offset": len(out)}, timeout)
        items = page.get(key) or []
        out += items
        if not items or len(out) >= int(page.get("total", 0)):
            return out


async def hpcbus_streams(nc: NATS, clusters: list[str], timeout: float) -> list[dict[str, Any]]:
    """The info of every `HPCBUS_*` stream (or of the clusters named): names from `STREAM.NAMES`, then each
    stream's `STREAM.INFO` (answered by its leader). Not `STREAM.LIST`: on a cluster with a member down it
    waits for that member longer than a status may take."""
    if clusters:
        names = [n for c in clusters for n in (stream_name("HPCBUS", c), stream_name("HPCBUS_INGEST", c))]
    else:
        listed = await list_all(nc, "STREAM.NAMES", "streams", timeout)
        names = [
            str(n) for n in listed if str(n).startswith("HPCBUS_") and not str(n).startswith("HPCBUS_DLQ_")
        ]

    async def info(name: str) -> dict[str, Any] | None:
        try:
            return await api(nc, f"STREAM.INFO.{name}", None, timeout)
        except ApiError:  # not there (an ingest stream is optional)
            return None

    found = await asyncio.gather(*(info(n) for n in names))
    return [i for i in found if i is not None]


def durable_facts(first: Mapping[str, Any], second: Mapping[str, Any] | None, gap: float) -> facts.Durable:
    """A durable from one look, or two `gap` seconds apart (its ack rate, time to drain, growth)."""
    info = second or first
    config = info.get("config", {})
    ack_floor = info.get("ack_floor") or {}
    last_ack = epoch(ack_floor.get("last_active"))
    last_delivery = epoch((info.get("delivered") or {}).get("last_active"))
    pending, ack_pending = int(info.get("num_pending", 0)), int(info.get("num_ack_pending", 0))
    rate = drain = growing = None
    if second is not None and gap > 0:
        acked = int(ack_floor.get("consumer_seq", 0)) - int(
            (first.get("ack_floor") or {}).get("consumer_seq", 0)
        )
        rate = round(max(acked, 0) / gap, 2)
        before = int(first.get("num_pending", 0)) + int(first.get("num_ack_pending", 0))
        growing = pending + ack_pending - before
        if rate > 0:
            drain = round((pending + ack_pending) / rate, 1)
    filters = list(
        config.get("filter_subjects") or ([config["filter_subject"]] if config.get("filter_subject") else [])
    )
    return facts.Durable(
        stream=str(info.get("stream_name", "")),
        name=str(info.get("name", "")),
        filter=filters,
        pending=pending,
        ack_pending=ack_pending,
        redelivered=int(info.get("num_redelivered", 0)),
        waiting=int(info.get("num_waiting", 0)),
        last_ack_s=round(time.time() - last_ack, 1) if last_ack else None,
        last_delivery_s=round(time.time() - last_delivery, 1) if last_delivery else None,
        acks_per_s=rate,
        drain_s=drain,
        growing=growing,
    )


async def durables_of(nc: NATS, streams: list[str], timeout: float) -> dict[tuple[str, str], dict[str, Any]]:
    """(stream, name) -> consumer info of every durable on `streams` (ephemeral readers left out).

    Names from `CONSUMER.NAMES`, then each one's `CONSUMER.INFO`, at once. Not `CONSUMER.LIST`: on a cluster
    with a member down it waits for the consumers that member held (other status runs' ephemeral readers)
    longer than a status may take; here such a reader just does not answer and is left out (a durable of
    a replicated stream is replicated too and answers from its leader)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for stream in streams:
        names = await list_all(nc, f"CONSUMER.NAMES.{stream}", "consumers", timeout)

        async def info(name: str, stream: str = stream) -> dict[str, Any] | None:
            try:
                return await api(nc, f"CONSUMER.INFO.{stream}.{name}", None, timeout)
            except (ApiError, TimeoutError):
                return None

        for got in await asyncio.gather(*(info(str(n)) for n in names)):
            if got is not None and (got.get("config") or {}).get("durable_name"):
                found[(stream, got["name"])] = got
    return found


async def deadletters(nc: NATS, name: str, timeout: float) -> facts.DeadLetters | None:
    try:
        info = await api(nc, f"STREAM.INFO.{name}", None, timeout)
    except ApiError:
        return None
    state = info.get("state", {})
    out = facts.DeadLetters(stream=name, count=int(state.get("messages", 0)))
    if out.count:
        try:
            got = await api(nc, f"STREAM.MSG.GET.{name}", {"seq": int(state["last_seq"])}, timeout)
        except ApiError:
            return out
        message = got.get("message", {})
        headers = base64.b64decode(message.get("hdrs") or b"").decode(errors="replace")
        out.newest_time = epoch(message.get("time"))
        for line in headers.split("\r\n"):
            key, _, value = line.partition(":")
            if key.strip() == "Hpcbus-Subject":
                out.newest_subject = value.strip()
            elif key.strip() == "Hpcbus-Problems":
                try:
                    problems = json.loads(value.strip())
                except ValueError:
                    problems = []
                if problems:
                    p = problems[0]
                    where = f"line {p['line']}: " if p.get("line") else ""
                    out.newest_reason = f"{where}{p.get('reason', '')}".strip()
    return out


async def telemetry(
    nc: NATS, stream: str, cluster: str, prefix: str, settings: StatusSettings, now: float
) -> tuple[list[facts.Worker], list[str]]:
    """The workers that report, and the latest error lines of the cluster."""
    js = nc.jetstream(timeout=settings.timeout)
    reports = Reports()
    errors: list[tuple[float, str, str]] = []
    since = now - settings.worker_window
    async for msg in read_since(
        js, stream, subjects.telemetry(cluster, prefix=prefix), since, limit=200_000, timeout=settings.timeout
    ):
        reports.add(parse_payload(msg.data or b"", now=int(now)).lines)
    async for msg in read_since(
        js,
        stream,
        subjects.wildcard(cluster, "log", prefix=prefix),
        since,
        limit=50_000,
        timeout=settings.timeout,
    ):
        for line in parse_payload(msg.data or b"", now=int(now)).lines:
            text = error_text(line)
            if text is not None:
                errors.append((float(line.time), line.tags.get("hostname", ""), text))
    errors.sort()
    by_host = {host: text for _, host, text in errors}
    latest = [f"{host}: {text}" if host else text for _, host, text in errors[-LATEST_ERRORS:]]
    return reports.workers(now, by_host, slack=settings.timeout), latest


ROLES = ("jobs", "slurm", "ocs")
"""The roles an active/standby pair can hold (`hpcbus.lease`): `consume jobs`, `produce slurm` and `produce ocs`
with `state = "jetstream"`."""


async def roles_of(nc: NATS, cluster: str, now: float, timeout: float) -> list[facts.Role]:
    """Who holds each role of the cluster and who stands by (direct gets of the `lease.` and `standby.`
    keys, which `monitor` may read), for each role that a pair runs or ran: held, stood by, or with state
    saved in the bucket (a `state.<role>.<key>` subject, from the stream's info: a holder that died with no
    standby leaves its state, not its lease). [] when the cluster has no roles bucket (no pair runs) or it
    cannot be read."""
    from nats.js.errors import BucketNotFoundError

    from hpcbus.lease import lease_key, read_entries, standby_key
    from hpcbus.streams import roles_bucket

    bucket = roles_bucket(cluster)
    keys = {**{f"lease {r}": lease_key(r) for r in ROLES}, **{f"standby {r}": standby_key(r) for r in ROLES}}
    js = nc.jetstream(timeout=timeout)
    try:
        found = await asyncio.wait_for(read_entries(js, bucket, keys), timeout)
        info = await asyncio.wait_for(js.stream_info(f"KV_{bucket}", f"$KV.{bucket}.state.*.*"), timeout)
    except (BucketNotFoundError, nats.errors.Error, TimeoutError):
        return []
    saved = {subject.split(".")[3] for subject in (info.state.subjects or {})}
    out = []
    for role in ROLES:
        held, standby = found[f"lease {role}"], found[f"standby {role}"]
        if not (held or standby or role in saved):
            continue
        out.append(
            facts.Role(
                role=role,
                holder=held.holder if held else "",
                since=held.since if held else None,
                renewed_s=max(0.0, now - held.renewed) if held else None,
                ttl_s=held.ttl if held else None,
                standby=standby.holder if standby else "",
                standby_seen_s=max(0.0, now - standby.renewed) if standby else None,
                saved=role in saved,
            )
        )
    return out


async def cluster_facts(
    nc: NATS,
    cluster: str,
    info: dict[str, Any],
    bus: BusSettings,
    settings: StatusSettings,
    now: float,
    influx: InfluxSettings | None = None,
) -> tuple[facts.Stream, facts.Nodes, list[facts.Worker], list[str], facts.DeadLetters | None]:
    stream = stream_facts(info, now)
    js = nc.jetstream(timeout=settings.timeout)
    prefix = bus.subject_prefix
    seen_task = last_samples(
        js,
        stream.name,
        subjects.events(cluster, "sample", prefix=prefix),
        now=now,
        window=settings.node_window,
        first_time=stream.first_time,
        timeout=settings.timeout,
        silent_intervals=settings.silent_intervals,
    )
    seen, (workers, errors), dlq, known = await asyncio.gather(
        seen_task,
        telemetry(nc, stream.name, cluster, prefix, settings, now),
        deadletters(nc, stream_name("HPCBUS_DLQ", cluster), settings.timeout),
        influx_last_samples(influx, cluster),
    )
    source = "bus"
    if isinstance(known, dict) and influx is not None:
        merge_known(seen, known)
        source = "bus+influxdb"
    nodes = judge_nodes(seen, now, settings.silent_intervals, source)
    if isinstance(known, str):
        nodes.influx_error = known
    return stream, nodes, workers, errors, dlq


INFLUX_DAYS = 30


async def influx_last_samples(influx: InfluxSettings | None, cluster: str) -> dict[str, float] | str:
    """host -> time of its last `hpcbus_collect_seconds` point (every node producer sample has one) in the
    last `INFLUX_DAYS` days; a sentence when InfluxDB cannot be asked ({} without `--influx`)."""
    if influx is None:
        return {}
    from hpcbus.influx.query import Influx, QueryError, ident, literal

    client = Influx(influx)
    statement = (
        f'SELECT last("value") FROM {ident("hpcbus_collect_seconds")} WHERE time > now() - {INFLUX_DAYS}d '
        f"AND {ident('cluster')} = {literal(cluster)} GROUP BY {ident('hostname')}"
    )
    try:
        series = await client.query(statement)
    except QueryError as exc:
        return str(exc)
    finally:
        await client.close()
    out: dict[str, float] = {}
    for s in series:
        host = s.tags.get("hostname", "")
        for row in s.rows():
            if host and row.get("time") is not None:
                out[host] = float(row["time"])
    return out


async def gather(
    bus: BusSettings, settings: StatusSettings, clusters: list[str], influx: InfluxSettings | None = None
) -> facts.Report:
    """Everything `hpcbus status` shows; `Unreachable` when no server answers."""
    started = time.monotonic()
    now = time.time()
    check_urls(bus.nats)
    servers = list(await asyncio.gather(*(probe_server(bus, u, settings.timeout) for u in bus.nats)))
    if not any(s.reachable for s in servers):
        raise Unreachable("NATS not reachable: " + "; ".join(f"{s.url}: {s.error}" for s in servers))
    nc = await connect_once(
        msgspec_replace(bus, [s.url for s in servers if s.reachable]), "hpcbus-status", settings.timeout
    )
    try:
        return await gather_on(nc, bus, settings, clusters, servers, now, started, influx)
    except (ApiError, TimeoutError, nats.errors.Error) as exc:
        # the servers answer but JetStream does not (no meta leader during an election, JetStream off):
        # unhealthy, not unreachable
        what = str(exc) or type(exc).__name__
        said = what if isinstance(exc, ApiError) else f"did not answer within {settings.timeout:g} s ({what})"
        return facts.Report(
            time=now,
            took_s=round(time.monotonic() - started, 2),
            servers=servers,
            clusters=[],
            jetstream_error=f"JetStream {said}",
        )
    finally:
        await nc.close()


def missing_stream(cluster: str, stored: dict[str, Any], prefix: str) -> str:
    """Why a cluster asked for has no stream to show."""
    name = stream_name("HPCBUS", cluster)
    if name in stored:
        subjects_of = ", ".join(stored[name]["config"].get("subjects") or [])
        return f"stream {name} holds {subjects_of}, not this cluster under subject prefix {prefix!r}"
    return f"no stream {name}: nothing was ever published for this cluster"


async def gather_on(
    nc: NATS,
    bus: BusSettings,
    settings: StatusSettings,
    clusters: list[str],
    servers: list[facts.Server],
    now: float,
    started: float,
    influx: InfluxSettings | None = None,
) -> facts.Report:
    streams = await hpcbus_streams(nc, clusters, settings.timeout)
    by_cluster: dict[str, dict[str, Any]] = {}
    for info in streams:
        name = cluster_of(info, bus.subject_prefix)
        if name is not None and (not clusters or name in clusters):
            by_cluster[name] = info
    stored = {s["config"]["name"]: s for s in streams}
    for name in clusters:
        if name not in by_cluster:
            by_cluster.setdefault(name, {})
    consumer_streams = [
        n
        for c in by_cluster
        for n in (stream_name("HPCBUS", c), stream_name("HPCBUS_INGEST", c))
        if n in stored
    ]
    first_look = await durables_of(nc, consumer_streams, settings.timeout)
    looked = time.monotonic()
    per_cluster = await asyncio.gather(
        *(
            cluster_facts(nc, c, info, bus, settings, now, influx)
            for c, info in sorted(by_cluster.items())
            if info
        )
    )
    second_look: dict[tuple[str, str], dict[str, Any]] = {}
    gap = 0.0
    if settings.rate_seconds > 0 and first_look:
        wait = settings.rate_seconds - (time.monotonic() - looked)
        if wait > 0:
            await asyncio.sleep(wait)
        second_look = await durables_of(nc, consumer_streams, settings.timeout)
        gap = time.monotonic() - looked
    durables = [durable_facts(info, second_look.get(key), gap) for key, info in sorted(first_look.items())]
    names = sorted(by_cluster)
    roles = dict(
        zip(
            names, await asyncio.gather(*(roles_of(nc, c, now, settings.timeout) for c in names)), strict=True
        )
    )
    out: list[facts.Cluster] = []
    done = {c: r for c, r in zip(sorted(c for c, i in by_cluster.items() if i), per_cluster, strict=True)}
    for name in sorted(by_cluster):
        if name not in done:
            out.append(
                facts.Cluster(
                    name=name,
                    streams=[],
                    durables=[],
                    deadletters=None,
                    workers=[],
                    nodes=facts.Nodes(source="none", seen=0, interval_s=None, silent=[]),
                    errors=[missing_stream(name, stored, bus.subject_prefix)],
                )
            )
            continue
        stream, nodes, workers, errors, dlq = done[name]
        mine = {stream_name("HPCBUS", name), stream_name("HPCBUS_INGEST", name)}
        streams_of = [stream]
        ingest = stored.get(stream_name("HPCBUS_INGEST", name))
        if ingest is not None:
            streams_of.append(stream_facts(ingest, now))
        out.append(
            facts.Cluster(
                name=name,
                streams=streams_of,
                durables=[d for d in durables if d.stream in mine],
                deadletters=dlq,
                workers=workers,
                nodes=nodes,
                errors=errors,
                roles=roles[name],
            )
        )
    report = facts.Report(time=now, took_s=0.0, servers=servers, clusters=out)
    if influx is not None:
        from hpcbus.commands.status.cardinality import tag_values

        counted = await tag_values(influx, settings.max_values_per_tag)
        if isinstance(counted, str):
            report.tag_values_error = counted
        else:
            report.tag_values = counted
    report.took_s = round(time.monotonic() - started, 2)
    return report
