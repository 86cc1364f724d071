"""The fault suite's run: all selected scenarios start together (each owns the services it breaks, so
their outages overlap instead of adding up), each test waits for its own scenario's result, and the table
of what each fault cost is printed at the end of the run.

Scenarios run in threads of this process. Services a scenario starts in its thread are stopped by that
thread before it ends (they die with the thread that started them, `hpcbus.local.daemon`), the shared
nats-server and InfluxDB are started here, in the main thread, before the threads.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import pytest

from tests.faults.harness import RESULTS, Campaign
from tests.faults.scenarios import NEEDS_SLURM, SCENARIOS, Context
from tests.services import InfluxDB, NatsServer


def _selected(session: pytest.Session) -> list[str]:
    names = []
    for item in session.items:
        scenario = getattr(item.function, "scenario", None) if isinstance(item, pytest.Function) else None
        if scenario is not None:
            names.append(scenario)
    return names


@pytest.fixture(scope="session")
def campaign(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    influxdb_session: InfluxDB,
    nats_server_session: NatsServer,
) -> Iterator[Campaign]:
    """scenario name -> future of its result, for every scenario selected in this run, all started at once."""
    influx = influxdb_session.ensure_running()
    nats = nats_server_session.ensure_running()
    names = _selected(request.session)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(names)), thread_name_prefix="fault")
    slurm = (
        request.getfixturevalue("slurm_session").ensure_running() if NEEDS_SLURM.intersection(names) else None
    )
    contexts = {
        name: Context(tmp_path_factory.mktemp(f"fault-{name}"), request.config, influx, nats, slurm=slurm)
        for name in names
    }

    def run(name: str) -> object:
        ctx = contexts[name]
        try:
            return SCENARIOS[name](ctx)
        finally:
            ctx.stop_all()

    futures = {name: pool.submit(run, name) for name in names}
    try:
        yield futures
    finally:
        for ctx in contexts.values():
            ctx.stop_all()
        pool.shutdown(wait=True, cancel_futures=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    rows = config.stash.get(RESULTS, [])
    if not rows:
        return
    terminalreporter.write_sep("-", "fault scenarios")
    head = f"{'scenario':<42} {'published':>10} {'stored':>10} {'lost':>6} {'duplicated':>10} {'recovery':>9}  note"
    terminalreporter.write_line(head)
    for r in rows:
        recovery = "-" if r.recovery_s is None else f"{r.recovery_s:.1f} s"
        terminalreporter.write_line(
            f"{r.scenario:<42} {r.published:>10} {r.stored:>10} {r.lost:>6} {r.duplicated:>10} {recovery:>9}  {r.note}"
        )
