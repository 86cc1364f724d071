"""Leases on JetStream (`hpcbus.lease`) against a real nats-server: a renewed lease stays with its holder
while a standby waits, a holder that stops renewing is replaced once its entry expires, and a holder cut
off from the server stops acting before its TTL could have run out, its fenced writes refused afterwards
so the new holder's state stays as the new holder wrote it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS

from hpcbus.lease import POLLS, FencedStore, Lease, NotHeld, read_holders
from hpcbus.retry import Stopping
from tests.faults.harness import proxy
from tests.services import NatsServer
from tests.services.nats_cluster import NatsCluster

pytestmark = pytest.mark.services

TTL = 2
_buckets = itertools.count()


def bucket() -> str:
    return f"ROLES_test_{time.time_ns()}_{next(_buckets)}"


@contextlib.asynccontextmanager
async def connected(url: str) -> AsyncIterator[NATS]:
    nc = await nats.connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        yield nc
    finally:
        await nc.close()


@contextlib.asynccontextmanager
async def keeping(lease: Lease) -> AsyncIterator[Stopping]:
    """`lease.keep` in the background; stopped (and released) at the end."""
    stopping = Stopping(2.0)
    task = asyncio.create_task(lease.keep(stopping))
    try:
        yield stopping
    finally:
        stopping.set()
        await asyncio.wait_for(task, 5)
        await lease.release()


async def until(what: str, check: object, timeout: float = 20.0) -> float:
    """Seconds until `check()` is true (polled every 20 ms); fails naming `what` after `timeout`."""
    t0 = time.monotonic()
    while not check():  # type: ignore[operator]
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not within {timeout} s: {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - t0


async def test_a_renewed_lease_stays_and_the_standby_takes_it_at_release(nats_server: NatsServer) -> None:
    name = bucket()
    async with connected(nats_server.url) as a_nc, connected(nats_server.url) as b_nc:
        a = Lease(a_nc, name, "jobs", ttl=TTL, holder="a")
        b = Lease(b_nc, name, "jobs", ttl=TTL, holder="b")
        a_stop_cm = keeping(a)
        a_stop = await a_stop_cm.__aenter__()
        await until("a holds the role", lambda: a.held)
        first = a.revision
        b_held = False
        async with keeping(b):
            # A sees renewals go by for three TTLs: B must never hold meanwhile.
            t0 = time.monotonic()
            while time.monotonic() - t0 < 3 * TTL:
                b_held = b_held or b.held
                assert a.held, "the holder lost a lease it renews"
                await asyncio.sleep(0.05)
            assert not b_held
            assert a.revision > first  # renewed: each renewal is a new revision
            holders = await read_holders(a_nc.jetstream(), name, ["jobs", "slurm"])
            assert holders["jobs"] is not None and holders["jobs"].holder == "a"
            assert holders["slurm"] is None
            released = time.monotonic()
            a_stop.set()
            await a_stop_cm.__aexit__(None, None, None)
            assert not a.held
            await until("b takes over after the release", lambda: b.held)
            # released: the standby's next look finds the key gone, no TTL to wait for
            assert time.monotonic() - released < TTL / POLLS + 1.0
            holders = await read_holders(b_nc.jetstream(), name, ["jobs"])
            assert holders["jobs"] is not None and holders["jobs"].holder == "b"


async def test_a_holder_that_stops_renewing_is_replaced_after_the_ttl(nats_server: NatsServer) -> None:
    name = bucket()
    async with connected(nats_server.url) as a_nc, connected(nats_server.url) as b_nc:
        a = Lease(a_nc, name, "jobs", ttl=TTL, holder="a")
        await a._try_take(Stopping())  # takes the role once and never renews: a holder that died
        assert a.held
        store_a = FencedStore(a)
        await store_a.put("x", b"from a")
        died = time.monotonic()
        b = Lease(b_nc, name, "jobs", ttl=TTL, holder="b")
        async with keeping(b):
            await until("b takes over", lambda: b.held, timeout=4 * TTL)
            took = time.monotonic() - died
            assert not a.held  # A's own clock let go before the server could expire the entry
            assert TTL - 0.5 <= took <= TTL + TTL / POLLS + 1.5, took
            store_b = FencedStore(b)
            await store_b.put("x", b"from b")
            a._good_until = time.monotonic() + 60  # a holder whose clock says it still holds
            with pytest.raises(NotHeld, match="fence refused"):
                await store_a.put("x", b"stale from a")
            with pytest.raises(NotHeld):
                await store_a.remove("x")
            assert await store_b.load() == {"x": b"from b"}


async def test_a_holder_cut_off_lets_go_before_its_ttl_and_its_writes_are_fenced(
    nats_server: NatsServer,
) -> None:
    name = bucket()
    with proxy(nats_server.port) as link:
        async with connected(link.url) as a_nc, connected(nats_server.url) as b_nc:
            a = Lease(a_nc, name, "jobs", ttl=TTL, holder="a")
            b = Lease(b_nc, name, "jobs", ttl=TTL, holder="b")
            async with keeping(a):
                await until("a holds", lambda: a.held)
                await FencedStore(a).put("x", b"a before the cut")
                async with keeping(b):
                    await until("a renewed once more", lambda: a.revision > 0 and a.held)
                    before = a.revision
                    link.cut()
                    cut = time.monotonic()
                    await until("a lets go", lambda: a.lost.is_set(), timeout=3 * TTL)
                    let_go = time.monotonic() - cut
                    assert not b.held  # A stopped first ...
                    await until("b takes over", lambda: b.held, timeout=4 * TTL)
                    took = time.monotonic() - cut
                    assert let_go < TTL * (1 - 1 / 3) + 0.2 < took, (
                        let_go,
                        took,
                    )  # ... before its TTL ran out
                    await FencedStore(b).put("x", b"b after the takeover")
                    with pytest.raises(NotHeld, match="not held"):
                        await FencedStore(a).put("x", b"a after the cut")  # refused before it is sent
                    # one that believes it still holds (A's last revision, its clock stopped) is refused by
                    # the server once the link is back
                    link.heal()
                    await until(
                        "a reconnected", lambda: a_nc.stats["reconnects"] and a_nc.is_connected, timeout=10
                    )
                    ghost = Lease(a_nc, name, "jobs", ttl=TTL, holder="a")
                    ghost.revision, ghost._good_until = before, time.monotonic() + 60
                    with pytest.raises(NotHeld, match="fence refused"):
                        await FencedStore(ghost).put("x", b"a after the cut")
                    assert await FencedStore(b).load() == {"x": b"b after the takeover"}


async def test_on_a_3_node_cluster_many_fenced_writes_and_renewals_never_collide(tmp_path: Path) -> None:
    """A clustered stream refuses a message whose expectation names a subject another in-flight message
    names: renewals and fenced batches go one at a time, so a holder writing thousands of entries while it
    renews neither loses its lease nor has a write refused, and a stale holder is still refused."""
    with NatsCluster(tmp_path / "cluster") as cluster:
        async with connected(cluster.urls[0]) as a_nc:
            a = Lease(a_nc, bucket(), "jobs", ttl=3, holder="a", replicas=3)
            async with keeping(a):
                await until("a holds", lambda: a.held)
                store = FencedStore(a)
                first = a.revision
                for round_ in range(4):  # several renewals go by meanwhile
                    done: list[str] = []
                    puts = [(f"k{i}", b"round %d" % round_ * 50) for i in range(3000)]
                    before = a.revision
                    await asyncio.gather(
                        store.apply(puts, (), done),
                        store.apply([("other", b"x")], (), []),
                        until("a renewal", lambda before=before: a.revision != before),
                    )
                    assert len(done) == 3000
                assert a.revision > first and a.held and not a.lost.is_set()
                loaded = await store.load()
                assert len(loaded) == 3001 and loaded["k0"] == b"round 3" * 50
                ghost = Lease(a_nc, a.bucket, "jobs", ttl=3, holder="a")
                ghost.revision, ghost._good_until = first, time.monotonic() + 60
                with pytest.raises(NotHeld, match="fence refused"):
                    await FencedStore(ghost).put("k0", b"stale")
