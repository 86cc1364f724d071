"""The arithmetic of `schemas.jobsummary` and the record readers of `consumers/jobs/records.py`, without
services: children's CPU counted once, lines in any order and any number of copies counting the same,
Slurm and OCS records, GPUs allocated but never used, the state's round trip."""

from __future__ import annotations

import json
import random

import msgspec
import pytest

from hpcbus.consumers.jobs.records import add_event
from hpcbus.schemas.jobsummary import (
    Limits,
    State,
    Summary,
    Thresholds,
    Timing,
    add_metric,
    add_nodejob,
    add_start,
    add_stop,
    close,
    decode_state,
    due,
    encode_state,
    influx_point,
    tres_count,
)
from hpcbus.schemas.lineprotocol import Line, parse_payload
from tests.test_consume_jobs import proc_lines

T0 = 1_763_900_000
LIMITS = Limits(window=30)


def lines(text: list[str]) -> list[Line]:
    parsed = parse_payload("\n".join(text).encode(), now=T0 + 10_000)
    assert not parsed.errors
    return parsed.lines


def feed(state: State, batch: list[Line], now: float = 1.0) -> None:
    for line in batch:
        add_metric(state, "c", line, now, LIMITS)


def summary_of(state: State, key: str = "c\t7") -> dict[str, object]:
    return json.loads(msgspec.json.encode(close(state, key, "end", 100.0, Thresholds(), LIMITS)))


def child_and_parent() -> list[str]:
    """sh (pid 10) waits for python (pid 11, ppid 10) burning 1 s per 1 s sample for 5 s; after python
    ends, sh's cpu_time includes python's 5.4 s (rounded 5) plus its own 1 s."""
    out: list[str] = []
    for i in range(8):
        t = T0 + i
        sh_cpu = 1 if i < 6 else 6  # the child's time appears in the parent once it was waited for
        out += [x for x in proc_lines("c", "n1", "7", t, 10, cpu_time=sh_cpu, rss=100) if "ppid" in x]
        if i < 6:
            child = proc_lines("c", "n1", "7", t, 11, cpu_time=i, rss=1000)
            out += [x.replace("ppid=1,", "ppid=10,") for x in child]
        else:
            out += [x for x in proc_lines("c", "n1", "7", t, 10) if x.startswith("job_processes")]
    return out


def test_a_waited_for_childs_cpu_is_counted_once_with_its_tail() -> None:
    state = State()
    feed(state, lines(child_and_parent()))
    got = summary_of(state)
    # python counted 5 s while sampled (0..5); sh's jump of 5 pays python's credit back. sh's own 1 s was
    # spent before the first sample, and with no start known the job's interval begins at that sample.
    assert got["cpu_seconds"] == 5.0 and got["elapsed"] == 7.0
    assert got["max_rss"] == 1100 * 1024 and got["samples"] == 8
    # With the start known (the node saw the processes start 1 s earlier), sh's 1 s lies inside it.
    state = State()
    feed(state, lines(child_and_parent()))
    add_nodejob(state, "c", "7", "n1", 1.0, ended=False, start=T0 - 1, stop=0, user="u", hwthreads=0,
                accelerators=[], limits=LIMITS)  # fmt: skip
    got = summary_of(state)
    assert got["cpu_seconds"] == 6.0 and got["elapsed"] == 8.0


def busy_loop(known_start: bool) -> dict[str, object]:
    """One single-threaded loop, sampled every 10 s from 6 s after it started: 95 % of a core, so 5.7 s
    (rounded 6) at the first sample and 9.5 s more at each of the next four (Sonar's whole seconds)."""
    text: list[str] = []
    for i in range(5):
        cpu = round(5.7 + 9.5 * i)
        text += proc_lines("c", "n1", "7", T0 + 10 * i, 10, cpu_time=cpu, rss=100)
    state = State()
    feed(state, lines(text))
    if known_start:
        add_nodejob(state, "c", "7", "n1", 1.0, ended=False, start=T0 - 6, stop=0, user="u", hwthreads=0,
                    accelerators=[], limits=LIMITS)  # fmt: skip
    return summary_of(state)


@pytest.mark.parametrize("known_start", [False, True])
def test_a_busy_loop_is_at_most_one_core_busy(known_start: bool) -> None:
    """CPU and elapsed time over the same interval (issue 32): counted from the first sample, the loop's
    6 s before it are not in the interval (it read 1.15 cores busy); from its known start they are."""
    got = busy_loop(known_start)
    elapsed = 46.0 if known_start else 40.0
    assert got["elapsed"] == elapsed
    busy = float(got["cpu_seconds"]) / elapsed  # type: ignore[arg-type]
    assert 0.9 <= busy <= 1.0, got
    # The nodes' figures add up to the job's.
    assert sum(n["cpu_seconds"] for n in got["per_node"]) == got["cpu_seconds"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("lead", [300, 1300])
def test_a_node_first_sampled_late_keeps_what_it_spent_inside_the_interval(lead: int) -> None:
    """No start known, two nodes each busy on one core: n1 first sampled at T0 (its loop 5 s old), n2's
    agent 300 s late, its loop `lead` s old by then. The job's interval begins at T0, so n2's 300 s between
    T0 and its first sample lie inside `elapsed` and count; what it spent before T0 does not (review of
    issue 32: n2 lost all `lead` s, 1700 CPU seconds in 2 x 1000 s)."""
    text: list[str] = []
    for i in range(101):
        t = T0 + 10 * i
        text += proc_lines("c", "n1", "7", t, 10, cpu_time=5 + 10 * i, rss=100)
        if t >= T0 + 300:
            text += proc_lines("c", "n2", "7", t, 20, cpu_time=lead + (t - T0 - 300), rss=100)
    state = State()
    feed(state, lines(text))
    got = summary_of(state)
    nodes = {n["hostname"]: n for n in got["per_node"]}  # type: ignore[attr-defined]
    assert got["elapsed"] == 1000.0
    assert nodes["n1"]["cpu_seconds"] == 1000.0 and nodes["n2"]["cpu_seconds"] == 1000.0, nodes
    assert got["cpu_seconds"] == 2000.0 == sum(n["cpu_seconds"] for n in nodes.values())


@pytest.mark.parametrize("seed", range(5))
def test_copies_and_reordering_inside_the_window_count_the_same(seed: int) -> None:
    text = child_and_parent()
    reference = State()
    feed(reference, lines(text))
    want = summary_of(reference)
    shuffled = lines(text) + lines(text[: len(text) // 2])  # a redelivered half
    rng = random.Random(seed)
    rng.shuffle(shuffled)  # within 8 s of sample time: inside the 30 s window
    state = State()
    feed(state, shuffled)
    got = summary_of(state)
    assert {k: v for k, v in got.items() if k != "late_lines"} == {
        k: v for k, v in want.items() if k != "late_lines"
    }


def test_lines_for_folded_samples_are_late_not_added() -> None:
    state = State()
    feed(state, lines(proc_lines("c", "n1", "7", T0, 5, cpu_time=3)))
    feed(state, lines(proc_lines("c", "n1", "7", T0 + 60, 5, cpu_time=4)))  # folds T0
    feed(state, lines(proc_lines("c", "n1", "7", T0, 5, cpu_time=3)))  # a copy, too late
    assert state.late_lines == 2
    # the increase after the first sample (no start known: the 3 s before it are outside the interval)
    assert summary_of(state)["cpu_seconds"] == 1.0


def test_allocated_cards_never_used_count_as_idle() -> None:
    state = State()
    add_start(state, "c", "7", 1.0, start=T0, cores=1, gpus=2, hosts=["n1"])
    feed(state, lines(proc_lines("c", "n1", "7", T0 + 5, 5, cpu_time=1, gpu_util=80, gpu_mem=512)))
    add_stop(state, "c", "7", 2.0, end=T0 + 10, job_state="completed")
    got = summary_of(state)
    assert got["gpus"] == 2 and got["gpu_util"] == 40.0 and "idle_gpu" in got["flags"]  # type: ignore[operator]
    assert got["gpu_mem_peak"] == 512 * 1024 * 1024


def test_slurm_and_ocs_records_and_what_they_leave_out() -> None:
    state = State()
    record = {
        "job_id": 7,
        "job_state": "COMPLETED",
        "user_name": "alice",
        "account": "proj",
        "partition": "normal",
        "nodes": ["n[1-2]"],
        "allocated_resources": "billing=8,cpu=8,gres/gpu:a100=2,mem=16G,node=2",
        "requested_memory_per_node": 16 * 1024 * 1024,
        "start_time": "2025-11-23T12:00:00+01:00",
        "end_time": "2025-11-23T12:10:00+01:00",
    }
    step = {"job_id": 7, "job_step": "batch", "job_state": "RUNNING", "user_name": "mallory"}
    envelope = {
        "meta": {"producer": "hpcbus", "version": "1"},
        "data": {
            "type": "job",
            "attributes": {"time": "2025-11-23T12:10:05+01:00", "cluster": "c", "slurm_jobs": [record, step]},
        },
    }
    event = Line("slurm", {"function": "sonar"}, {"event": json.dumps(envelope)}, T0)
    assert add_event(state, "c", event, 5.0, LIMITS, "c.events.slurm") == []
    job = state.jobs["c\t7"]
    assert (job.scheduler, job.user, job.cores, job.gpus, job.hosts) == ("slurm", "alice", 8, 2, ["n1", "n2"])
    assert (job.state, job.end - job.start, job.mem_requested) == ("completed", 600, 16 * 1024**3)
    assert due(state, 5.0 + 59, Timing()) == [] and due(state, 5.0 + 60, Timing()) == [("c\t7", "end")]
    got = summary_of(state)
    # without samples nothing can be judged idle or over-requested: only that there were none
    assert got["flags"] == ["no_samples"] and "cpu_eff" not in got and "mem_peak" not in got
    point = influx_point(close_again(state))
    assert point.fields["flag_no_samples"] is True and "cpu_eff" not in point.fields
    # an OCS envelope says so in meta.attrs
    envelope["meta"]["attrs"] = [{"key": "translated-from", "value": "ocs-accounting"}]  # type: ignore[index]
    record["job_id"] = 8
    event = Line("slurm", {"function": "sonar"}, {"event": json.dumps(envelope)}, T0)
    assert add_event(state, "c", event, 5.0, LIMITS, "c.events.slurm") == []
    assert state.jobs["c\t8"].scheduler == "ocs"
    # a record for a job already summarised does not open it again; a broken one is a problem naming its place
    record["job_id"] = 7
    add_event(
        state,
        "c",
        Line("slurm", {"function": "sonar"}, {"event": json.dumps(envelope)}, T0),
        6.0,
        LIMITS,
        "s",
    )
    assert "c\t7" not in state.jobs
    (problem,) = add_event(
        state, "c", Line("job", {"function": "stop_job"}, {"event": "{"}, T0), 6.0, LIMITS, "c.events.job"
    )
    assert str(problem).startswith("c.events.job: event: event: job stop_job:")


def close_again(state: State) -> Summary:
    """The summary of job 7 again, from the outbox (as the worker sends it)."""
    return state.outbox["c\t7"]


def test_tres_counts_and_state_round_trip() -> None:
    assert tres_count("cpu=4,gres/gpu=1,gres/gpu:a100=2", "gres/gpu") == 3
    assert tres_count("cpu=4", "gres/gpu") == 0 and tres_count("", "cpu") == 0
    state = State()
    feed(state, lines(child_and_parent()))
    assert decode_state(encode_state(state)) == state


def test_a_short_slurm_job_seen_ending_by_its_node_waits_for_its_records() -> None:
    """The node saw job 9 start and end between two polls of `produce slurm`: its summary waits
    `record_wait` for the records, which then give user, cores and the batch system's times."""
    state = State()
    timing = Timing(grace=60, record_wait=300)
    common = {"user": "", "hwthreads": 4, "accelerators": [], "limits": LIMITS}
    add_nodejob(state, "c", "9", "n1", 10.0, ended=False, start=T0, stop=0, **common)  # type: ignore[arg-type]
    add_nodejob(state, "c", "9", "n1", 20.0, ended=True, start=T0, stop=T0 + 5, **common)  # type: ignore[arg-type]
    assert due(state, 20.0 + 60, timing) == []  # grace alone would have closed it without its records
    add_start(state, "c", "9", 120.0, user="erin", start=T0, cores=2, job_state="running")
    add_stop(state, "c", "9", 120.0, end=T0 + 6, job_state="completed")
    assert due(state, 20.0 + 60, timing) == [("c\t9", "end")]  # records in: the normal grace again
    got = summary_of(state, "c\t9")
    assert (got["user"], got["cores"], got["state"], got["end"]) == ("erin", 2, "completed", T0 + 6)
    # without records (no batch-system producer), it is summarised after record_wait from its nodes' view
    add_nodejob(state, "c", "10", "n1", 10.0, ended=True, start=T0, stop=T0 + 5, **common)  # type: ignore[arg-type]
    assert due(state, 10.0 + 299, timing) == [] and due(state, 10.0 + 300, timing) == [("c\t10", "end")]


def test_a_nodejob_naming_another_host_in_its_json_is_refused() -> None:
    """Issue 29 item 2: the worker takes a `nodejob`'s host from its JSON; one whose JSON names another host
    than its tag is refused with the reason (the runner dead-letters it) and opens no job on either host."""
    from hpcbus.schemas.nodejob import NodeJob, node_job_line

    state = State()
    forged = node_job_line(
        NodeJob(job_id=7770001, cluster="c", hostname="n002", start_time=100), "start", 100
    )
    forged.tags["hostname"] = "n001"
    (problem,) = add_event(state, "c", forged, 5.0, LIMITS, "c.events.nodejob")
    assert "event.hostname names hostname 'n002', but the line says 'n001'" in problem.reason
    assert state.jobs == {}
    own = node_job_line(NodeJob(job_id=7770002, cluster="c", hostname="n001", start_time=100), "start", 100)
    assert add_event(state, "c", own, 5.0, LIMITS, "c.events.nodejob") == []
    assert len(state.jobs) == 1


def test_the_jetstream_state_entries_round_trip_and_a_torn_save_loads_consistent() -> None:
    """`[jobs] state = "jetstream"`: the state as entries decodes to the same state; a save that stopped
    after writing a closed job's summary but before removing the job loads with the job closed (its
    summary waits in the outbox, it is not summarised twice); a node without its job is dropped; another
    durable's entries are refused."""
    from hpcbus.consumers.jobs.kvstate import decode_entries, entries
    from hpcbus.settings import SettingsError

    state = State(cluster="c", durable="d")
    feed(state, lines(child_and_parent()))
    feed(
        state,
        lines(
            [x.replace("job=7", "job=8").replace("stype-id=7/", "stype-id=8/") for x in child_and_parent()]
        ),
    )
    assert set(state.jobs) == {"c\t7", "c\t8"}
    open_ = entries(state)
    assert msgspec.msgpack.encode(decode_entries(open_, "c", "d")) == msgspec.msgpack.encode(state)
    assert sum(k.startswith("node.") for k in open_) == 2 and sum(k.startswith("job.") for k in open_) == 2

    close(state, "c\t7", "end", 100.0, Thresholds(), LIMITS)
    closed = entries(state)
    torn = {**open_, **{k: v for k, v in closed.items() if k.startswith(("closed.", "outbox."))}}
    loaded = decode_entries(torn, "c", "d")
    assert set(loaded.jobs) == {"c\t8"} and set(loaded.outbox) == {"c\t7"} and "c\t7" in loaded.closed

    orphan = {k: v for k, v in open_.items() if not k.startswith("job.")}
    assert decode_entries(orphan, "c", "d").jobs == {}
    with pytest.raises(SettingsError, match="durable 'd', not 'e'"):
        decode_entries(open_, "c", "e")
