"""Issue 13's fault suite: real processes, a bounded flood of distinct points, one fault each, and an exact
count at the end: nothing lost, nothing stored twice. `make faults` runs only these; `make test` runs them
too. The scenarios themselves are in `scenarios.py`; they run concurrently (conftest.py), each test here
waits for its own and checks its row of the table printed at the end."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pytest

from tests.faults.harness import Campaign, FaultRow
from tests.faults.scenarios import INFLUX_DOWN_S

pytestmark = pytest.mark.services

RESULT_TIMEOUT = 900.0 + max(0.0, INFLUX_DOWN_S - 60.0)
"""Seconds a test waits for its scenario (they run together; the longest outage is 60 s, or row 12's
`HPCBUS_FAULT_INFLUX_DOWN` when that is longer)."""

F = TypeVar("F", bound=Callable[..., Any])


def scenario(name: str) -> Callable[[F], F]:
    """Mark a test as the check of scenario `name` (conftest starts the selected ones together)."""

    def mark(fn: F) -> F:
        fn.scenario = name  # type: ignore[attr-defined]
        return fn

    return mark


def result(campaign: Campaign, name: str) -> FaultRow:
    row = campaign[name].result(timeout=RESULT_TIMEOUT)
    assert isinstance(row, FaultRow)
    return row


def assert_exact(row: FaultRow) -> None:
    assert row.published > 0
    assert (row.lost, row.duplicated) == (0, 0), row
    assert row.stored == row.published, row


@scenario("leader_killed")
def test_stream_leader_killed_mid_flood_and_restarted_30s_later(campaign: Campaign) -> None:
    assert_exact(result(campaign, "leader_killed"))


@scenario("influx_stopped")
def test_influxdb_stopped_for_60s(campaign: Campaign) -> None:
    assert_exact(result(campaign, "influx_stopped"))


@scenario("influx_killed")
def test_influxdb_killed_and_restarted_on_its_data(campaign: Campaign) -> None:
    assert_exact(result(campaign, "influx_killed"))


@scenario("worker_killed")
def test_worker_killed_mid_batch_while_two_share_the_durable(campaign: Campaign) -> None:
    assert_exact(result(campaign, "worker_killed"))


@scenario("broker_and_producer_killed")
def test_broker_down_30s_then_producer_killed_every_outage_sample_arrives(campaign: Campaign) -> None:
    assert_exact(result(campaign, "broker_and_producer_killed"))


@scenario("partition")
def test_producer_partitioned_from_the_cluster_for_60s(campaign: Campaign) -> None:
    assert_exact(result(campaign, "partition"))


@scenario("hostile")
def test_hostile_messages_are_dead_lettered_and_valid_lines_stored(campaign: Campaign) -> None:
    assert_exact(result(campaign, "hostile"))


@scenario("stream_full")
def test_a_full_stream_discarding_unread_messages_is_counted_exactly(campaign: Campaign) -> None:
    row = result(campaign, "stream_full")
    assert row.lost > 0 and row.duplicated == 0  # the loss is counted exactly: checked in the scenario


@scenario("stream_full_refused")
def test_a_full_stream_with_discard_new_refuses_and_loses_nothing(campaign: Campaign) -> None:
    assert_exact(result(campaign, "stream_full_refused"))


@scenario("poison_name")
def test_a_253_character_host_name_never_halts_the_sonar_worker(campaign: Campaign) -> None:
    assert_exact(result(campaign, "poison_name"))


@scenario("first_start_old")
def test_posts_discarded_before_the_first_worker_ran_are_counted(campaign: Campaign) -> None:
    row = result(campaign, "first_start_old")
    assert row.lost > 0 and row.duplicated == 0  # every lost line counted: checked in the scenario


@scenario("first_start_new")
def test_with_discard_new_posts_before_any_durable_are_refused_and_nothing_acknowledged_is_lost(
    campaign: Campaign,
) -> None:
    assert_exact(result(campaign, "first_start_new"))


@scenario("two_influx")
def test_one_of_two_influxdbs_down_while_producers_publish(campaign: Campaign) -> None:
    """Issue 34: two `consume influx` groups, each with its own durable and InfluxDB; one InfluxDB down for
    `HPCBUS_FAULT_INFLUX_DOWN` seconds (default 45, to keep the suite short) while the producer publishes.
    The other has every point throughout (it trails the bus by seconds: scenarios.py), the first
    catches up after it returns: each copy exact, lost 0 and duplicated 0. The issue's 5 minutes were
    measured once (docs/scaling.md, "Two InfluxDBs"); rerun them with
    `HPCBUS_FAULT_INFLUX_DOWN=300 .venv/bin/python -m pytest -q tests/faults/test_faults.py -k two_influxdbs`."""
    rows = campaign["two_influx"].result(timeout=RESULT_TIMEOUT)
    assert isinstance(rows, tuple)
    up, back = rows
    assert_exact(up)
    assert_exact(back)
    assert back.recovery_s is not None


def assert_pair(row: FaultRow, ttl: float) -> None:
    """Every job's summary equals an undisturbed worker's, each stored once, the role taken within TTL + 10 s."""
    assert row.published > 0 and row.stored == row.published, row
    assert (row.lost, row.duplicated) == (0, 0), row
    assert row.recovery_s is not None and row.recovery_s <= ttl + 10, row


@scenario("jobs_active_killed")
def test_the_active_jobs_worker_sigkilled_with_its_disk_gone_the_standby_takes_over(
    campaign: Campaign,
) -> None:
    from tests.faults.scenarios import PAIR_TTL

    assert_pair(result(campaign, "jobs_active_killed"), PAIR_TTL)


@scenario("jobs_holder_paused")
def test_the_jobs_lease_holder_paused_past_its_ttl_stops_acting_and_writes_nothing(
    campaign: Campaign,
) -> None:
    from tests.faults.scenarios import PAIR_TTL

    assert_pair(result(campaign, "jobs_holder_paused"), PAIR_TTL)


@scenario("ocs_active_killed")
def test_the_active_ocs_producer_sigkilled_mid_file_the_standby_publishes_each_job_once(
    campaign: Campaign,
) -> None:
    from tests.faults.scenarios import PAIR_TTL

    assert_pair(result(campaign, "ocs_active_killed"), PAIR_TTL)


@scenario("ocs_holder_paused")
def test_the_ocs_lease_holder_paused_past_its_ttl_stops_acting_and_writes_nothing(
    campaign: Campaign,
) -> None:
    from tests.faults.scenarios import PAIR_TTL

    assert_pair(result(campaign, "ocs_holder_paused"), PAIR_TTL)


@scenario("slurm_active_killed")
def test_the_active_slurm_producer_sigkilled_with_jobs_running_each_event_and_record_once(
    campaign: Campaign,
) -> None:
    from tests.faults.scenarios import PAIR_TTL

    assert_pair(result(campaign, "slurm_active_killed"), PAIR_TTL)
