"""`hpcbus produce ocs` as a service against a real nats-server: records arrive on their subjects, exactly once
across clean restarts, crash re-reads, rotation and a broker outage; SIGTERM exits 0 with the state saved.

The service runs as a subprocess (so SIGTERM is real). `produce ocs` is registered in `hpcbus.cli.COMMANDS`
by the launcher line below until the lead adds it to hpcbus/cli.py.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.errors import NotFoundError

from hpcbus.bus import stream_name
from hpcbus.localservices import NatsServer
from producers.ocs.follow import FollowState, Position, load_state, save_state
from schemas.lineprotocol import parse_payload
from schemas.sonar.types import JobsEnvelope
from schemas.sonar.validate import decode_envelope
from tests.test_ocs_producer import append, record, write

pytestmark = pytest.mark.services

REPO = Path(__file__).resolve().parents[1]
LAUNCH = (
    "import sys; from hpcbus import cli; "
    "cli.COMMANDS[('produce', 'ocs')] = 'producers.ocs.command'; "
    "sys.exit(cli.main(sys.argv[1:]))"
)
TIMEOUT = 30.0


class Service:
    """One `hpcbus produce ocs` process per `start()`; its stderr goes to a log file shown on failure."""

    def __init__(self, tmp_path: Path, url: str, cluster: str) -> None:
        self.tmp_path = tmp_path
        self.url = url
        self.cluster = cluster
        self.accounting = tmp_path / "accounting.jsonl"
        self.state = tmp_path / "ocs.state"
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    @property
    def log_path(self) -> Path:
        return self.tmp_path / f"service-{self.runs}.log"

    def start(self, *extra: str) -> None:
        self.runs += 1
        argv = [
            sys.executable, "-c", LAUNCH, "produce", "ocs", "--accounting", str(self.accounting),
            "--state", str(self.state), "--interval", "0.1", "--nats", self.url, "--cluster", self.cluster,
            "--stream-max-bytes", str(64 << 20), *extra,
        ]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=log)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM and the exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        self.proc = None
        return rc

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def messages(self) -> list[tuple[str, bytes, str]]:
        """(subject, payload, Nats-Msg-Id) of everything in the cluster's telemetry stream."""
        return asyncio.run(_stream_messages(self.url, stream_name("HPCBUS", self.cluster)))

    def wait_for(self, what: str, check: Callable[[Bus], bool]) -> Bus:
        deadline = time.monotonic() + TIMEOUT
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                pytest.fail(f"the service exited ({self.proc.returncode}) before {what}:\n{self.log()}")
            bus = Bus(self.cluster, self.messages())
            if check(bus):
                return bus
            if time.monotonic() > deadline:
                pytest.fail(f"timed out waiting for {what}; stop_job ids {bus.stop_ids()}\n{self.log()}")
            time.sleep(0.1)


async def _stream_messages(url: str, stream: str) -> list[tuple[str, bytes, str]]:
    nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False)
    try:
        js = nc.jetstream()
        try:
            info = await js.stream_info(stream)
        except NotFoundError:
            return []
        out = []
        state = info.state
        if state.messages:
            for seq in range(state.first_seq, state.last_seq + 1):
                msg = await js.get_msg(stream, seq)
                out.append((msg.subject, msg.data or b"", (msg.headers or {}).get("Nats-Msg-Id", "")))
        return out
    finally:
        await nc.close()


class Bus:
    """The stream's content, decoded by subject."""

    def __init__(self, cluster: str, messages: list[tuple[str, bytes, str]]) -> None:
        self.messages = messages
        self.stops: list[dict[str, Any]] = []
        self.jobs: list[int] = []
        self.logs: list[str] = []
        for subject, payload, _ in messages:
            parsed = parse_payload(payload, now=0, place=subject)
            assert not parsed.problems, parsed.problems
            for line in parsed.lines:
                if subject == f"{cluster}.events.job":
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
    assert sorted(bus.jobs) == jobs  # each job in exactly one envelope record
    ids = [msg_id for _, _, msg_id in bus.messages]
    assert all(ids) and len(set(ids)) == len(ids)


@pytest.fixture
def service(tmp_path: Path, nats_server: NatsServer, request: pytest.FixtureRequest) -> Iterator[Service]:
    cluster = f"ocs{abs(hash(request.node.name)) % 10**8}"  # a stream of its own
    svc = Service(tmp_path, nats_server.url, cluster)
    yield svc
    svc.kill()


def test_publishes_and_resumes_exactly_once(service: Service) -> None:
    write(service.accounting, record(1), "{broken", record(2))
    service.start()
    bus = service.wait_for("jobs 1, 2 and the problem", lambda b: b.stop_ids() == [1, 2] and len(b.logs) == 1)
    assert bus.logs[0].startswith(f"{service.accounting}:2: ocs accounting: line: not valid JSON")
    third = record(3)
    append(service.accounting, third[:40])  # a half-written line: waited for, never reported
    time.sleep(0.5)
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


def test_reread_after_a_crash_is_dropped_by_jetstream(service: Service) -> None:
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
    deadline = time.monotonic() + TIMEOUT
    while (st := load_state(service.state)) is None or st.position.offset != size:
        assert time.monotonic() < deadline, service.log()
        time.sleep(0.1)
    assert service.stop() == 0
    after = service.messages()
    assert after == before  # same chunk, same Nats-Msg-Ids: JetStream kept none of the copies
    exactly_once(Bus(service.cluster, after), [1, 2, 3])


def test_follows_rotation(service: Service) -> None:
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
    service = Service(tmp_path, server.url, "ocsoutage")
    try:
        write(service.accounting, record(1))
        service.start()
        service.wait_for("job 1", lambda b: b.stop_ids() == [1])
        server.stop()
        append(service.accounting, record(2) + "\n")
        time.sleep(1.0)  # a few polls while the broker is away
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
