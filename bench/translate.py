"""Sonar <-> line protocol translation of a realistic node, against bare parsers on the same bytes.

The node: 128 hwthreads, 4 GPUs, 4 disks, 300 processes in 20 jobs (a few using GPUs), ~3,000 lines per
sample; `N_SAMPLES` consecutive samples of it.

- LP -> Sonar: each sample goes on the bus as hpcbus sends it (`route` by subject, `batch` into NATS
  payloads: the skeleton on `.events.sample`, the metric lines in 512 KiB messages), and each message is
  read (`read_payload`, what `consume sonar --to sonar` does: the compiled reading where it is built) and
  fed to `LpToSonar` until every envelope is complete; asserted equal to the pure path's envelopes
  (`parse_payload`) and to the envelopes sent. Baseline: bare `line_protocol_parser.parse_line` of every
  line of the same messages, keeping the parsed dicts until the message is done (as bench/lineprotocol.py
  does) — the least any LP consumer does. Target >= 1.0x (issue 24).
- Sonar -> LP: the envelope's JSON is decoded and validated (`decode_envelope`) and written as the NATS
  payloads of each subject (`envelope_payloads`), what the Sonar bridge publishes; asserted equal, byte for
  byte, to `route(envelope_to_lines(...))` + `batch` (with the compiled writer `_write.c` where it is built:
  `hpcbus --version`). Baseline: bare `msgspec.json.decode` of the same JSON (untyped). Target >= 0.30x
  (issue 24). Timed as the bridge runs it, and as the baseline treats its decoded objects: each sample's
  messages are made and dropped (published, in the bridge) before the next. Kept for a whole round of 20
  samples (~10 MB), they land in fresh pages or in a freed round's, as glibc's heap happens to be, and that
  page-fault cost (~130 a sample, ~1 us each in this VM), not the writer, made the row swing between 0.27x
  and 0.33x on the 2-core machine.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from line_protocol_parser import parse_line

from bench.timing import interleaved, report
from hpcbus.schemas.lineprotocol import Parsed, parse_payload
from hpcbus.schemas.problems import Problem
from hpcbus.schemas.sonar import decode_envelope, encode_envelope
from hpcbus.schemas.sonar.types import (
    Metadata,
    SampleAttributes,
    SampleData,
    SampleDisk,
    SampleEnvelope,
    SampleGpu,
    SampleJob,
    SampleProcess,
    SampleProcessGpu,
    SampleSystem,
)
from hpcbus.schemas.translate import Assembled, LpToSonar, batch, envelope_payloads, envelope_to_lines, route
from hpcbus.schemas.translate.lp_read import read_payload

N_SAMPLES = 20
CLUSTER = "bench.example"
T0 = 1_769_588_568


def node_envelope(k: int = 0) -> SampleEnvelope:
    """Sample `k` (30 s apart) of a busy GPU node; every value non-zero, so each field becomes a line."""
    gpus = [
        SampleGpu(
            index=g,
            uuid=f"GPU-85e5c974-926f-e54f-9828-ad1d868046{g:02x}",
            fan=30 + g,
            compute_mode="Default",
            performance_state=1,
            memory=9_503_680 + k,
            ce_util=48 + g,
            memory_util=17,
            temperature=75,
            power=208,
            power_limit=300,
            ce_clock=1410,
            memory_clock=1215,
        )
        for g in range(4)
    ]
    disks = [
        SampleDisk(name=f"nvme{d}n1", major=259, minor=d, stats=[1000 * (d + 1) + i + k for i in range(17)])
        for d in range(4)
    ]
    jobs = []
    for j in range(20):
        job_id = 2_940_000 + j
        procs = []
        for p in range(15):
            pid = 100_000 + 100 * j + p
            procs.append(
                SampleProcess(
                    resident_memory=13_305_344 + p,
                    virtual_memory=26_000_000 + p,
                    cmd="python3" if p else "slurm_script",
                    pid=pid,
                    ppid=pid - 1 if p else 1,
                    num_threads=4,
                    cpu_avg=98.5 + p,
                    cpu_util=99.25,
                    cpu_time=6284 + k * 30,
                    data_read=1024 * p + 1,
                    data_written=512 * p + 1,
                    gpus=[
                        SampleProcessGpu(index=j % 4, uuid=gpus[j % 4].uuid, gpu_util=59.0, gpu_memory=8838)
                    ]
                    if p == 1 and j < 8
                    else [],
                )
            )
        jobs.append(SampleJob(job=job_id, user=f"u_{10000 + j}", epoch=0, processes=procs))
    system = SampleSystem(
        boot="2026-01-14T11:39:00+00:00",
        cpus=[738_432 + 1000 * i + 30 * k for i in range(128)],
        gpus=gpus,
        disks=disks,
        used_memory=169_964_060,
        load1=102.44,
        load5=115.35,
        load15=111.83,
        runnable_entities=31,
        existing_entities=4599,
    )
    seconds = T0 + 30 * k
    minute, second = divmod(seconds % 3600, 60)
    attrs = SampleAttributes(
        time=f"2026-01-28T09:{minute:02d}:{second:02d}+01:00",
        cluster=CLUSTER,
        node="c1-10.bench",
        system=system,
        jobs=jobs,
    )
    return SampleEnvelope(
        meta=Metadata(producer="sonar", version="0.18.0"), data=SampleData(attributes=attrs)
    )


def messages(envelopes: list[SampleEnvelope]) -> list[bytes]:
    """Every NATS payload hpcbus publishes for these envelopes, in publishing order."""
    out: list[bytes] = []
    for env in envelopes:
        for lines in route(envelope_to_lines(env)).values():
            out.extend(batch(lines))
    return out


def run() -> list[str]:
    envelopes = [node_envelope(k) for k in range(N_SAMPLES)]
    payloads = messages(envelopes)
    n_lines = sum(p.count(b"\n") for p in payloads)
    raws = [encode_envelope(env) for env in envelopes]

    def bare_parse() -> None:
        for payload in payloads:
            kept = []  # any consumer keeps what it parsed until the message is handled
            for s in payload.decode().split("\n"):
                if s:
                    kept.append(parse_line(s))

    def lp_to_sonar(read: Callable[..., Parsed] = read_payload) -> list[Assembled]:
        translator = LpToSonar()
        out: list[Assembled] = []
        unmade: list[Problem] = []  # an event with no decodable envelope: none here, and never dropped unseen
        for i, payload in enumerate(payloads):
            out += translator.add_lines(read(payload, now=0).lines, now=i, problems=unmade)
        out += translator.flush_all()
        assert unmade == [], unmade
        return out

    done = lp_to_sonar()
    assert [a.envelope for a in done] == envelopes and all(a.complete for a in done)
    assert done == lp_to_sonar(parse_payload)  # the compiled reading builds the pure path's envelopes

    def bare_decode() -> None:
        for raw in raws:
            msgspec.json.decode(raw)

    def sonar_to_lp() -> list[dict[str, list[bytes]]]:
        return [envelope_payloads(decode_envelope(raw)) for raw in raws]

    def bridge() -> None:
        for raw in raws:  # each sample's messages published and dropped, as the bridge does
            envelope_payloads(decode_envelope(raw))

    # the fast path's messages (compiled where `_write.c` is built) are those of the reference path (Line
    # objects, `route`, `batch`: pure Python, no C), byte for byte
    assert sonar_to_lp() == [
        {s: list(batch(g)) for s, g in route(envelope_to_lines(decode_envelope(raw))).items()} for raw in raws
    ]

    t_bare, t_ours, t_dec, t_lp = interleaved([bare_parse, lp_to_sonar, bare_decode, bridge])
    node = f"{n_lines // N_SAMPLES:,} lines/sample"
    return [
        report(f"LP->Sonar ({node}) vs bare parse_line", t_ours, t_bare, n_lines, "lines", target=1.0),
        report("Sonar->LP vs bare msgspec.json.decode", t_lp, t_dec, N_SAMPLES, "envelopes", target=0.30),
        report("Sonar->LP vs bare msgspec.json.decode", t_lp, t_dec, n_lines, "lines"),
    ]
