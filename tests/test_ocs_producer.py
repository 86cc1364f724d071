"""`hpcbus produce ocs` without a broker: the follower on real files in temp dirs (rotation, truncation,
partial lines, restarts), the mapping to Sonar records and cc-backend events, message ids, and `--once`
through the real CLI. The NATS service is tested in tests/test_ocs_producer_service.py."""

from __future__ import annotations

import itertools
import json
import logging
import socket
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hpcbus import cli
from hpcbus.producers.ocs.follow import (
    Chunk,
    Follower,
    FollowState,
    Position,
    StateError,
    load_state,
    save_state,
)
from hpcbus.producers.ocs.pipeline import Batch, Pipeline
from hpcbus.schemas.ccbackend import StartJob, StopJob
from hpcbus.schemas.lineprotocol import Line, parse_payload
from hpcbus.schemas.ocs import parse_line
from hpcbus.schemas.ocs.updates import INTERMEDIATE_EXIT, JobMerger
from hpcbus.schemas.sonar.types import JobsEnvelope, SlurmJob
from hpcbus.schemas.sonar.validate import decode_envelope
from hpcbus.schemas.translate import MAX_PAYLOAD, JobsAssembler
from tests.corpus import CORPUS

GE = CORPUS / "gridengine"
JSONL_FILE = GE / "ocs-9.0_accounting_sample_from-go-clusterscheduler-test.jsonl"
COLON_FILE = GE / "sge-colon_accounting_samples_from-apel-tests.txt"
CC_STOP_EXAMPLE = CORPUS / "clustercockpit" / "cc-backend" / "stopJobPayload.json"


def record(job: int, **kw: Any) -> str:
    """One OCS 9.1 JSONL accounting line (times in seconds here, written in µs as OCS does)."""
    start, end = kw.pop("start", 1_700_000_100), kw.pop("end", 1_700_003_700)
    cpu = kw.pop("cpu", 100.0)
    obj: dict[str, Any] = {
        "job_number": job,
        "task_number": kw.pop("task", 0),
        "start_time": start * 1_000_000,
        "end_time": end * 1_000_000,
        "owner": kw.pop("owner", "alice"),
        "group": "users",
        "account": kw.pop("account", "sge"),
        "qname": kw.pop("qname", "all.q"),
        "hostname": kw.pop("host", "c1"),
        "slots": kw.pop("slots", 1),
        "job_name": kw.pop("name", f"job{job}"),
        "priority": 0,
        "submission_time": kw.pop("submit", 1_700_000_000) * 1_000_000,
        "category": kw.pop("category", ""),
        "failed": kw.pop("failed", 0),
        "exit_status": kw.pop("exit_status", 0),
        "usage": {
            "rusage": {"ru_wallclock": max(0, end - start), "ru_utime": cpu * 0.9, "ru_stime": cpu * 0.1},
            "eusage": {
                "wallclock": max(0, end - start) + 1.0,
                "cpu": cpu,
                "mem": 1.0,
                "io": 0.5,
                "iow": 0.0,
                "maxvmem": float(kw.pop("maxvmem", 4 * 2**30)),
                "maxrss": float(kw.pop("maxrss", 2**30)),
            },
        },
    }
    for key in ("pe_taskid", "granted_pe", "deleted_by", "submit_cmd_line"):
        if key in kw:
            obj[key] = kw.pop(key)
    assert not kw, kw
    return json.dumps(obj)


def write(path: Path, *lines: str, end: str = "\n") -> None:
    path.write_text("".join(line + "\n" for line in lines[:-1]) + (lines[-1] + end if lines else ""))


def append(path: Path, text: str) -> None:
    with path.open("a") as fh:
        fh.write(text)


def read_all(follower: Follower) -> list[Chunk]:
    chunks = []
    while True:
        chunks.extend(follower.read())
        if not follower.behind:
            return chunks


def numbers(chunks: list[Chunk]) -> list[int]:
    return [line.number for chunk in chunks for line in chunk.lines]


def texts(chunks: list[Chunk]) -> list[str]:
    return [line.text.decode() for chunk in chunks for line in chunk.lines]


def job_numbers(chunks: list[Chunk]) -> list[int]:
    """The `job_number` of each JSONL line read."""
    return [json.loads(t)["job_number"] for t in texts(chunks)]


@pytest.fixture
def acct(tmp_path: Path) -> Path:
    return tmp_path / "accounting.jsonl"


# --- following ------------------------------------------------------------------------------------------------


def test_partial_last_line_waits_for_its_newline(acct: Path) -> None:
    third = record(3)
    acct.write_text(record(1) + "\n" + record(2) + "\n" + third[:25])
    follower = Follower(str(acct))
    chunks = follower.read()
    assert numbers(chunks) == [1, 2]
    assert chunks[-1].end.offset == acct.stat().st_size - 25
    assert follower.read() == []  # the half-written line is not handed on (nor reported as broken)
    append(acct, third[25:])
    assert follower.read() == []  # still no newline
    append(acct, "\n")
    chunks = follower.read()
    assert numbers(chunks) == [3] and texts(chunks) == [third]
    assert chunks[0].end.offset == acct.stat().st_size
    parse_line(texts(chunks)[0])  # the completed line is a whole record


def test_rotation_finishes_the_old_file_then_reads_the_new_one(acct: Path) -> None:
    write(acct, record(1), record(2))
    follower = Follower(str(acct))
    assert numbers(follower.read()) == [1, 2]
    old_inode = acct.stat().st_ino
    append(acct, record(3) + "\n")  # written just before the rotation, not read yet
    acct.rename(acct.with_name("accounting.jsonl.0"))
    write(acct, record(4), record(5))
    chunks = follower.read()
    assert [c.inode for c in chunks] == [old_inode, acct.stat().st_ino]
    assert [numbers([c]) for c in chunks] == [[3], [1, 2]]
    assert job_numbers(chunks) == [3, 4, 5]
    assert chunks[1].start.offset == 0
    assert follower.read() == []


def test_rename_before_the_new_file_exists(acct: Path) -> None:
    write(acct, record(1))
    follower = Follower(str(acct))
    follower.read()
    rotated = acct.with_name("accounting.jsonl.0")
    acct.rename(rotated)
    append(rotated, record(2) + "\n")  # the writer still holds the old file
    assert job_numbers(follower.read()) == [2]
    write(acct, record(3))
    assert job_numbers(follower.read()) == [3]


def test_rotated_file_gets_one_more_poll_to_finish_its_last_line(acct: Path) -> None:
    second = record(2)
    acct.write_text(record(1) + "\n" + second[:30])
    follower = Follower(str(acct))
    assert numbers(follower.read()) == [1]
    rotated = acct.with_name("accounting.jsonl.0")
    acct.rename(rotated)
    write(acct, record(3))
    assert follower.read() == []  # waits: the writer may still complete the line
    append(rotated, second[30:] + "\n")
    chunks = follower.read()
    assert job_numbers(chunks) == [2, 3]


def test_rotated_file_with_an_unterminated_line_is_reported(acct: Path) -> None:
    acct.write_text(record(1) + "\n" + record(2)[:30])
    follower = Follower(str(acct))
    follower.read()
    acct.rename(acct.with_name("accounting.jsonl.0"))
    write(acct, record(3))
    assert follower.read() == []
    chunks = follower.read()  # the tail did not grow for a whole poll: give up on it
    assert len(chunks) == 2
    (problem,) = chunks[0].problems
    assert (problem.place, problem.line, problem.kind) == (str(acct), 2, "ocs accounting")
    assert "never got its newline" in problem.reason
    assert job_numbers(chunks) == [3]


def test_truncation_restarts_at_zero(acct: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(acct, record(1), record(2), record(3))
    follower = Follower(str(acct))
    assert numbers(follower.read()) == [1, 2, 3]
    inode = acct.stat().st_ino
    with acct.open("r+") as fh:  # `> accounting` / copytruncate: same inode, shorter
        fh.truncate(0)
    append(acct, record(4) + "\n")
    assert acct.stat().st_ino == inode
    with caplog.at_level(logging.WARNING, "hpcbus.ocs"):
        chunks = follower.read()
    assert numbers(chunks) == [1] and json.loads(texts(chunks)[0])["job_number"] == 4
    assert chunks[0].start.offset == 0
    assert "truncated" in caplog.text


def test_rewritten_in_place_is_read_again(acct: Path) -> None:
    write(acct, record(1), record(2))
    follower = Follower(str(acct))
    follower.read()
    with acct.open("r+") as fh:  # same inode, longer, other first line
        fh.write("".join(record(n, name="rewritten") + "\n" for n in (7, 8, 9)))
    chunks = follower.read()
    assert job_numbers(chunks) == [7, 8, 9]
    assert numbers(chunks) == [1, 2, 3]


def test_chunks_are_bounded_and_behind_says_there_is_more(acct: Path) -> None:
    lines = [record(n) for n in range(1, 21)]
    lines[9] = record(10, name="x" * 5000)  # one line longer than a chunk is read whole
    write(acct, *lines)
    follower = Follower(str(acct), max_chunk_bytes=2000)
    first = follower.read()
    assert follower.behind and len(first) == 1
    chunks = first + read_all(follower)
    assert numbers(chunks) == list(range(1, 21))
    assert texts(chunks) == lines
    assert all(a.end == b.start for a, b in itertools.pairwise(chunks))
    assert not follower.behind


def test_from_end_skips_history_but_keeps_line_numbers(acct: Path) -> None:
    write(acct, record(1), record(2), record(3))
    follower = Follower(str(acct), from_end=True)
    assert follower.read() == []
    append(acct, record(4) + "\n")
    assert numbers(follower.read()) == [4]


def test_missing_file_is_waited_for(acct: Path) -> None:
    follower = Follower(str(acct))
    assert follower.read() == []
    write(acct, record(1))
    assert numbers(follower.read()) == [1]


# --- restarts -----------------------------------------------------------------------------------------------


def saved_state(acct: Path, upto_line: int | None = None) -> FollowState:
    """Jobs 1 and 2 written and read, and the state a follower saves after them (or after `upto_line`)."""
    write(acct, record(1), record(2))
    follower = Follower(str(acct))
    chunks = follower.read()
    follower.close()
    if upto_line is None:
        return FollowState(path=str(acct), position=chunks[-1].end)
    line = next(line for c in chunks for line in c.lines if line.number == upto_line)
    end = chunks[0].end
    return FollowState(
        path=str(acct), position=Position(inode=end.inode, offset=line.end, line=upto_line, head=end.head)
    )


def test_restart_resumes_at_the_saved_offset(acct: Path, tmp_path: Path) -> None:
    state_file = tmp_path / "ocs.state"
    save_state(state_file, saved_state(acct))
    append(acct, record(3) + "\n")
    again = Follower(str(acct), load_state(state_file))
    chunks = read_all(again)
    assert numbers(chunks) == [3] and job_numbers(chunks) == [3]


def test_restart_after_rotation_finishes_the_rotated_file(acct: Path) -> None:
    state = saved_state(acct, upto_line=1)  # line 2 was never acknowledged
    acct.rename(acct.with_name("accounting.jsonl.1"))  # rotated while hpcbus was down
    write(acct, record(3))
    chunks = read_all(Follower(str(acct), state))
    assert job_numbers(chunks) == [2, 3]
    assert chunks[0].place.endswith("accounting.jsonl.1") and numbers(chunks) == [2, 1]


def test_restart_when_the_old_file_is_gone(acct: Path, caplog: pytest.LogCaptureFixture) -> None:
    state = saved_state(acct, upto_line=1)
    acct.unlink()
    write(acct, record(3))
    with caplog.at_level(logging.WARNING, "hpcbus.ocs"):
        chunks = read_all(Follower(str(acct), state))
    assert job_numbers(chunks) == [3]
    assert "from the start" in caplog.text  # "is gone", or "file replaced" when the inode was reused


def test_restart_while_the_file_is_missing_keeps_the_saved_position(acct: Path, tmp_path: Path) -> None:
    state = saved_state(acct)
    elsewhere = tmp_path / "unmounted"
    elsewhere.mkdir()
    acct.rename(elsewhere / acct.name)  # e.g. the NFS export is not mounted yet
    again = Follower(str(acct), state)
    assert again.read() == [] and again.position == state.position
    (elsewhere / acct.name).rename(acct)  # back, same inode
    append(acct, record(3) + "\n")
    assert job_numbers(read_all(again)) == [3]


def test_restart_when_the_file_was_copied_back(acct: Path) -> None:
    state = saved_state(acct)
    content = acct.read_bytes()
    acct.unlink()
    acct.write_bytes(content + (record(3) + "\n").encode())  # new inode, same first line: same file
    assert job_numbers(read_all(Follower(str(acct), state))) == [3]


def test_restart_when_replaced_or_truncated_reads_from_the_start(acct: Path) -> None:
    state = saved_state(acct)
    with acct.open("r+") as fh:  # same inode, other content, longer than the saved offset
        fh.write("".join(record(n) + "\n" for n in (5, 6, 7)))
    assert numbers(read_all(Follower(str(acct), state))) == [1, 2, 3]
    with acct.open("r+") as fh:
        fh.truncate(10)
        fh.seek(0)
        fh.write(record(9)[:9] + "\n")
    chunks = read_all(Follower(str(acct), state))
    assert numbers(chunks) == [1]


def test_state_of_another_file_is_ignored(acct: Path, tmp_path: Path) -> None:
    write(acct, record(1))
    state = FollowState(path=str(tmp_path / "other"), position=Position(inode=1, offset=5, line=1))
    assert numbers(read_all(Follower(str(acct), state))) == [1]


def test_remembered_cuts_recut_the_same_chunks(acct: Path) -> None:
    write(acct, *(record(n) for n in range(1, 6)))
    follower = Follower(str(acct))
    (whole,) = follower.read()
    inode, ends = whole.inode, [line.end for line in whole.lines]
    state = FollowState(
        path=str(acct), position=Position(inode=inode), cuts=[(inode, ends[1]), (inode, ends[4])]
    )
    again = Follower(str(acct), state)
    first = again.read()
    assert numbers(first) == [1, 2] and again.behind
    second = again.read()
    assert numbers(second) == [3, 4, 5]
    assert again.read() == []
    # A cut that no longer fits the file (it was truncated meanwhile) is dropped, not obeyed.
    state = FollowState(path=str(acct), position=Position(inode=inode), cuts=[(inode, ends[1] + 3)])
    assert numbers(read_all(Follower(str(acct), state))) == [1, 2, 3, 4, 5]


def test_state_file_round_trip_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "ocs.state"
    assert load_state(path) is None
    state = FollowState(path="/x", position=Position(inode=7, offset=99, line=3, head="ab"), cuts=[(7, 120)])
    save_state(path, state)
    assert load_state(path) == state
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ocs.state"]  # no temp file left behind
    path.write_text("{not json")
    with pytest.raises(StateError, match="delete it"):
        load_state(path)


# --- mapping ------------------------------------------------------------------------------------------------


def process(acct: Path, *lines: str, pipeline: Pipeline | None = None) -> Batch:
    """Append `lines` to the file and run what is new through a pipeline (one chunk, one poll)."""
    follower = Follower(str(acct), from_end=True)
    append(acct, "".join(line + "\n" for line in lines))
    (chunk,) = read_all(follower)
    follower.close()
    pipeline = pipeline or Pipeline("fox", hostname="master", start_jobs=False)
    return pipeline.process(chunk, now=1_700_010_000)


def by_subject(batch: Batch) -> dict[str, list[Line]]:
    out: dict[str, list[Line]] = {}
    for message in batch.messages:
        parsed = parse_payload(message.payload, now=0, place=message.subject)
        assert not parsed.problems
        out.setdefault(message.subject, []).extend(parsed.lines)
    return out


def envelope_of(batch: Batch) -> JobsEnvelope:
    (line,) = by_subject(batch)["fox.events.slurm"]
    assert (line.measurement, line.tags) == ("slurm", {"cluster": "fox", "function": "sonar"})
    env = decode_envelope(str(line.payload))  # valid Sonar: types, timestamps, node ranges
    assert isinstance(env, JobsEnvelope) and env.data is not None
    assert (env.meta.producer, env.data.type, env.data.attributes.cluster) == ("hpcbus", "job", "fox")
    return env


def jobs_of(batch: Batch) -> dict[int, SlurmJob]:
    env = envelope_of(batch)
    assert env.data is not None
    return {job.job_id * 1000 + job.array_task_id: job for job in env.data.attributes.slurm_jobs}


def stops_of(batch: Batch) -> list[dict[str, Any]]:
    out = []
    for line in by_subject(batch).get("fox.events.job", []):
        assert line.tags == {"cluster": "fox", "function": "stop_job", "origin": "sonar"}
        msgspec.json.decode(str(line.payload), type=StopJob)  # cc-backend's field set, nothing unknown
        out.append(json.loads(str(line.payload)))
    return out


def test_job_fields(acct: Path) -> None:
    line = record(
        41,
        host="c7",
        slots=4,
        cpu=7000.4,
        maxvmem=4 * 2**30 + 1,
        maxrss=2**30,
        category="-l h_rt=7200,h_vmem=4G",
        qname="long.q",
        account="proj",
    )
    batch = process(acct, line)
    job = jobs_of(batch)[41000]
    assert job.job_name == "job41" and job.job_state == "COMPLETED"
    assert (job.user_name, job.account, job.partition) == ("alice", "proj", "long.q")
    assert job.nodes == ["c7"] and job.requested_cpus == 4
    assert (job.submit_time, job.start_time, job.end_time) == (
        "2023-11-14T22:13:20+00:00",
        "2023-11-14T22:15:00+00:00",
        "2023-11-14T23:15:00+00:00",
    )
    assert job.time_limit == 7202  # seconds + 2, as real Sonar sends it
    assert job.allocated_resources == "cpu=4,node=1"
    assert (job.array_job_id, job.array_task_id, job.exit_code) == (0, 0, 0)
    assert job.sacct is not None
    assert (job.sacct.elapsed_raw, job.sacct.user_cpu, job.sacct.system_cpu, job.sacct.ave_cpu) == (
        3600,
        6300,
        700,
        7000,
    )
    assert (job.sacct.max_rss, job.sacct.max_vm_size) == (2**20, 4 * 2**20 + 1)  # KiB, rounded up
    assert (job.sacct.req_cpus, job.sacct.alloc_tres) == (4, "cpu=4,node=1")
    assert stops_of(batch) == [
        {
            "jobId": 41,
            "cluster": "fox",
            "startTime": 1_700_000_100,
            "stopTime": 1_700_003_700,
            "jobState": "completed",
        }
    ]
    assert batch.problems == [] and (batch.records, batch.jobs, batch.events) == (1, 1, 1)


def test_stop_job_has_the_cc_backend_example_keys(acct: Path) -> None:
    example = json.loads(CC_STOP_EXAMPLE.read_text())
    (stop,) = stops_of(process(acct, record(1)))
    assert set(stop) == set(example)
    assert all(type(stop[k]) is type(example[k]) for k in example)


def test_states_and_which_jobs_get_a_stop_job(acct: Path) -> None:
    batch = process(
        acct,
        record(1, exit_status=1),  # FAILED
        record(2, failed=37, exit_status=137),  # qmaster enforced h_rt: TIMEOUT
        record(3, deleted_by="bob@login", failed=100, exit_status=137),  # CANCELLED
        record(4, failed=25),  # REQUEUED: runs again, no stop_job
        record(5, failed=1, start=0, end=1_700_000_050),  # never started: cc-backend never heard of it
        record(6, failed=22),  # NODE_FAIL
        record(7, exit_status=2**32 - 1),  # intermediate record: still running
        record(8, end=1_700_000_000),  # ends before it starts (clock skew): stopTime clamped
    )
    jobs = jobs_of(batch)
    assert {k // 1000: j.job_state for k, j in jobs.items()} == {
        1: "FAILED",
        2: "TIMEOUT",
        3: "CANCELLED",
        4: "REQUEUED",
        5: "FAILED",
        6: "NODE_FAIL",
        7: "RUNNING",
        8: "COMPLETED",
    }
    assert jobs[1000].exit_code == 1 and jobs[7000].end_time == "" and jobs[7000].exit_code == 0
    assert jobs[5000].start_time == ""
    stops = {s["jobId"]: s for s in stops_of(batch)}
    assert {k: s["jobState"] for k, s in stops.items()} == {
        1: "failed",
        2: "timeout",
        3: "cancelled",
        6: "node_fail",
        8: "completed",
    }
    assert stops[8]["stopTime"] == stops[8]["startTime"]
    assert 2**32 - 1 in INTERMEDIATE_EXIT


def test_array_tasks(acct: Path) -> None:
    batch = process(
        acct,
        record(9, task=3, submit_cmd_line="qsub -t 1-4 run.sh"),
        record(9, task=1, submit_cmd_line="qsub -t 1-4 run.sh"),
        record(
            10, task=1, submit_cmd_line="qsub -b y -terse echo 'job 1'"
        ),  # OCS 9.0 writes 1 for non-arrays
    )
    jobs = jobs_of(batch)
    assert set(jobs) == {9003, 9001, 10000}
    assert (jobs[9003].job_id, jobs[9003].array_job_id, jobs[9003].array_task_id) == (9, 9, 3)
    assert (jobs[9001].array_job_id, jobs[9001].array_task_id) == (9, 1)
    assert (jobs[10000].array_job_id, jobs[10000].array_task_id) == (0, 0)
    assert [s["jobId"] for s in stops_of(batch)] == [9, 9, 10]


def test_pe_tasks_merge_across_polls(acct: Path) -> None:
    pipeline = Pipeline("fox", hostname="master", start_jobs=False)

    def pe_task(host: str, **kw: Any) -> str:
        """Job 7's parallel-environment task on `host` (a line of its own in the accounting file)."""
        return record(7, host=host, pe_taskid=f"1.{host}", granted_pe="mpi", **kw)

    first = process(
        acct,
        pe_task("c2", cpu=300.0, start=1_700_000_110, end=1_700_003_000),
        pe_task("c3", cpu=200.0, start=1_700_000_120, end=1_700_003_100),
        pipeline=pipeline,
    )
    job = jobs_of(first)[7000]
    assert (job.job_state, job.end_time, job.nodes) == ("RUNNING", "", ["c[2-3]"])
    assert stops_of(first) == []  # a PE task ending is not the job ending
    second = process(
        acct,
        record(7, host="c1", granted_pe="mpi", slots=8, cpu=5.0, maxvmem=2**31),
        pipeline=pipeline,
    )
    job = jobs_of(second)[7000]
    assert (job.job_state, job.nodes, job.requested_cpus) == ("COMPLETED", ["c[1-3]"], 8)
    assert job.sacct is not None and job.sacct.ave_cpu == 505  # the whole job's CPU, all parts summed
    assert job.sacct.max_vm_size == 4 * 2**20  # the largest part
    assert stops_of(second) == [
        {
            "jobId": 7,
            "cluster": "fox",
            "startTime": 1_700_000_100,
            "stopTime": 1_700_003_700,
            "jobState": "completed",
        }
    ]
    third = process(acct, pe_task("c4"), pipeline=pipeline)
    assert jobs_of(third)[7000].nodes == ["c[1-4]"]  # a late PE task updates the record ...
    assert stops_of(third) == []  # ... but the job was already stopped


def test_merger_memory_is_bounded() -> None:
    merger = JobMerger(max_jobs=3, max_parts=4)
    running = [parse_line(record(n, exit_status=2**32 - 1)) for n in range(1, 11)]
    merger.add(running)
    assert len(merger) == 3
    tasks = [parse_line(record(99, pe_taskid=f"1.c{i}", host=f"c{i}", granted_pe="mpi")) for i in range(10)]
    (update,) = merger.add(tasks)
    (update,) = merger.add([parse_line(record(99, host="c0", granted_pe="mpi"))])
    assert update.ended and len(update.record.hosts) == 10
    assert update.record.cpu == pytest.approx(1100.0)  # folded parts still count


def test_bad_line_between_good_ones(acct: Path) -> None:
    batch = process(acct, record(1), '{"job_number": 2, "owner": ', "", "# comment", record(3))
    assert (batch.records, batch.jobs) == (2, 2)
    assert sorted(jobs_of(batch)) == [1000, 3000]
    assert [s["jobId"] for s in stops_of(batch)] == [1, 3]
    (problem,) = batch.problems
    assert (problem.place, problem.line, problem.kind, problem.path) == (
        str(acct),
        2,
        "ocs accounting",
        "line",
    )
    assert str(problem).startswith(f"{acct}:2: ocs accounting: line: not valid JSON")
    (log_line,) = by_subject(batch)["fox.log.hpcbus"]
    assert log_line.measurement == "hpcbus" and log_line.kind == "log"
    assert log_line.tags["loglevel"] == "error" and log_line.tags["hostname"] == "master"
    assert log_line.payload == str(problem)


def test_colon_format_and_crlf(tmp_path: Path) -> None:
    acct = tmp_path / "accounting"
    lines = COLON_FILE.read_text().splitlines()
    acct.write_bytes(b"".join(line.encode() + b"\r\n" for line in lines))
    follower = Follower(str(acct))
    batches = [Pipeline("fox", hostname="m", start_jobs=False).process(c, now=1) for c in read_all(follower)]
    assert sum(b.records for b in batches) == 5 and not any(b.problems for b in batches)


def test_message_ids_are_deterministic(acct: Path) -> None:
    write(acct, record(1), "{broken", record(2))
    (chunk,) = Follower(str(acct)).read()
    a = Pipeline("fox", hostname="m", start_jobs=False).process(chunk, now=1)
    b = Pipeline("fox", hostname="other", start_jobs=False).process(chunk, now=2)  # another run, later
    assert [m.msg_id for m in a.messages] == [m.msg_id for m in b.messages]
    assert [m.subject for m in a.messages] == ["fox.events.slurm", "fox.events.job", "fox.log.hpcbus"]
    prefix = f"ocs:fox:{chunk.inode}:0-{chunk.end.offset}:{chunk.digest}"
    assert [m.msg_id for m in a.messages] == [f"{prefix}:{kind}:0" for kind in ("slurm", "job", "log")]
    # The file truncated and written again up to the same offset: other bytes, other ids.
    size = acct.stat().st_size
    with acct.open("r+") as fh:
        fh.write(record(1, name="again")[: size - 1].ljust(size - 1, " ") + "\n")
    (other,) = Follower(str(acct)).read()
    assert (other.start.offset, other.end.offset) == (chunk.start.offset, chunk.end.offset)
    c = Pipeline("fox", hostname="m", start_jobs=False).process(other, now=1)
    assert not {m.msg_id for m in c.messages} & {m.msg_id for m in a.messages}


def test_large_chunks_are_split_and_reassemble(acct: Path) -> None:
    write(acct, *(record(n, name=f"job-with-a-long-name-{n:05d}") for n in range(1, 3001)))
    (chunk,) = Follower(str(acct), max_chunk_bytes=64 << 20).read()
    batch = Pipeline("fox", hostname="m", start_jobs=False).process(chunk, now=1_700_010_000)
    assert all(len(m.payload) <= MAX_PAYLOAD for m in batch.messages)
    slurm = [m for m in batch.messages if m.subject == "fox.events.slurm"]
    assert len(slurm) >= 2 and len({m.msg_id for m in batch.messages}) == len(batch.messages)
    assembler = JobsAssembler()
    lines = [ln for m in batch.messages for ln in parse_payload(m.payload, now=0).lines]
    done = assembler.add_lines(lines, cluster="fox", now=0)
    assert len(done) == 1 and done[0].complete
    env = done[0].envelope
    assert isinstance(env, JobsEnvelope) and env.data is not None
    assert [j.job_id for j in env.data.attributes.slurm_jobs] == list(range(1, 3001))
    assert assembler.flush_all() == []  # the stop_job events (origin=sonar) are not assembled a second time


def test_start_jobs_option(acct: Path) -> None:
    pipeline = Pipeline("fox", hostname="m", start_jobs=True)
    batch = process(
        acct,
        record(5, host="c1", pe_taskid="1.c1", granted_pe="mpi"),
        record(5, host="c2", granted_pe="mpi", slots=8, category="-l h_rt=3600"),
        pipeline=pipeline,
    )
    start, stop = by_subject(batch)["fox.events.job"]
    assert (start.tags["function"], stop.tags["function"]) == ("start_job", "stop_job")
    job = msgspec.json.decode(str(start.payload), type=StartJob)
    assert (job.job_id, job.user, job.cluster, job.num_nodes, job.num_hwthreads, job.walltime) == (
        5,
        "alice",
        "fox",
        2,
        8,
        3600,
    )
    assert [r.hostname for r in job.resources] == ["c1", "c2"]
    assert (job.start_time, job.submit_time, job.meta_data) == (
        1_700_000_100,
        1_700_000_000,
        {"jobName": "job5"},
    )


# --- --once through the CLI ---------------------------------------------------------------------------------


@pytest.fixture
def hpcbus(monkeypatch: pytest.MonkeyPatch) -> Any:
    """`hpcbus.cli.main` with `produce ocs` registered (the entry in cli.COMMANDS belongs to the lead)."""
    monkeypatch.setitem(cli.COMMANDS, ("produce", "ocs"), "hpcbus.producers.ocs.command")
    for var in ("HPCBUS_CLUSTER", "NATS_URL"):
        monkeypatch.delenv(var, raising=False)
    return cli.main


def once_output(out: str) -> list[tuple[str, Line]]:
    rows = []
    for row in out.splitlines():
        subject, sep, text = row.partition("\t")
        assert sep and subject and "\t" not in text
        parsed = parse_payload(text, now=0)
        assert not parsed.problems
        rows.append((subject, parsed.lines[0]))
    return rows


def once(hpcbus: Any, *args: str) -> int:
    """`hpcbus produce ocs --once --no-start-jobs ARGS` through `cli.main`: its exit status."""
    return int(hpcbus(["produce", "ocs", "--once", "--no-start-jobs", *args]))


def payloads(rows: list[tuple[str, Line]], subject: str) -> list[Any]:
    """The JSON payloads of the `--once` rows on `subject`, in order."""
    return [json.loads(str(line.payload)) for s, line in rows if s == subject]


def test_once_corpus_jsonl(hpcbus: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert once(hpcbus, "--accounting", str(JSONL_FILE), "--cluster", "fox") == 0
    rows = once_output(capsys.readouterr().out)
    assert [s for s, _ in rows] == ["fox.events.slurm", "fox.events.job"]
    stop = json.loads(str(rows[1][1].payload))
    assert stop == {
        "jobId": 10,
        "cluster": "fox",
        "startTime": 1730532913,
        "stopTime": 1730532913,
        "jobState": "completed",
    }
    env = decode_envelope(str(rows[0][1].payload))
    assert isinstance(env, JobsEnvelope) and env.data is not None
    (job,) = env.data.attributes.slurm_jobs
    assert (job.job_id, job.job_name, job.user_name, job.partition, job.nodes) == (
        10,
        "echo",
        "root",
        "all.q",
        ["master"],
    )
    assert job.array_job_id == 0  # `qsub -b y echo` is no array job, whatever task_number 9.0 wrote


def test_once_corpus_colon(hpcbus: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert once(hpcbus, "--accounting", str(COLON_FILE), "--cluster", "fox.educloud.no") == 0
    rows = once_output(capsys.readouterr().out)
    stops = payloads(rows, "fox.educloud.no.events.job")
    assert [(s["jobId"], s["jobState"]) for s in stops] == [
        (43, "completed"),
        (6972834, "timeout"),
        (1630912, "failed"),
        (3294013, "completed"),
        (3872561, "completed"),
    ]
    (envelope,) = [line for s, line in rows if s == "fox.educloud.no.events.slurm"]
    env = decode_envelope(str(envelope.payload))
    assert isinstance(env, JobsEnvelope) and env.data is not None
    assert len(env.data.attributes.slurm_jobs) == 5


def test_once_bad_lines_exit_1(hpcbus: Any, acct: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(acct, record(1), "{oops", record(2))
    assert once(hpcbus, "--accounting", str(acct), "--cluster", "fox") == 1
    captured = capsys.readouterr()
    assert f"{acct}:2: ocs accounting: line: not valid JSON" in captured.err
    rows = once_output(captured.out)
    assert [s for s, _ in rows] == ["fox.events.slurm", "fox.events.job", "fox.events.job", "fox.log.hpcbus"]
    assert rows[-1][1].tags["loglevel"] == "error"


def test_once_starts_at_the_saved_state_and_never_writes_it(
    hpcbus: Any, acct: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(acct, record(1), record(2))
    state_file = tmp_path / "ocs.state"
    argv = ["--accounting", str(acct), "--cluster", "fox", "--state-file", str(state_file)]
    assert once(hpcbus, *argv) == 0
    assert not state_file.exists()
    assert len([r for r in once_output(capsys.readouterr().out) if r[0] == "fox.events.job"]) == 2
    save_state(state_file, saved_state(acct, upto_line=1))
    before = state_file.read_bytes()
    assert once(hpcbus, *argv) == 0
    stops = payloads(once_output(capsys.readouterr().out), "fox.events.job")
    assert [s["jobId"] for s in stops] == [2]
    assert state_file.read_bytes() == before


def test_once_settings_from_config_and_errors(
    hpcbus: Any, acct: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(acct, record(1))
    config = tmp_path / "hpcbus.toml"
    config.write_text(f'[bus]\ncluster = "fox"\n[ocs]\naccounting = "{acct}"\ninterval = 1.5\n')
    assert once(hpcbus, "--config", str(config)) == 0
    assert "fox.events.job\t" in capsys.readouterr().out
    assert once(hpcbus, "--accounting", str(acct)) == 2  # no cluster
    assert "--cluster" in capsys.readouterr().err
    assert once(hpcbus, "--accounting", str(acct), "--cluster", "fox_1") == 2
    assert "Clustername" in capsys.readouterr().err  # Sonar's Clustername: the envelope would be rejected
    from hpcbus import cli  # and a unit's command line checked before it starts says the same

    assert (
        cli.main(["--check-config", "produce", "ocs", "--accounting", str(acct), "--cluster", "fox_1"]) == 2
    )
    assert "Clustername" in capsys.readouterr().err
    missing = str(tmp_path / "nope")
    assert once(hpcbus, "--accounting", missing, "--cluster", "fox") == 2
    config.write_text("[ocs]\nacounting = 'typo'\n")
    assert once(hpcbus, "--config", str(config), "--cluster", "fox") == 2
    assert "acounting" in capsys.readouterr().err


def test_once_names_every_node_in_the_hostname_form(
    hpcbus: Any, acct: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`hostname_form = "domain"` (docs/mapping.md section 3): the job record's `nodes`, the start_job's
    `resources` on `<cluster>.events.job` and on cc-backend's subject, and the log lines' `hostname` name the
    nodes as the node agents of the same site do."""
    write(
        acct,
        record(5, host="c1.fox", pe_taskid="1.c1", granted_pe="mpi"),
        record(5, host="c2", granted_pe="mpi"),
    )
    argv = [
        "produce",
        "ocs",
        "--once",
        "--accounting",
        str(acct),
        "--cluster",
        "fox",
        "--cc-job-subject",
        "cc.job",
    ]
    assert hpcbus([*argv, "--hostname-form", "domain", "--hostname-domain", "site.org"]) == 0
    rows = once_output(capsys.readouterr().out)
    (envelope,) = [line for s, line in rows if s == "fox.events.slurm"]
    env = decode_envelope(str(envelope.payload))
    assert isinstance(env, JobsEnvelope) and env.data is not None
    assert [j.nodes for j in env.data.attributes.slurm_jobs] == [["c[1-2].site.org"]]
    starts = [
        json.loads(str(line.payload))
        for s, line in rows
        if s in ("fox.events.job", "cc.job") and line.tags["function"] == "start_job"
    ]
    assert len(starts) == 2
    assert all(
        [r["hostname"] for r in start["resources"]] == ["c1.site.org", "c2.site.org"] for start in starts
    )
    write(acct, "{oops")  # a bad line: its log line names this host in the form too
    assert hpcbus([*argv, "--hostname-form", "domain", "--hostname-domain", "site.org"]) == 1
    (log,) = [line for s, line in once_output(capsys.readouterr().out) if s == "fox.log.hpcbus"]
    assert log.tags["hostname"] == socket.gethostname().split(".")[0] + ".site.org"
