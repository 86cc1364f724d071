"""CPU readings from /proc/stat: Sonar busy seconds and ClusterCockpit-style percentages."""

import pytest

from hpcbus.producers.node.cpu import CpuReader, cpu_usage, parse_proc_stat
from tests.node_fixtures import FIX


def test_vm_stat_counters_and_sonar_seconds():
    stat = CpuReader(str(FIX / "vm")).read()
    assert stat.clock_ticks == 100
    assert stat.boot_time == 1795305053
    assert stat.node.user == 33128 and stat.node.system == 7782 and stat.node.steal == 2328
    assert [h.hwthread for h in stat.hwthreads] == [0, 1]
    # (user + nice + system + irq + softirq) // CLK_TCK
    assert stat.hwthreads[0].busy_s == (13527 + 0 + 3614 + 0 + 27) // 100 == 171
    assert stat.hwthreads[1].busy_s == (19601 + 4167 + 142) // 100 == 239
    assert stat.sonar_cpus() == [171, 239]
    assert stat.node_busy_s == (33128 + 7782 + 170) // 100
    assert stat.procs_running >= 1


def test_vm_percentages_between_two_captures():
    before = CpuReader(str(FIX / "vm")).read()
    after = CpuReader(str(FIX / "vm-later")).read()
    usage = cpu_usage(before, after)
    assert usage is not None
    # node deltas: user 363, system 37, idle 390, iowait 18, softirq 2, steal 10 -> 820 ticks
    assert usage.node.hwthread == -1
    assert usage.node.user == pytest.approx(363 / 820 * 100)
    assert usage.node.idle == pytest.approx(390 / 820 * 100)
    assert usage.node.iowait == pytest.approx(18 / 820 * 100)
    assert usage.node.used == pytest.approx(100 - (390 + 18) / 820 * 100)
    assert usage.interval_s == pytest.approx(820 / 100 / 2)
    for p in [usage.node, *usage.hwthreads]:
        total = p.user + p.nice + p.system + p.idle + p.iowait + p.irq + p.softirq + p.steal
        assert total == pytest.approx(100.0)


def test_hpc_percentages_per_hwthread_and_node():
    usage = cpu_usage(CpuReader(str(FIX / "hpc")).read(), CpuReader(str(FIX / "hpc-later")).read())
    assert usage is not None
    by = {p.hwthread: p for p in usage.hwthreads}
    assert sorted(by) == list(range(8))
    assert (by[0].user, by[0].system, by[0].idle, by[0].used) == pytest.approx((70.0, 20.0, 10.0, 90.0))
    assert (by[4].user, by[4].iowait, by[4].idle, by[4].used) == pytest.approx((5.0, 5.0, 85.0, 10.0))
    assert (usage.node.user, usage.node.system, usage.node.idle, usage.node.iowait) == pytest.approx(
        (37.5, 12.5, 47.5, 2.5)
    )
    assert usage.node.used == pytest.approx(50.0)
    assert usage.interval_s == pytest.approx(10.0)


def test_no_percentages_across_a_reboot_or_without_elapsed_time():
    a = CpuReader(str(FIX / "hpc")).read()
    assert cpu_usage(a, a) is None
    rebooted = parse_proc_stat(b"cpu  1 0 1 10 0 0 0 0 0 0\ncpu0 1 0 1 10 0 0 0 0 0 0\nbtime 5\n", 100)
    assert cpu_usage(a, rebooted) is None


def test_old_kernel_without_steal_and_guest_columns():
    s = parse_proc_stat(b"cpu  100 2 30 400 5\ncpu0 100 2 30 400 5\nbtime 1000\n", 100)
    assert s.node.iowait == 5 and s.node.steal == 0 and s.node.guest == 0
    assert s.hwthreads[0].busy_s == 1


def test_offline_hwthread_leaves_a_hole_in_sonar_cpus():
    s = parse_proc_stat(
        b"cpu  0 0 0 0 0 0 0 0 0 0\ncpu0 300 0 0 0 0 0 0 0 0 0\ncpu2 500 0 0 0 0 0 0 0 0 0\n", 100
    )
    assert s.sonar_cpus() == [3, 0, 5]


def test_missing_aggregate_line_is_an_error():
    with pytest.raises(ValueError):
        parse_proc_stat(b"intr 0\n", 100)
