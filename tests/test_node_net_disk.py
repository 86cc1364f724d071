"""/proc/net/dev and /proc/diskstats readers and their rates."""

import pytest

from hpcbus.producers.node.disk import DiskReader, disk_rates
from hpcbus.producers.node.net import NetReader, net_rates
from tests.node_fixtures import FIX


def test_vm_interfaces_skip_loopback_by_default():
    devs = NetReader(str(FIX / "vm")).read()
    assert [d.interface for d in devs] == ["ifb0", "ifb1", "eth0"]
    eth0 = devs[-1]
    assert (eth0.rx_bytes, eth0.rx_packets, eth0.tx_bytes, eth0.tx_packets) == (170700792, 4419, 256402, 2340)
    with_lo = NetReader(str(FIX / "vm"), exclude=[]).read()
    assert with_lo[0].interface == "lo"
    only_eth = NetReader(str(FIX / "vm"), exclude=["lo", "ifb*"]).read()
    assert [d.interface for d in only_eth] == ["eth0"]


def test_hpc_interface_rates():
    before = NetReader(str(FIX / "hpc")).read()
    after = NetReader(str(FIX / "hpc-later")).read()
    rates = {r.interface: r for r in net_rates(before, after, 10.0)}
    assert set(rates) == {"eno1", "ib0"}
    assert rates["eno1"].rx_bytes_per_s == pytest.approx(125e6)
    assert rates["eno1"].tx_bytes_per_s == pytest.approx(12.5e6)
    assert rates["eno1"].rx_packets_per_s == pytest.approx(10000)
    assert rates["ib0"].rx_bytes_per_s == 0.0
    assert net_rates(before, after, 0.0) == []


def test_counter_reset_gives_no_rate():
    before = NetReader(str(FIX / "hpc-later")).read()
    after = NetReader(str(FIX / "hpc")).read()
    assert [r.interface for r in net_rates(before, after, 10.0)] == ["ib0"]


def test_vm_disks_whole_devices_only():
    disks = DiskReader(str(FIX / "vm")).read()
    assert [d.name for d in disks] == ["vda"]  # loop*, zram0 excluded
    vda = disks[0]
    assert (vda.major, vda.minor) == (254, 0)
    assert len(vda.stats) == 17
    assert vda.reads == vda.stats[0] and vda.read_bytes == vda.stats[2] * 512


def test_vm_disk_rates_see_the_direct_write():
    a = DiskReader(str(FIX / "vm")).read()
    b = DiskReader(str(FIX / "vm-later")).read()
    (r,) = disk_rates(a, b, 4.0)
    assert r.write_bytes_per_s == pytest.approx((b[0].write_bytes - a[0].write_bytes) / 4.0)
    assert r.write_bytes_per_s > 200e6 / 4.0  # 200 MB written with O_DIRECT between the captures


def test_hpc_partitions_from_sysfs_and_rates():
    names = [d.name for d in DiskReader(str(FIX / "hpc")).read()]
    assert names == ["sda", "nvme0n1", "dm-0"]
    all_names = [d.name for d in DiskReader(str(FIX / "hpc"), include_partitions=True).read()]
    assert all_names == ["sda", "sda1", "nvme0n1", "nvme0n1p1", "dm-0"]
    rates = {
        r.name: r
        for r in disk_rates(
            DiskReader(str(FIX / "hpc")).read(), DiskReader(str(FIX / "hpc-later")).read(), 10.0
        )
    }
    assert rates["sda"].read_bytes_per_s == pytest.approx(1048576 / 10)
    assert rates["sda"].busy_percent == pytest.approx(5.0)
    assert rates["nvme0n1"].read_bytes_per_s == 0.0


def test_partition_names_without_sysfs(tmp_path):
    (tmp_path / "proc").mkdir()
    zeros = " ".join(["0"] * 17)
    (tmp_path / "proc" / "diskstats").write_text(
        f"8 0 sda {zeros}\n8 1 sda1 {zeros}\n259 0 nvme0n1 {zeros}\n259 1 nvme0n1p2 {zeros}\n"
        f"179 0 mmcblk0 {zeros}\n179 1 mmcblk0p1 {zeros}\n1 0 ram0 {zeros}\n"
    )
    assert [d.name for d in DiskReader(str(tmp_path)).read()] == ["sda", "nvme0n1", "mmcblk0"]
