"""RAPL energy, cpufreq, InfiniBand and Lustre readers against the `hpc` fixture trees."""

import shutil

import pytest

from hpcbus.producers.node.cpufreq import CpuFreqReader
from hpcbus.producers.node.energy import RaplReader, RaplZone, rapl_power
from hpcbus.producers.node.infiniband import InfinibandReader, ib_rates
from hpcbus.producers.node.lustre import LustreReader, lustre_rates, parse_llite_stats
from tests.node_fixtures import FIX

HPC, LATER, VM = str(FIX / "hpc"), str(FIX / "hpc-later"), str(FIX / "vm")


def test_rapl_zones():
    zones = {z.zone: z for z in RaplReader(HPC).read()}
    assert sorted(zones) == ["intel-rapl:0", "intel-rapl:0:0", "intel-rapl:1", "intel-rapl:1:0"]
    assert (zones["intel-rapl:0"].name, zones["intel-rapl:0"].package) == ("package-0", 0)
    assert (zones["intel-rapl:1:0"].name, zones["intel-rapl:1:0"].package) == ("dram", 1)
    assert zones["intel-rapl:0"].energy_uj == 123456789012
    assert zones["intel-rapl:1"].max_energy_range_uj == 262143328850


def test_rapl_power_with_wrap():
    power = {p.zone: p for p in rapl_power(RaplReader(HPC).read(), RaplReader(LATER).read(), 10.0)}
    assert power["intel-rapl:0"].power_w == pytest.approx(100.0)
    assert power["intel-rapl:0:0"].power_w == pytest.approx(20.0)
    assert power["intel-rapl:1"].power_w == pytest.approx(100.0)  # wrapped at max_energy_range_uj
    assert power["intel-rapl:1"].energy_j == pytest.approx(1000.0)
    assert power["intel-rapl:1:0"].power_w == pytest.approx(15.0)


def test_rapl_counter_going_down_without_range_gives_nothing():
    a = [RaplZone(zone="z", name="package-0", package=0, energy_uj=100, max_energy_range_uj=0)]
    b = [RaplZone(zone="z", name="package-0", package=0, energy_uj=50, max_energy_range_uj=0)]
    assert rapl_power(a, b, 10.0) == []
    assert rapl_power(a, a, 0.0) == []


def test_no_rapl_no_ib_no_lustre_on_the_vm():
    assert RaplReader(VM).read() == []
    assert InfinibandReader(VM).read() == []
    assert LustreReader(VM).read() == []


def test_cpufreq_sysfs_khz_to_mhz():
    freqs = CpuFreqReader(HPC).read()
    assert [f.hwthread for f in freqs] == list(range(8))
    assert (freqs[0].mhz, freqs[0].source) == (2400.0, "cpufreq")
    assert freqs[4].mhz == 1000.0
    assert CpuFreqReader(LATER).read()[5].mhz == 1005.0


def test_cpufreq_falls_back_to_cpuinfo_on_a_vm():
    freqs = CpuFreqReader(VM).read()
    assert [(f.hwthread, f.mhz, f.source) for f in freqs] == [
        (0, 2445.428, "cpuinfo"),
        (1, 2445.428, "cpuinfo"),
    ]
    assert CpuFreqReader(VM, cpuinfo_fallback=False).read() == []


def test_infiniband_counters_in_bytes():
    (port,) = InfinibandReader(HPC).read()
    assert (port.device, port.port, port.state, port.link_layer) == ("mlx5_0", 1, "4: ACTIVE", "InfiniBand")
    assert port.rcv_bytes == 987654321000 * 4  # port_rcv_data counts 4-byte words
    assert port.xmit_packets == 3456789012


def test_infiniband_rates():
    (r,) = ib_rates(InfinibandReader(HPC).read(), InfinibandReader(LATER).read(), 10.0)
    assert r.rcv_bytes_per_s == pytest.approx(1e9)
    assert r.xmit_bytes_per_s == pytest.approx(1e8)
    assert (r.rcv_packets_per_s, r.xmit_packets_per_s) == pytest.approx((5e5, 1e5))


def test_lustre_llite_stats():
    (s,) = LustreReader(HPC).read()
    assert (s.mount, s.fs) == ("scratch-ffff9c4a3e7d8800", "scratch")
    assert (s.read_bytes, s.write_bytes, s.reads, s.writes) == (6823133184, 5238263808, 2090, 1283)
    assert s.ops["open"] == 503 and s.ops["statfs"] == 11
    assert "snapshot_time" not in s.ops


def test_lustre_rates():
    (r,) = lustre_rates(LustreReader(HPC).read(), LustreReader(LATER).read(), 10.0)
    assert r.read_bytes_per_s == pytest.approx(100 * 2**20)
    assert r.write_bytes_per_s == pytest.approx(50 * 2**20)
    assert (r.reads_per_s, r.writes_per_s) == pytest.approx((25.0, 12.5))
    assert r.ops_per_s["open"] == pytest.approx(2.0)


def test_lustre_in_debugfs_and_old_format(tmp_path):
    d = tmp_path / "sys" / "kernel" / "debug" / "lustre" / "llite" / "home-ffff0000"
    d.mkdir(parents=True)
    (d / "stats").write_text(
        "snapshot_time             1589356784.385213006 secs.usecs\n"
        "read_bytes                5 samples [bytes] 0 1048576 1048580\n"
        "open                      42 samples [regs]\n"
    )
    (s,) = LustreReader(str(tmp_path)).read()
    assert (s.fs, s.read_bytes, s.reads, s.writes, s.ops["open"]) == ("home", 1048580, 5, 0, 42)
    assert parse_llite_stats("x-1", b"").ops == {}


def test_unreadable_rapl_counter_raises_for_the_collector_to_report(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(FIX / "hpc", root)
    e = root / "sys" / "class" / "powercap" / "intel-rapl:0" / "energy_uj"
    e.unlink()
    e.mkdir()  # reading it fails like EACCES would for a non-root collector on Linux >= 5.10
    with pytest.raises(OSError):
        RaplReader(str(root)).read()
