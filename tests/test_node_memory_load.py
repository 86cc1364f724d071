"""/proc/meminfo and /proc/loadavg readers."""

import pytest

from hpcbus.producers.node.load import LoadReader, parse_loadavg
from hpcbus.producers.node.memory import MemoryReader, parse_meminfo
from tests.node_fixtures import FIX


def test_vm_meminfo_values_in_kib():
    m = MemoryReader(str(FIX / "vm")).read()
    assert m.total == 24684096
    assert m.available == 24006964
    assert m.free == 23710272
    assert (m.buffers, m.cached, m.shmem, m.swap_total) == (5676, 453748, 8788, 0)
    assert m.used == 24684096 - 24006964  # Sonar used_memory
    assert m.hugepage_size == 2048


def test_hpc_meminfo_swap():
    m = MemoryReader(str(FIX / "hpc")).read()
    assert m.swap_used == 8388604 - 8388000
    assert m.used == 196608000 - 26643940


def test_meminfo_without_memavailable_uses_memfree():
    m = parse_meminfo(b"MemTotal: 1000 kB\nMemFree: 400 kB\n")
    assert m.available == 400 and m.used == 600


def test_meminfo_without_total_is_an_error():
    with pytest.raises(ValueError):
        parse_meminfo(b"MemFree: 400 kB\n")


def test_loadavg_from_vm_capture():
    la = LoadReader(str(FIX / "vm")).read()
    assert (la.load1, la.load5, la.load15) == (3.75, 1.81, 0.86)
    assert (la.running, la.total, la.last_pid) == (3, 1126, 15556)


def test_loadavg_garbage_is_an_error():
    with pytest.raises(ValueError):
        parse_loadavg(b"nonsense\n")
