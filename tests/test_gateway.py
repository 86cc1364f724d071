"""`hpcbus gateway` against real services: real writers (plain HTTP v1, influxdb-client v2, Sonar's POSTs,
Slurm's acct_gather_profile/influxdb plugin) -> the gateway process -> JetStream -> the real workers ->
InfluxDB. Every wait is on state: the gateway's /health, the stream's content, InfluxDB's rows, files."""

from __future__ import annotations

import base64
import gzip
import json
import ssl
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
from influxdb_client import InfluxDBClient
from influxdb_client.client.write_api import SYNCHRONOUS
from influxdb_client.rest import ApiException

from hpcbus.producers.gateway.auth import hash_secret
from hpcbus.schemas import subjects
from hpcbus.schemas.lineprotocol import parse_payload
from hpcbus.schemas.sonar import decode_envelope
from hpcbus.schemas.translate import envelope_to_lines
from tests.consumer_helpers import Process, Worker, bus_messages, triples, wait_for
from tests.corpus import CORPUS
from tests.services import LOOPBACK, InfluxDB, InfluxProfile, NatsServer, SlurmCluster, free_port
from tests.tls_helpers import Pki

pytestmark = pytest.mark.services

SONAR = CORPUS / "sonar"


# --- helpers ---------------------------------------------------------------------------------------------


class Answer:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)


def http(
    url: str,
    body: bytes | None = None,
    *,
    method: str = "POST",
    headers: dict[str, str] | None = None,
    context: ssl.SSLContext | None = None,
) -> Answer:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as r:
            return Answer(r.status, dict(r.headers), r.read())
    except urllib.error.HTTPError as e:
        return Answer(e.code, dict(e.headers), e.read())


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def start_gateway(
    workers: list[Process], tmp_path: Path, nats_url: str, *args: str, name: str = "gateway", port: int = 0
) -> tuple[Worker, str]:
    port = port or free_port()
    argv = ["gateway", "--nats", nats_url, "--listen", f"{LOOPBACK}:{port}", "--stats-seconds", "3600", *args]
    w = Worker(argv, tmp_path / f"{name}.log")
    workers.append(w)
    w.start(ready="listening on")
    url = f"http://{LOOPBACK}:{port}"
    wait_for(
        lambda: http(url + "/health", method="GET").status == 200, 20, lambda: f"healthy gateway\n{w.log()}"
    )
    return w, url


def auth_file(tmp_path: Path, secrets: dict[str, str]) -> Path:
    path = tmp_path / "gateway-auth.toml"
    path.write_text(
        "".join(
            f'[clusters."{c}"]\nsecret = "{hash_secret(s, iterations=1000)}"\nrole = "master"\n'
            for c, s in secrets.items()
        )
    )
    return path


def stored(url: str, cluster: str) -> list[tuple[str, bytes, str]]:
    return triples(bus_messages(url, cluster))


def stored_lines(url: str, cluster: str) -> list[str]:
    return [line for subject, payload, _ in stored(url, cluster) for line in payload.decode().splitlines()]


# --- InfluxDB v1 and v2 writers ----------------------------------------------------------------------------


def test_v1_writer_every_precision_gzip_and_partial_writes(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    _, url = start_gateway(workers, tmp_path, nats_server.url, "--cluster", cluster)
    assert http(url + "/ping", method="HEAD").status == 204
    assert http(url + "/ping", method="GET").headers["X-Influxdb-Version"].startswith("1.8")
    assert http(url + "/query?q=CREATE+DATABASE+%22telegraf%22", method="POST").json() == {
        "results": [{"statement_id": 0}]
    }
    shown = http(url + "/query?q=SHOW+DATABASES", method="GET").json()
    assert ["telegraf"] in shown["results"][0]["series"][0]["values"]

    t = int(time.time()) // 3600 * 3600  # whole hours: every precision can say it exactly
    stamps = {"n": t * 10**9, "u": t * 10**6, "ms": t * 1000, "s": t, "m": t // 60, "h": t // 3600}
    for precision, stamp in stamps.items():
        body = f"gw_prec,hostname={precision},type=node value=1 {stamp}\n".encode()
        answer = http(
            f"{url}/write?db=x&precision={precision}",
            gzip.compress(body),
            headers={"Content-Encoding": "gzip"},
        )
        assert answer.status == 204, answer.body
    lines = stored_lines(nats_server.url, cluster)
    assert sorted(lines) == sorted(f"gw_prec,hostname={p},type=node value=1 {t}" for p in stamps)

    # bad lines: 400 naming each, the good ones of the same request stored
    body = (
        f"gw_good,hostname=n1,type=node value=1 {t}\n"
        "this is not line protocol\n"
        f"gw_good,hostname=n2,type=node value=2 {t}\n"
        f"gw_good,hostname=n3,type=node,cluster=elsewhere value=3 {t}\n"
    ).encode()
    answer = http(f"{url}/write?db=x&precision=s", body)
    assert answer.status == 400
    error = answer.json()["error"]
    assert error.startswith("partial write: ") and error.endswith("dropped=2")
    assert "POST /write:2: lp: line: syntax" in error and "POST /write:4: lp: tag cluster" in error
    good = [line for line in stored_lines(nats_server.url, cluster) if line.startswith("gw_good")]
    assert sorted(good) == [
        f"gw_good,hostname=n1,type=node value=1 {t}",
        f"gw_good,hostname=n2,type=node value=2 {t}",
    ]
    # the same request again (a client that lost the answer): same ids, nothing stored twice
    before = len(stored(nats_server.url, cluster))
    assert http(f"{url}/write?db=x&precision=s", body).status == 400
    assert len(stored(nats_server.url, cluster)) == before
    assert http(f"{url}/write?db=x&precision=fortnights", body).status == 400
    big = b"x" * (40 * 2**20)
    assert http(f"{url}/write?db=x", big).status == 413


def test_v2_writer_with_token_and_basic_auth(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    other = f"other-{cluster}"
    path = auth_file(tmp_path, {cluster: "s3cret", other: "0ther"})
    gw, url = start_gateway(workers, tmp_path, nats_server.url, "--auth-file", str(path))
    assert "no --auth-file" not in gw.log()
    t = int(time.time())
    with InfluxDBClient(url=url, token=f"{cluster}:s3cret", org="site", enable_gzip=True) as client:
        client.write_api(write_options=SYNCHRONOUS).write(
            bucket="b",
            record=[
                f"gw_v2,host=n1 used=3i,free=4.5 {t}000000000",
                f"gw_v2_cc,hostname=n1,type=node value=7 {t}000000000",
            ],
            write_precision="ns",
        )
    with (
        InfluxDBClient(url=url, token=f"{cluster}:wrong", org="site") as client,
        pytest.raises(ApiException) as err,
    ):
        client.write_api(write_options=SYNCHRONOUS).write(bucket="b", record=f"gw_v2x,host=n1 a=1 {t}")
    assert err.value.status == 401 and json.loads(err.value.body)["code"] == "unauthorized"
    assert sorted(stored_lines(nats_server.url, cluster)) == [
        f"gw_v2_cc,hostname=n1,type=node value=7 {t}",  # in bus form: as sent
        f"gw_v2_free,hostname=n1,type=node value=4.5 {t}",
        f"gw_v2_used,hostname=n1,type=node value=3i {t}",
    ]
    # v1 with Basic auth: the cluster comes from the credentials, so these lines land on the other cluster
    line = f"gw_basic,hostname=n1,type=node value=1 {t}".encode()
    assert http(f"{url}/write?db=x&precision=s", line, headers=basic(other, "0ther")).status == 204
    assert http(f"{url}/write?db=x&precision=s&u={other}&p=0ther", line).status == 204  # InfluxDB's u/p
    assert http(f"{url}/write?db=x&precision=s", line, headers=basic(other, "s3cret")).status == 401
    assert http(f"{url}/write?db=x&precision=s", line).status == 401
    # as InfluxDB: without credentials nothing is said about the request (no 400 for its parameters)
    assert http(f"{url}/write?db=x&precision=fortnights", line).status == 401
    assert http(f"{url}/api/v2/write?org=site&precision=s", line).status == 401
    v2_no_bucket = http(
        f"{url}/api/v2/write?org=site", line, headers={"Authorization": f"Token {other}:0ther"}
    )
    assert v2_no_bucket.status == 400 and v2_no_bucket.json()["message"] == "bucket is required"
    assert stored_lines(nats_server.url, other) == [line.decode()]
    assert all(not x.startswith("gw_basic") for x in stored_lines(nats_server.url, cluster))


def test_https_with_the_certificate_from_the_settings(
    nats_server: NatsServer, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    pki = Pki(tmp_path, "gateway")
    cert, key = pki.issue("gateway", server=True)
    port = free_port()
    argv = ["gateway", "--nats", nats_server.url, "--cluster", cluster, "--listen", f"{LOOPBACK}:{port}"]
    w = Worker([*argv, "--http-cert", str(cert), "--http-key", str(key)], tmp_path / "tls.log")
    workers.append(w)
    assert "listening on https://" in w.start(ready="listening on").log()
    url, trusted = f"https://{LOOPBACK}:{port}", ssl.create_default_context(cafile=str(pki.ca_path))
    wait_for(
        lambda: http(url + "/health", method="GET", context=trusted).status == 200, 20, "healthy over TLS"
    )
    line = f"gw_tls,hostname=n1,type=node value=1 {int(time.time())}".encode()
    assert http(f"{url}/write?db=x&precision=s", line, context=trusted).status == 204
    assert stored_lines(nats_server.url, cluster) == [line.decode()]
    with pytest.raises(OSError):  # plain HTTP is not answered
        urllib.request.urlopen(f"http://{LOOPBACK}:{port}/ping", timeout=10)


# --- Sonar's HTTP sink -> consume sonar -> consume influx --------------------------------------------------


def test_sonar_http_sink_envelopes_reach_influxdb(
    nats_factory: Any, influxdb: InfluxDB, tmp_path: Path, workers: list[Process]
) -> None:
    server = nats_factory()  # the corpus' cluster names are fixed: a bus of this test's own
    naic, uio = "cluster1.naic.com", "cluster1.uio.no"
    path = auth_file(tmp_path, {naic: "naic-pw", uio: "uio-pw"})
    _, url = start_gateway(workers, tmp_path, server.url, "--auth-file", str(path))
    sample = (SONAR / "jobanalyzer__cluster1_sample_v0.19.jsonl").read_bytes()
    gpu_samples = (SONAR / "jobanalyzer__n1_sample_gpu_v0.14.jsonl").read_bytes()

    # refused: wrong password, another cluster's body, a topic that is no Sonar type -- nothing published
    assert http(f"{url}/sonar/sample", sample, headers=basic(naic, "uio-pw")).status == 401
    refused = http(f"{url}/sonar/sample", gpu_samples, headers=basic(naic, "naic-pw"))
    assert refused.status == 403 and "'cluster1.uio.no'" in refused.json()["error"]
    assert http(f"{url}/sonar/bogus", sample, headers=basic(naic, "naic-pw")).status == 404
    assert stored(server.url, naic) == [] and stored(server.url, uio) == []

    # as Sonar's HTTP sink sends them (topic path, Basic auth with the cluster as user), and Jobanalyzer's path
    answer = http(
        f"{url}/sonar/test.sample",
        sample,
        headers={**basic(naic, "naic-pw"), "Content-Type": "application/json"},
    )
    assert answer.status == 200 and answer.json() == {"published": 1}
    assert http(f"{url}/api/v1/insert/sample", gpu_samples, headers=basic(uio, "uio-pw")).json() == {
        "published": 2
    }
    on_bus = stored(server.url, naic)
    assert [(s, p) for s, p, _ in on_bus] == [(f"{naic}.sonar.sample", sample.strip())]
    assert [s for s, _, _ in stored(server.url, uio)] == [f"{uio}.sonar.sample"] * 2

    # the real translator and writer: the envelope's lines in InfluxDB, translated once
    db = f"gw_{uuid.uuid4().hex[:8]}"
    config = tmp_path / "workers.toml"
    config.write_text("[delivery]\nstats_seconds = 3600.0\n")
    for argv, name in [
        (["consume", "sonar", "--to", "lp"], "sonar"),
        (["consume", "influx", "--influx-url", influxdb.url, "--db", db], "influx"),
    ]:
        w = Worker(
            [*argv, "--nats", server.url, "--cluster", naic, "--config", str(config)],
            tmp_path / f"{name}.log",
        )
        workers.append(w)
        w.start()
    env = decode_envelope(sample, expect="sample")
    expected = envelope_to_lines(env, cluster=naic)
    metric = next(line for line in expected if "value" in line.fields)
    wanted = sum(1 for line in expected if line.measurement == metric.measurement)

    def rows() -> list[dict[str, Any]]:
        return influxdb.points(f'SELECT * FROM "{metric.measurement}"', db) if db in _dbs(influxdb) else []

    got = wait_for(lambda: len(rows()) >= wanted and rows(), 60, lambda: f"{metric.measurement} in {db}")
    assert len(got) == wanted  # translated once: no second copy of the lines
    lines_on_bus = [s for s, _, _ in stored(server.url, naic) if s == f"{naic}.metrics"]
    assert lines_on_bus, "consume sonar --to lp published the lines on the metrics subject"


def _dbs(influxdb: InfluxDB) -> set[str]:
    return {row["name"] for row in influxdb.points("SHOW DATABASES")}


# --- Sonar 0.19: Clustername, application/json ---------------------------------------------------------------

LONG_CLUSTER = "the-norwegian-research-infrastructure-services-national-hpc-cluster.sigma2.no"
"""A Clustername that is no Hostname (its first label is over 63 characters): Sonar 0.19 types cluster fields
`Clustername`, "the same restrictions on character set as Hostname ... typically an FQDN, but it need not
be" (util/formats/newfmt/types.go); until issue 32 the gateway refused it as a Hostname."""
T19 = "2026-05-18T10:37:36+02:00"


def test_the_refusal_status_is_decided_by_the_kind_of_problem_not_its_words() -> None:
    """403 only when every error is marked `FORBIDDEN` where it is made (another cluster's or host's valid
    name); a problem whose text merely reads like one (it quotes the request) is 400."""
    from hpcbus.producers.gateway.sonar import refusal_status
    from hpcbus.schemas.problems import FORBIDDEN, Problem

    quoted = Problem("'this request may publish for' is not a valid Hostname", path="data.attributes.node")
    foreign = Problem("'saga': this request may publish for 'fox' only", path="data.attributes.cluster")
    foreign = msgspec.structs.replace(foreign, code=FORBIDDEN)
    assert refusal_status([quoted], published=False) == (400, "invalid")
    assert refusal_status([foreign], published=False) == (403, "forbidden")
    assert refusal_status([foreign, quoted], published=False) == (400, "invalid")
    assert refusal_status([foreign], published=True) == (400, "invalid")  # a partial write


def sonar_envelopes(cluster: str) -> dict[str, dict[str, Any]]:
    """One envelope of each data type, written by hand from Sonar's types.go and doc/NEW-FORMAT.md."""
    meta = {"producer": "sonar", "version": "0.19.0-devel", "format": 0}
    node = "c1-10"  # `hostname-only` (0.19's default): the leaf name
    sample = {
        "time": T19,
        "cluster": cluster,
        "node": node,
        "system": {"boot": "2026-05-01T08:00:00+02:00", "cpus": [1200, 340], "used_memory": 1048576},
        "jobs": [
            {
                "job": 4711,
                "user": "alice",
                "epoch": 0,
                "processes": [
                    {"resident_memory": 20480, "virtual_memory": 40960, "cmd": "python", "pid": 3141}
                ],
            }
        ],
    }
    sysinfo = {
        "time": T19,
        "cluster": cluster,
        "node": node,
        "os_name": "Linux",
        "os_release": "5.14.0-503.el9.x86_64",
        "architecture": "x86_64",
        "sockets": 2,
        "cores_per_socket": 64,
        "threads_per_core": 1,
        "memory": 263921504,
    }
    job = {
        "time": T19,
        "cluster": cluster,
        "slurm_jobs": [{"job_id": 4711, "job_state": "RUNNING", "nodes": ["c1-[10-11]"]}],
    }
    state = {
        "time": T19,
        "cluster": cluster,
        "slurm": True,
        "partitions": [{"name": "normal", "nodes": ["c1-[10-28]"]}],
        "nodes": [{"names": ["c1-[10-11]"], "states": ["MIXED"]}],
    }
    return {
        kind: {"meta": meta, "data": {"type": kind, "attributes": attrs}}
        for kind, attrs in (("sample", sample), ("sysinfo", sysinfo), ("job", job), ("cluster", state))
    }


def is_json(answer: Answer) -> Any:
    """The answer's JSON, checked to be declared `application/json`."""
    assert answer.headers.get("Content-Type", "").split(";")[0].strip() == "application/json", answer.headers
    return answer.json()


def test_sonar_0_19_clustername_and_application_json_on_every_sonar_path(
    nats_factory: Any, tmp_path: Path, workers: list[Process]
) -> None:
    """Issue 32 item 4. Sonar 0.19's HTTP sink (src/datasink/http.rs, http_upload.rs) runs curl with
    `-H "Content-Type: application/json"`, Basic auth with the cluster as user, one envelope and a newline per
    POST to `<api-root>/<topic>`. Each envelope kind is stored for a cluster whose name is a Clustername but no
    Hostname, on every Sonar path; every answer there, success or refusal, also aiohttp's own 404 and 405
    (plain text until now), is JSON declared `application/json`."""
    server = nats_factory()
    path = auth_file(tmp_path, {LONG_CLUSTER: "pw"})
    _, url = start_gateway(workers, tmp_path, server.url, "--auth-file", str(path))
    sonar = {**basic(LONG_CLUSTER, "pw"), "Content-Type": "application/json"}  # what Sonar's curl sends

    envelopes = sonar_envelopes(LONG_CLUSTER)
    for kind, env in envelopes.items():
        body = json.dumps(env).encode() + b"\n"
        for where in (f"/sonar/{kind}", f"/sonar/test.{kind}", f"/api/v1/insert/{kind}"):
            answer = http(url + where, body, headers=sonar)
            assert answer.status == 200, (where, answer.body)
            assert is_json(answer) == {"published": 1}
    stored_kinds = sorted(s for s, _, _ in stored(server.url, LONG_CLUSTER))
    # the same envelope on one subject has one message id: each kind stored once, three posts answered
    assert stored_kinds == sorted(f"{LONG_CLUSTER}.sonar.{kind}" for kind in envelopes)

    def refused(
        where: str, body: bytes | None, headers: dict[str, str], method: str = "POST"
    ) -> tuple[int, str]:
        answer = http(url + where, body, method=method, headers=headers)
        return answer.status, is_json(answer)["error"]

    sample = envelopes["sample"]
    body = json.dumps(sample).encode() + b"\n"
    status, error = refused("/sonar/sample", body, {**sonar, **basic(LONG_CLUSTER, "wrong")})
    assert status == 401
    other = json.dumps(sonar_envelopes("fox.educloud.no")["sample"]).encode()
    status, error = refused("/sonar/sample", other, sonar)
    assert status == 403 and "'fox.educloud.no'" in error
    # a cluster field that is no Clustername ('_' is not in Sonar's character set): invalid, 400 naming it
    bad = json.dumps(sonar_envelopes("fox_1")["sample"]).encode()
    status, error = refused("/sonar/sample", bad, sonar)
    assert (
        status == 400 and "data.attributes.cluster" in error and "not a valid Clustername: 'fox_1'" in error
    )
    # the status is decided on the kind of problem, never on its words, which quote the request: an invalid
    # node whose value reads like the foreign-cluster refusal is invalid input (400), not a foreign cluster
    posing = sonar_envelopes(LONG_CLUSTER)["sample"]
    posing["data"]["attributes"]["node"] = "this request may publish for"
    status, error = refused("/sonar/sample", json.dumps(posing).encode(), sonar)
    assert status == 400 and "data.attributes.node" in error and "this request may publish for" in error
    assert refused("/sonar/sample", b"{not json", sonar)[0] == 400
    assert refused("/sonar/bogus", body, sonar)[0] == 404
    # aiohttp's own answers on the Sonar paths: no route, wrong method
    for where in ("/sonar/", "/sonar/a/sample", "/api/v1/insert/"):
        status, error = refused(where, body, sonar)
        assert status == 404 and where in error
    for where in ("/sonar/sample", "/api/v1/insert/job"):
        answer = http(url + where, method="GET", headers=sonar)
        assert answer.status == 405 and answer.headers["Allow"] == "POST"
        assert "GET" in is_json(answer)["error"]
    assert sorted(s for s, _, _ in stored(server.url, LONG_CLUSTER)) == stored_kinds  # nothing refused stored


# --- NATS away -----------------------------------------------------------------------------------------------


def test_nats_down_means_503_and_the_retry_is_stored_once(
    nats_factory: Any, cluster: str, tmp_path: Path, workers: list[Process]
) -> None:
    server = nats_factory()
    _, url = start_gateway(workers, tmp_path, server.url, "--cluster", cluster, "--retry-after", "1")
    t = int(time.time())
    body = f"gw_down,hostname=n1,type=node value=1 {t}\n".encode()
    server.stop()
    answer = http(f"{url}/write?db=x&precision=s", body)
    assert answer.status == 503 and answer.headers["Retry-After"] == "1"
    assert "NATS" in answer.json()["error"]
    assert http(url + "/health", method="GET").status == 503
    server.start()
    assert stored(server.url, cluster) == []  # nothing was acknowledged, nothing was stored

    # a client that retries as told: stored once, however often it sent
    tries = 0
    while True:
        tries += 1
        answer = http(f"{url}/write?db=x&precision=s", body)
        if answer.status != 503:
            break
        assert tries < 60, answer.body
        time.sleep(float(answer.headers.get("Retry-After", "1")) / 4)
    assert answer.status == 204
    assert http(f"{url}/write?db=x&precision=s", body).status == 204  # the answer "lost": sent again
    assert [p for _, p, _ in stored(server.url, cluster)] == [body]

    # progress: the counters as hpcbus_* lines on the cluster's telemetry subject (a gateway reporting often)
    _, url = start_gateway(
        workers, tmp_path, server.url, "--cluster", cluster, "--stats-seconds", "0.2", name="gw2"
    )
    assert http(f"{url}/write?db=x&precision=s", body).status == 204

    def counters() -> dict[str, float]:
        own = [
            line
            for subject, payload, _ in stored(server.url, cluster)
            if subject == subjects.telemetry(cluster)  # never on <cluster>.metrics, which nodes own
            for line in payload.decode().splitlines()
        ]
        lines = parse_payload("\n".join(own), now=int(time.time())).lines
        return {
            line.measurement: float(line.fields["value"])
            for line in lines
            if line.tags.get("stype-id") == "gateway-influx-v1"
        }

    seen = wait_for(lambda: counters().get("hpcbus_duplicate_messages"), 20, "the gateway's hpcbus_* lines")
    assert seen == 1 and counters()["hpcbus_requests"] == 1 and counters()["hpcbus_delivered"] == 1


def test_never_connected_answers_503_and_stops_on_sigterm(tmp_path: Path, workers: list[Process]) -> None:
    port, nowhere = free_port(), free_port()
    argv = [
        "gateway",
        "--nats",
        f"nats://{LOOPBACK}:{nowhere}",
        "--cluster",
        "x",
        "--listen",
        f"{LOOPBACK}:{port}",
    ]
    w = Worker(argv, tmp_path / "gateway.log")
    workers.append(w)
    w.start(ready="listening on")
    url = f"http://{LOOPBACK}:{port}"
    assert http(url + "/health", method="GET").json()["nats"] == "unreachable"
    assert http(url + "/write", b"a,hostname=n1,type=node value=1").status == 503
    start = time.monotonic()
    assert w.terminate() == 0
    assert time.monotonic() - start < 5
    assert "x influx-v1: 1 requests, 0 lines published, 0 refused, 1 answered 503" in w.log()


# --- Slurm's acct_gather_profile/influxdb plugin -----------------------------------------------------------


def test_slurm_profile_plugin_through_the_gateway(
    slurm: SlurmCluster,
    nats_server: NatsServer,
    influxdb: InfluxDB,
    cluster: str,
    tmp_path: Path,
    workers: list[Process],
) -> None:
    port = free_port()
    gw, _ = start_gateway(workers, tmp_path, nats_server.url, "--cluster", cluster, port=port)
    db = f"gw_{uuid.uuid4().hex[:8]}"
    writer = Worker(
        [
            "consume",
            "influx",
            "--nats",
            nats_server.url,
            "--cluster",
            cluster,
            "--influx-url",
            influxdb.url,
            "--db",
            db,
        ],
        tmp_path / "influx.log",
    )
    workers.append(writer)
    writer.start()
    marks = tmp_path / "marks"
    marks.mkdir()
    marks.chmod(0o777)
    script = f"""#!/bin/sh
srun sleep 2
touch {marks}/A; while [ ! -e {marks}/B ]; do sleep 0.1; done
srun sleep 2
touch {marks}/C; while [ ! -e {marks}/D ]; do sleep 0.1; done
srun sleep 2
"""
    log = slurm.log_dir / "slurmd.log"
    log_start = log.stat().st_size if log.exists() else 0
    profile = InfluxProfile(host=f"{LOOPBACK}:{port}", database="slurm", default="None")
    with slurm.profile_set_to(profile):
        job = slurm.sbatch(script, "--profile=task")

        def steps() -> set[str]:
            return {
                line.tags.get("step", "")
                for line in parse_payload(
                    "\n".join(stored_lines(nats_server.url, cluster)), now=int(time.time())
                ).lines
                if line.tags.get("job") == str(job)
            }

        wait_for(lambda: (marks / "A").exists(), 60, "step 0 done")
        wait_for(lambda: "0" in steps(), 30, "step 0's profile on the bus")
        assert gw.terminate() == 0  # SIGTERM: the gateway goes away while the job runs
        (marks / "B").touch()
        wait_for(lambda: (marks / "C").exists(), 60, "step 1 done (its profile POSTed to nobody)")
        gw, _ = start_gateway(
            workers, tmp_path, nats_server.url, "--cluster", cluster, port=port, name="gateway2"
        )
        (marks / "D").touch()
        assert slurm.wait_job(job, timeout=90) == "COMPLETED"
        wait_for(
            lambda: {"0", "2", "batch"} <= steps(), 30, lambda: f"steps 2 and batch on the bus: {steps()}"
        )
    # what the plugin itself discarded while the gateway was down: step 1's batch, and nothing else
    discarded = log.read_text(errors="replace")[log_start:].count("(discarded)")
    assert discarded >= 1
    assert "1" not in steps()
    lines = [
        line
        for line in parse_payload(
            "\n".join(stored_lines(nats_server.url, cluster)), now=int(time.time())
        ).lines
        if line.tags.get("job") == str(job)
    ]
    names = {line.measurement for line in lines}
    assert {"slurm_rss", "slurm_cpu_utilization", "slurm_vm_size"} <= names
    assert all(line.tags["hostname"] == slurm.node_name and line.tags["type"] == "node" for line in lines)
    print(
        f"job {job}: {len(lines)} profile lines on the bus, steps {sorted(steps())}; step 1 lost ({discarded} discard(s) logged by slurmstepd)"
    )

    def rss_rows() -> list[dict[str, Any]]:
        return (
            influxdb.points(f'SELECT * FROM "slurm_rss" WHERE "job" = \'{job}\'', db)
            if db in _dbs(influxdb)
            else []
        )

    rows = wait_for(
        lambda: {"0", "2"} <= {r["step"] for r in rss_rows()} and rss_rows(), 60, "slurm_rss in InfluxDB"
    )
    assert {r["hostname"] for r in rows} == {slurm.node_name}
