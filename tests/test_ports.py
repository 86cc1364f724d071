"""Ports for local services: never from the ephemeral range (where every outgoing connection takes its
local port, which broke a fault-suite cluster member's restart once), never handed out twice by one
process, and never one somebody already listens on."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from hpcbus.local.daemon import LOOPBACK, PortPicker, free_ports, port_free


def _ephemeral() -> tuple[int, int]:
    first, last = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    return first, last


def test_ports_are_outside_the_ephemeral_range_and_distinct_across_calls() -> None:
    first, last = _ephemeral()
    picked = free_ports(5) + free_ports(5) + free_ports(1)
    assert len(set(picked)) == len(picked)
    assert not [p for p in picked if first <= p <= last]


def test_a_port_somebody_listens_on_is_skipped() -> None:
    picker = PortPicker()
    held = picker._cursor
    with socket.socket() as s:
        s.bind((LOOPBACK, held))
        s.listen()
        assert not port_free(held)
        picked = picker.take(3)
    assert held not in picked
    assert picked[0] == held + 1 or picked[0] == picker.low


def test_concurrent_pickers_in_threads_get_disjoint_ports() -> None:
    picker = PortPicker()
    results: list[list[int]] = []
    lock = threading.Lock()

    def pick() -> None:
        got = [p for _ in range(20) for p in picker.take(2)]
        with lock:
            results.append(got)

    threads = [threading.Thread(target=pick) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [p for got in results for p in got]
    assert len(every) == 160 and len(set(every)) == 160


def test_the_cursor_wraps_inside_the_range() -> None:
    picker = PortPicker()
    picker._cursor = picker.high - 1
    first, second = picker.take(2)
    assert picker.low <= second < first < picker.high  # wrapped to the bottom, never past the top


def test_the_range_avoids_the_ephemeral_one_wherever_a_site_put_it() -> None:
    assert PortPicker.usable(32768, 60999) == (10000, 32768)  # Linux's default
    assert PortPicker.usable(1024, 32767) == (32768, 65536)  # a site that starts it low
    assert PortPicker.usable(1024, 65535) == (10000, 65536)  # nothing is left: the bind check alone
