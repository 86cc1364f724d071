"""Sysinfo: OS, topology, NUMA, GPU cards and the optional lstopo picture."""

import base64
import shutil

import psutil

from hpcbus.producers.node import sysinfo as sysinfo_mod
from hpcbus.producers.node.gpu_nvml import NvmlGpuReader
from hpcbus.producers.node.sysinfo import SysinfoReader
from tests.node_fixtures import FIX
from tests.test_node_gpu_nvml import Card, FakeNvml


def test_hpc_node_topology_and_numa():
    info = SysinfoReader(str(FIX / "hpc")).read(now=1768400000.0)
    assert (info.hostname, info.os_name, info.os_release) == (
        "c1-10",
        "Linux",
        "5.14.0-503.40.1.el9_5.x86_64",
    )
    assert (info.sockets, info.cores_per_socket, info.threads_per_core) == (2, 2, 2)
    assert info.cpu_model == "Intel(R) Xeon(R) Gold 6148 CPU @ 2.40GHz"
    assert info.memory_kib == 196608000
    assert info.numa_nodes == 2 and info.distances == [[10, 21], [21, 10]]
    assert [n.hwthreads for n in info.numa] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert info.numa[1].memory_kib == 98304000
    t = {h.hwthread: h for h in info.topology}
    assert (t[4].socket, t[4].core, t[4].numa) == (0, 0, 0)
    assert (t[7].socket, t[7].core, t[7].numa) == (1, 1, 1)
    assert info.boot_time == 1768390740
    assert info.topo_svg is None  # never run lstopo for a fixture root
    assert info.cards == []


def test_vm_capture():
    info = SysinfoReader(str(FIX / "vm")).read()
    assert (info.sockets, info.cores_per_socket, info.threads_per_core) == (1, 2, 1)
    assert info.cpu_model == "AMD EPYC"
    assert info.distances == [[10]] and info.numa_nodes == 1
    assert info.memory_kib == 24684096 and info.hostname == "vm"


def test_topology_from_cpuinfo_without_sysfs(tmp_path):
    (tmp_path / "proc").mkdir()
    shutil.copy(FIX / "hpc" / "proc" / "cpuinfo", tmp_path / "proc" / "cpuinfo")
    info = SysinfoReader(str(tmp_path)).read()
    assert (info.sockets, info.cores_per_socket, info.threads_per_core) == (2, 2, 2)
    assert len(info.topology) == 8 and info.numa_nodes == 1


def test_gpu_cards_are_included():
    info = SysinfoReader(str(FIX / "hpc"), gpus=NvmlGpuReader(FakeNvml([Card(0), Card(1)]))).read()
    assert [(c.index, c.architecture) for c in info.cards] == [(0, "Turing"), (1, "Turing")]


def test_lstopo_svg_on_the_real_machine():
    info = SysinfoReader("/").read()
    assert info.topo_svg is not None
    svg = base64.b64decode(info.topo_svg)
    assert svg.lstrip().startswith(b"<?xml") and b"<svg" in svg
    assert info.sockets >= 1 and info.memory_kib > 0


def test_without_hwloc_there_is_no_svg(monkeypatch):
    monkeypatch.setattr(sysinfo_mod.shutil, "which", lambda name: None)
    assert SysinfoReader("/").read().topo_svg is None
    assert SysinfoReader("/", topo_svg=False).read().topo_svg is None


def test_boot_time_through_psutil_reads_the_root_and_restores_procfs_path(tmp_path):
    assert SysinfoReader(str(FIX / "vm")).read().boot_time == 1795305053  # the capture's btime, not ours
    assert psutil.PROCFS_PATH == "/proc"
    (tmp_path / "proc").mkdir()  # no stat: no boot time, and the path is restored after the error
    assert SysinfoReader(str(tmp_path)).read().boot_time is None
    assert psutil.PROCFS_PATH == "/proc"
