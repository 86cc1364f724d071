"""`hpcbus produce slurm` without a Slurm: the state filter, the state file, the zone, the command runner, and
what one poll of the real sacct corpus turns into on the bus (tests/test_slurm_producer.py runs the same
code against a real single-node Slurm)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import msgspec
import pytest

from hpcbus.producers.slurm.poller import Poll, read_sacct, read_squeue, run_command, sacct_time
from hpcbus.producers.slurm.producer import Outgoing, SlurmProducer
from hpcbus.producers.slurm.settings import SlurmSettings
from hpcbus.producers.slurm.state import ALWAYS, SlurmState, StepEntry
from hpcbus.producers.slurm.zone import SystemLocal, resolve_zone
from hpcbus.schemas.lineprotocol import parse_payload
from hpcbus.schemas.slurm.sacct import SACCT_FIELDS, to_slurm_job
from hpcbus.schemas.sonar.types import (
    ClusterAttributes,
    ClusterNodes,
    ClusterPartition,
    JobsEnvelope,
    SacctData,
    SlurmJob,
)
from hpcbus.schemas.sonar.validate import decode_envelope
from hpcbus.schemas.translate import JobsAssembler, msg_id
from tests.corpus import CORPUS

CET = timezone(timedelta(hours=2))  # Sonar's own sacct test runs with TZ=CET-2
RUNNING_PENDING = CORPUS / "slurm" / "sonar_sacct_output_running-pending.txt"
COMPLETED = CORPUS / "slurm" / "sonar_sacct-output_completed.txt"


def job(**fields: Any) -> SlurmJob:
    base: dict[str, Any] = {
        "job_id": 7,
        "job_name": "sim",
        "job_state": "RUNNING",
        "submit_time": "2026-01-01T10:00:00+01:00",
        "user_name": "alice",
        "nodes": ["c[1-2]"],
        "start_time": "2026-01-01T10:05:00+01:00",
        "sacct": SacctData(elapsed_raw=60),
    }
    base.update(fields)
    return SlurmJob(**base)


def sent_fields(record: SlurmJob | None) -> set[str]:
    assert record is not None
    return set(msgspec.to_builtins(record))


# --- the state filter -------------------------------------------------------------------------------------


def test_first_record_whole_then_only_changes_with_the_always_fields() -> None:
    state = SlurmState("c")
    first = job()
    assert state.changes(first, 100) == first
    assert state.changes(job(), 160) is None  # nothing changed
    assert state.changes(job(sacct=SacctData(elapsed_raw=120)), 220) is None  # ElapsedRaw ticks while running

    ended = job(
        job_state="COMPLETED", end_time="2026-01-01T11:00:00+01:00", sacct=SacctData(elapsed_raw=3300)
    )
    part = state.changes(ended, 280)
    assert sent_fields(part) == {"job_id", "job_name", "job_state", "submit_time", "end_time", "sacct"}
    assert part is not None and part.sacct == SacctData(elapsed_raw=3300) and part.job_state == "COMPLETED"
    assert "nodes" not in sent_fields(part) and "user_name" not in sent_fields(part)
    # A final step keeps one digest, not one per field.
    assert list(state.steps[(7, "")].digests) == ["*"]
    assert state.changes(ended, 340) is None
    late = msgspec.structs.replace(ended, sacct=SacctData(elapsed_raw=3300, max_rss=1024))
    assert state.changes(late, 400) == late  # late accounting after the end: the whole record again


def test_always_fields_and_steps_are_separate() -> None:
    state = SlurmState("c")
    state.changes(job(), 1)
    step = job(job_step="batch", job_name="batch")
    assert state.changes(step, 1) == step  # another step: its own entry
    changed = state.changes(job(partition="normal"), 2)
    assert sent_fields(changed) == {*ALWAYS, "partition"} - {"job_step"}  # "" job_step is omitted
    assert changed is not None and changed.nodes == []


def test_a_field_that_goes_empty_is_sent_again_when_it_comes_back() -> None:
    state = SlurmState("c")
    state.changes(job(job_state="PENDING", nodes=[], start_time=""), 1)
    state.changes(job(), 2)
    assert state.changes(job(job_state="REQUEUED", nodes=[], start_time=""), 3) is not None
    back = state.changes(job(job_state="RUNNING"), 4)
    assert {"nodes", "start_time"} <= sent_fields(back)


def test_state_file_round_trip_prune_and_bad_files(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = SlurmState("fox.educloud.no")
    state.window_end = 1_700_000_000
    state.cluster_digest, state.cluster_sent = 2**64 - 1, 1_700_000_000
    state.changes(job(), 1_700_000_000)
    state.changes(job(job_id=8, job_step="batch"), 1_600_000_000)
    state.mark(7, 1, 1_700_000_000)
    path = tmp_path / "sub" / "slurm.state"
    state.save(path)
    assert json.loads(path.read_text())["steps"]["8.batch"][0] == 1_600_000_000  # readable with jq
    loaded = SlurmState.load(path, "fox.educloud.no")
    assert loaded.to_file() == state.to_file()
    assert loaded.changes(job(), 1_700_000_060) is None  # a restart does not resend
    assert loaded.cc(7) == 1
    assert loaded.prune(1_700_000_060, 86400) == 1 and (8, "batch") not in loaded.steps

    assert SlurmState.load(path, "other").steps == {}  # another cluster's file is not used
    path.write_text("{not json")
    assert SlurmState.load(path, "fox.educloud.no").steps == {}
    assert SlurmState.load(tmp_path / "missing", "x").window_end == 0
    assert "unusable" in caplog.text and "is for cluster fox.educloud.no" in caplog.text
    assert not list(path.parent.glob(".*.tmp"))


def test_step_entry_is_compact() -> None:
    encoded = msgspec.json.encode(StepEntry(seen=1, digests={"*": 2**64 - 1}, cc=3))
    assert encoded == b'[1,{"*":18446744073709551615},3]'


# --- zones ------------------------------------------------------------------------------------------------


def test_resolve_zone_names_and_offsets() -> None:
    assert resolve_zone("Europe/Oslo") == (ZoneInfo("Europe/Oslo"), "Europe/Oslo")
    assert resolve_zone("UTC") == (UTC, "UTC0")
    tz, tz_env = resolve_zone("+05:30")
    assert tz == timezone(timedelta(hours=5, minutes=30)) and tz_env == "<+0530>-05:30"
    assert resolve_zone("-03:00")[1] == "<-0300>+03:00"
    assert isinstance(resolve_zone("")[0], SystemLocal) and resolve_zone("")[1] is None
    with pytest.raises(ValueError, match="not a known time zone"):
        resolve_zone("Mars/Olympus")


@pytest.mark.parametrize("offset", ["+05:30", "-03:00"])
def test_posix_tz_of_an_offset_is_what_the_c_library_applies(offset: str) -> None:
    """The commands get `TZ=<+0530>-05:30`; `date` (glibc, like sacct) must print that very offset."""
    tz_env = resolve_zone(offset)[1]
    assert tz_env is not None
    out = subprocess.run(["date", "+%z"], env={**os.environ, "TZ": tz_env}, capture_output=True, text=True)
    assert out.stdout.strip() == offset.replace(":", "")


def test_system_local_follows_dst_like_the_c_library() -> None:
    """Run in a child with TZ set: SystemLocal must give Oslo's winter and summer offsets, as ZoneInfo does."""
    code = (
        "from datetime import datetime; from hpcbus.producers.slurm.zone import SystemLocal; tz = SystemLocal(); "
        "print(datetime(2026, 1, 15, 12, tzinfo=tz).isoformat(), datetime(2026, 7, 15, 12, tzinfo=tz).isoformat(), "
        "datetime.fromtimestamp(1784109600, tz).isoformat())"
    )
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "TZ": "Europe/Oslo"},
        cwd=repo,
        capture_output=True,
        text=True,
    )
    assert out.stdout.split() == [
        "2026-01-15T12:00:00+01:00",
        "2026-07-15T12:00:00+02:00",
        datetime.fromtimestamp(1784109600, ZoneInfo("Europe/Oslo")).isoformat(),
    ], out.stderr


def test_sacct_time_is_local_wall_time() -> None:
    when = datetime(2026, 7, 1, 10, 0, 0, tzinfo=UTC)
    assert sacct_time(when, ZoneInfo("Europe/Oslo")) == "2026-07-01T12:00:00"


# --- commands ---------------------------------------------------------------------------------------------


def test_run_command_reports_exit_timeout_and_missing_binary() -> None:
    async def go() -> list[str]:
        env = dict(os.environ)
        ok = await run_command(["sh", "-c", "echo out; echo warn >&2"], env=env, timeout=5)
        assert ok.ok and ok.stdout == b"out\n"
        failed = await run_command(
            ["sh", "-c", "echo; echo 'sacct: error: Problem talking to the database' >&2; exit 1"],
            env=env,
            timeout=5,
        )
        slow = await run_command(["sleep", "10"], env=env, timeout=0.2)
        missing = await run_command(["/nonexistent/sacct", "-X"], env=env, timeout=5)
        return [failed.failure, slow.failure, missing.failure]

    failed, slow, missing = asyncio.run(go())
    assert failed.startswith("sh -c ") and failed.endswith(
        ": exit 1: sacct: error: Problem talking to the database"
    )
    assert slow == "sleep 10: timed out after 0.2 s"
    assert missing.startswith("/nonexistent/sacct -X: cannot run: ")


# --- one poll of the corpus -------------------------------------------------------------------------------


def corpus_poll(text: str, *, cluster: ClusterAttributes | None = None, squeue: bytes = b"") -> Poll:
    rows, problems = read_sacct(text.encode(), CET)
    queued, more = read_squeue(squeue, CET, {r.job_id for r in rows}) if squeue else ([], [])
    return Poll(
        time=datetime(2025, 9, 12, 15, 0, tzinfo=CET),
        sacct_ok=True,
        rows=rows,
        queued=queued,
        cluster=cluster,
        problems=problems + more,
    )


def decode(out: Outgoing, cluster: str) -> dict[str, list[Any]]:
    """What a consumer sees: every message's lines, parsed back, by kind."""
    seen: dict[str, list[Any]] = {
        "records": [],
        "start_job": [],
        "stop_job": [],
        "cluster": [],
        "nodestate": [],
    }
    for subject, payload, mid in out.messages():
        assert mid == msg_id(subject, payload)
        parsed = parse_payload(payload, now=0, place=subject)
        assert not parsed.problems, parsed.problems
        for line in parsed.lines:
            assert line.tags["cluster"] == cluster
            event = str(line.payload)
            if subject == f"{cluster}.events.slurm":
                env = decode_envelope(event)
                assert isinstance(env, JobsEnvelope) and env.data is not None
                seen["records"].extend(env.data.attributes.slurm_jobs)
            elif subject == f"{cluster}.events.job":
                assert line.tags["origin"] == "sonar"
                seen[line.tags["function"]].append(json.loads(event))
            elif subject == f"{cluster}.events.cluster":
                seen["cluster"].append(json.loads(event))
            else:
                assert subject == f"{cluster}.events.nodestate"
                seen["nodestate"].append(json.loads(event))
    return seen


def test_corpus_poll_publishes_every_row_then_nothing() -> None:
    text = RUNNING_PENDING.read_text()
    state = SlurmState("fox")
    producer = SlurmProducer(SlurmSettings(), "fox", state)
    rows, _ = read_sacct(text.encode(), CET)
    first = decode(producer.build(corpus_poll(text)), "fox")
    assert [(r.job_id, r.job_step) for r in first["records"]] == [(r.job_id, r.step) for r in rows]
    assert first["records"] == [to_slurm_job(r) for r in rows]  # the first time, whole records
    started = [r for r in rows if not r.step and r.start is not None and r.node_list]
    assert sorted(e["jobId"] for e in first["start_job"]) == sorted(r.job_id for r in started)
    ended = [r for r in started if r.state not in ("RUNNING", "PENDING", "SUSPENDED")]
    assert sorted(e["jobId"] for e in first["stop_job"]) == sorted(r.job_id for r in ended)
    gpu = next(e for e in first["start_job"] if e["jobId"] == 1879824)
    assert gpu["numNodes"] == 1 and gpu["resources"] == [{"hostname": "gpu-2"}] and gpu["numAcc"] == 1

    again = producer.build(corpus_poll(text))
    assert again.lines == {} and again.records == 0 and (again.started, again.stopped) == (0, 0)
    assert state.window_end == int(datetime(2025, 9, 12, 15, 0, tzinfo=CET).timestamp())


def test_a_bad_line_is_reported_with_command_and_line_and_the_rest_is_kept() -> None:
    lines = COMPLETED.read_text().splitlines()
    lines.insert(3, "973822|973822|user|acct|NOT A STATE|2024-11-13T11:08:00|Unknown|||")
    out = SlurmProducer(SlurmSettings(), "fox", SlurmState("fox")).build(corpus_poll("\n".join(lines)))
    assert [str(p) for p in out.problems] == [
        "sacct:4: sacct: 10 fields, expected 32 (" + "|".join(SACCT_FIELDS) + ")"
    ]
    assert out.records == len(lines) - 1


def test_start_before_stop_and_jobs_assembler_sees_one_envelope() -> None:
    text = COMPLETED.read_text()
    out = SlurmProducer(SlurmSettings(), "fox", SlurmState("fox")).build(corpus_poll(text))
    job_lines = out.lines["fox.events.job"]
    firsts: dict[int, str] = {}
    for line in job_lines:
        firsts.setdefault(json.loads(str(line.payload))["jobId"], line.tags["function"])
    assert set(firsts.values()) == {"start_job"}  # a job ended between polls: start first, then stop
    stops = [json.loads(str(line.payload)) for line in job_lines if line.tags["function"] == "stop_job"]
    assert {e["jobState"] for e in stops} == {
        "completed",
        "cancelled",
        "failed",
        "timeout",
    }  # OOM: steps only
    # The reverse direction gets exactly the envelope back and ignores the derived cc events.
    assembler = JobsAssembler()
    lines = [line for lines in out.lines.values() for line in lines]
    got = assembler.add_lines(lines, now=0) + assembler.flush_all()
    assert len(got) == 1 and got[0].complete
    env = got[0].envelope
    assert isinstance(env, JobsEnvelope) and env.data is not None
    assert len(env.data.attributes.slurm_jobs) == out.records == len(text.splitlines())


def test_held_jobs_come_from_squeue_only_when_sacct_did_not_list_them() -> None:
    squeue = json.dumps(
        {
            "jobs": [
                {"job_id": 1879824, "name": "dup", "job_state": "RUNNING", "submit_time": 1757700000},
                {
                    "job_id": 42,
                    "name": "held",
                    "job_state": "PENDING",
                    "submit_time": 1757700000,
                    "het_job_id": 42,
                },
                {
                    "job_id": 43,
                    "name": "held",
                    "job_state": "PENDING",
                    "submit_time": 1757700000,
                    "het_job_id": 42,
                    "het_job_offset": 1,
                },
            ]
        }
    ).encode()
    out = SlurmProducer(SlurmSettings(), "fox", SlurmState("fox")).build(
        corpus_poll(RUNNING_PENDING.read_text(), squeue=squeue)
    )
    records = decode(out, "fox")["records"]
    assert [r.job_name for r in records if r.job_id == 1879824 and not r.job_step] == ["siamE3F1"]  # sacct's
    held = [(r.job_id, r.het_job_id, r.het_job_offset) for r in records if r.job_name == "held"]
    assert held == [(42, 42, 0), (43, 42, 1)]


def test_cluster_envelope_when_changed_and_at_least_every_cluster_every() -> None:
    def attrs(state: str) -> ClusterAttributes:
        return ClusterAttributes(
            time="2025-09-12T15:00:00+02:00",
            cluster="fox",
            slurm=True,
            partitions=[ClusterPartition(name="normal", nodes=["c1-[1-4]"])],
            nodes=[ClusterNodes(names=["c1-[1-4]"], states=[state])],
        )

    state = SlurmState("fox")
    producer = SlurmProducer(SlurmSettings(cluster_every=3600), "fox", state)
    poll = corpus_poll("", cluster=attrs("IDLE"))
    first = decode(producer.build(poll), "fox")
    assert first["cluster"][0]["data"]["attributes"]["partitions"] == [
        {"name": "normal", "nodes": ["c1-[1-4]"]}
    ]
    assert [n["hostname"] for n in first["nodestate"][0]["nodes"]] == ["c1-1", "c1-2", "c1-3", "c1-4"]
    assert producer.build(poll).cluster == "unchanged"
    assert producer.build(corpus_poll("", cluster=attrs("MIXED"))).cluster == "sent"
    later = msgspec.structs.replace(poll, time=poll.time + timedelta(hours=1))
    assert producer.build(later).cluster == "sent"  # hourly even when unchanged
    failed = msgspec.structs.replace(poll, cluster=None, sacct_ok=False)
    assert producer.build(failed).cluster == "unavailable"


def test_window_starts_an_overlap_before_the_last_end_or_a_lookback_ago() -> None:
    state = SlurmState("fox")
    producer = SlurmProducer(SlurmSettings(overlap=300, lookback=3600), "fox", state)
    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    assert producer.window_start(now) == now - timedelta(hours=1)
    state.window_end = int((now - timedelta(minutes=1)).timestamp())
    assert producer.window_start(now) == now - timedelta(minutes=6)
    state.window_end = int((now + timedelta(hours=1)).timestamp())  # the clock went backwards
    assert producer.window_start(now) == now - timedelta(minutes=5)
