"""`hpcbus produce ocs` as a service against a real nats-server: records arrive on their subjects, exactly once
across clean restarts, crash re-reads, rotation and a broker outage; SIGTERM exits 0 with the state saved.

The service runs as a subprocess (so SIGTERM is real).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hpcbus.producers.ocs.follow import FollowState, Position, load_state, save_state
from hpcbus.schemas.lineprotocol import parse_payload
from hpcbus.schemas.sonar.types import JobsEnvelope
from hpcbus.schemas.sonar.validate import decode_envelope
from tests.consumer_helpers import ProducerProcess, wait_for
from tests.services import NatsServer
from tests.test_ocs_producer import append, record, write

pytestmark = pytest.mark.services

TIMEOUT = 30.0


class OcsService(ProducerProcess):
    """`hpcbus produce ocs` following `accounting.jsonl` with its state in `ocs.state`, polling every 0.1 s."""

    def __init__(self, tmp_path: Path, url: str, cluster: str) -> None:
        self.accounting = tmp_path / "accounting.jsonl"
        self.state = tmp_path / "ocs.state"
        args = ["produce", "ocs", "--accounting", str(self.accounting), "--state-file", str(self.state)]
        args += ["--interval", "0.1", "--stream-max-bytes", str(64 << 20)]
        super().__init__(tmp_path, url, cluster, args)

    def wait_for(self, what: str, check: Callable[[Bus], bool]) -> Bus:
        return Bus(self.cluster, self.wait(what, lambda msgs: check(Bus(self.cluster, msgs)), TIMEOUT))

    def read_to_the_end(self) -> None:
        """Wait until the service has read the accounting file to its current end and found an incomplete
        last line there (it says so once per place in its log)."""
        size = self.accounting.stat().st_size
        wait_for(
            lambda: (
                "incomplete last line" in self.log() and f"({size - self._complete()} bytes" in self.log()
            ),
            TIMEOUT,
            self.log,
        )

    def _complete(self) -> int:
        data = self.accounting.read_bytes()
        return data.rfind(b"\n") + 1


class Bus:
    """The stream's content, decoded by subject."""

    def __init__(self, cluster: str, messages: list[tuple[str, bytes, str]]) -> None:
        self.messages = messages
        self.stops: list[dict[str, Any]] = []
        self.starts: list[dict[str, Any]] = []
        self.jobs: list[int] = []
        self.logs: list[str] = []
        for subject, payload, _ in messages:
            parsed = parse_payload(payload, now=0, place=subject)
            assert not parsed.problems, parsed.problems
            for line in parsed.lines:
                if subject == f"{cluster}.events.job":
                    if line.tags["function"] == "start_job":  # `start_jobs` is on by default
                        assert not any(
                            s["jobId"] == json.loads(str(line.payload))["jobId"] for s in self.stops
                        )
                        self.starts.append(json.loads(str(line.payload)))
                        continue
                    assert line.tags["function"] == "stop_job"
                    self.stops.append(json.loads(str(line.payload)))
                elif subject == f"{cluster}.events.slurm":
                    env = decode_envelope(str(line.payload))
                    assert isinstance(env, JobsEnvelope) and env.data is not None
                    self.jobs.extend(j.job_id for j in env.data.attributes.slurm_jobs)
                elif subject == f"{cluster}.log.hpcbus":
                    self.logs.append(str(line.payload))
                else:
                    pytest.fail(f"unexpected subject {subject}")

    def stop_ids(self) -> list[int]:
        return sorted(s["jobId"] for s in self.stops)


def exactly_once(bus: Bus, jobs: list[int]) -> None:
    assert bus.stop_ids() == jobs
    assert sorted(s["jobId"] for s in bus.starts) == jobs  # each stop preceded by its start, once
    assert sorted(bus.jobs) == jobs  # each job in exactly one envelope record
    ids = [msg_id for _, _, msg_id in bus.messages]
    assert all(ids) and len(set(ids)) == len(ids)


@pytest.fixture
def service(tmp_path: Path, nats_server: NatsServer, request: pytest.FixtureRequest) -> Iterator[OcsService]:
    cluster = f"ocs{abs(hash(request.node.name)) % 10**8}"  # a stream of its own
    svc = OcsService(tmp_path, nats_server.url, cluster)
    yield svc
    svc.kill()


def test_publishes_and_resumes_exactly_once(service: OcsService) -> None:
    write(service.accounting, record(1), "{broken", record(2))
    service.start()
    bus = service.wait_for("jobs 1, 2 and the problem", lambda b: b.stop_ids() == [1, 2] and len(b.logs) == 1)
    assert bus.logs[0].startswith(f"{service.accounting}:2: ocs accounting: line: not valid JSON")
    third = record(3)
    append(service.accounting, third[:40])  # a half-written line: waited for, never reported
    service.read_to_the_end()  # the service has read the half line
    append(service.accounting, third[40:] + "\n")
    service.wait_for("job 3", lambda b: b.stop_ids() == [1, 2, 3])
    assert service.stop() == 0
    state = load_state(service.state)
    assert state is not None and state.cuts == []
    assert state.position.offset == service.accounting.stat().st_size and state.position.line == 4

    append(service.accounting, record(4) + "\n")
    service.start()
    service.wait_for("job 4", lambda b: b.stop_ids() == [1, 2, 3, 4])
    assert service.stop() == 0
    bus = Bus(service.cluster, service.messages())
    exactly_once(bus, [1, 2, 3, 4])
    assert len(bus.logs) == 1  # the bad line was not re-read after the restart
    assert "stopped cleanly" in service.log()


def test_reread_after_a_crash_is_dropped_by_jetstream(service: OcsService) -> None:
    write(service.accounting, record(1), record(2), record(3))
    service.start()
    service.wait_for("jobs 1-3", lambda b: b.stop_ids() == [1, 2, 3])
    assert service.stop() == 0
    before = service.messages()
    size, inode = service.accounting.stat().st_size, service.accounting.stat().st_ino
    # As if the process had died after publishing but before the acks were recorded: the state still has
    # the chunk boundary written ahead, and the offset before it.
    save_state(
        service.state,
        FollowState(path=str(service.accounting), position=Position(inode=inode), cuts=[(inode, size)]),
    )
    service.start()
    wait_for(
        lambda: (st := load_state(service.state)) is not None and st.position.offset == size,
        TIMEOUT,
        service.log,
    )
    assert service.stop() == 0
    after = service.messages()
    assert after == before  # same chunk, same Nats-Msg-Ids: JetStream kept none of the copies
    exactly_once(Bus(service.cluster, after), [1, 2, 3])


def test_follows_rotation(service: OcsService) -> None:
    write(service.accounting, record(1))
    service.start()
    service.wait_for("job 1", lambda b: b.stop_ids() == [1])
    append(service.accounting, record(2) + "\n")
    service.accounting.rename(service.accounting.with_name("accounting.jsonl.0"))
    write(service.accounting, record(3))
    service.wait_for("jobs 2 and 3", lambda b: b.stop_ids() == [1, 2, 3])
    assert service.stop() == 0
    exactly_once(Bus(service.cluster, service.messages()), [1, 2, 3])
    state = load_state(service.state)
    assert state is not None and state.position.inode == service.accounting.stat().st_ino


def test_broker_outage_and_sigterm_while_it_is_down(
    tmp_path: Path, nats_factory: Callable[..., NatsServer]
) -> None:
    server = nats_factory()
    service = OcsService(tmp_path, server.url, "ocsoutage")
    try:
        write(service.accounting, record(1))
        service.start()
        service.wait_for("job 1", lambda b: b.stop_ids() == [1])
        server.stop()
        append(service.accounting, record(2) + "\n")
        # The service has read job 2 and written its chunk boundary ahead (before trying to publish it).
        wait_for(lambda: (st := load_state(service.state)) is not None and st.cuts, TIMEOUT, service.log)
        assert service.stop() == 0  # flushes for a few seconds, gives up, saves what was acknowledged
        state = load_state(service.state)
        assert state is not None
        assert state.position.line == 1 and state.cuts  # job 2 read, not acknowledged: read again next time
        server.start()
        service.start()
        append(service.accounting, record(3) + "\n")
        service.wait_for("jobs 2 and 3", lambda b: b.stop_ids() == [1, 2, 3])
        assert service.stop() == 0
        exactly_once(Bus(service.cluster, service.messages()), [1, 2, 3])
        assert Counter(s for s, _, _ in service.messages())[f"{service.cluster}.log.hpcbus"] == 0
    finally:
        service.kill()
