"""The takeover and sweeper passes are the stack's, not each runner's (:meth:`Store.claim`,
:meth:`Store.sweep` with ``every_ms``): on a real Redis with the library loaded, several runners'
stores ticking in one period make one scan between them, a pass that finds more expired leases
than its limit leaves the rest to whichever runner comes next at once, and a runner that took a
period's pass and died delays the next takeover by that period only. Idle, each pass over every
bucket cost Redis ~0.5 ms: with one per runner a period, Redis's idle CPU grew with the runners
(13 ms/s at four runners on one host)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aredis
import structlog
import uvloop

from cox.servers import RedisServer
from cox_runner.redis.store import LIBRARY, Store
from coxswain import keys

LEASE_MS = 5_000
PERIOD_MS = 400


def run(tmp: Path, go: Callable[[list[Store], Any], Awaitable[None]], stores: int = 4) -> None:
    async def main(url: str) -> None:
        r = aredis.from_url(url, decode_responses=True)
        log = structlog.get_logger("test")
        # no bus: nothing here publishes (the sessions are made with no publish-lock owner)
        runners = [Store(r, None, f"r_{i}", log) for i in range(stores)]  # type: ignore[arg-type]
        try:
            await r.function_load(LIBRARY, replace=True)
            await go(runners, r)
        finally:
            for s in runners:
                await s.aclose()
            await r.aclose()

    rs = RedisServer(tmp / "redis")
    rs.start()
    try:
        uvloop.run(main(rs.admin_url))
    finally:
        rs.close()


async def lapsed(store: Store, sid: str) -> None:
    """A session whose turn runs under a lease that has already lapsed (its runner died)."""
    body = json.dumps({"type": "session.created", "sid": sid, "workspace": "/w", "model": "script"})
    await store.fns.create(sid=sid, principal="p", workspace="/w", model="script", title="", body=body, owner="")
    await store.fns.send(sid=sid, principal="p", message_id=f"m_{sid}", text="go", mode="", client_id="",
                         runner="r_dead", lease_ms=1, turn_id=f"t_{sid}", owner="", models="", agents_md="")


async def fcalls(r: Any) -> int:
    """How many FCALLs Redis has run (each test has a server of its own, and between two reads
    only the passes under test call the library)."""
    stats = await r.info("commandstats")
    return int(stats.get("cmdstat_fcall", {}).get("calls", 0))


def test_several_runners_ticking_in_one_period_make_one_takeover_pass(tmp_path: Path) -> None:
    async def go(runners: list[Store], r: Any) -> None:
        await lapsed(runners[0], "s_lapsed1")
        await asyncio.sleep(0.01)
        before = await fcalls(r)
        got = [await s.claim(runner=s.owner, lease_ms=LEASE_MS, limit=20, every_ms=PERIOD_MS) for s in runners]
        assert await fcalls(r) - before == 1, "one scan for the stack, not one per runner"
        assert [len(g) for g in got] == [1, 0, 0, 0]
        assert got[0][0]["sid"] == "s_lapsed1" and got[0][0]["old_runner"] == "r_dead"
        # the next period: whoever ticks first makes its pass
        await asyncio.sleep(PERIOD_MS / 1000 + 0.05)
        before = await fcalls(r)
        for s in runners[::-1]:
            await s.claim(runner=s.owner, lease_ms=LEASE_MS, limit=20, every_ms=PERIOD_MS)
        assert await fcalls(r) - before == 1

    run(tmp_path, go)


def test_a_pass_that_reached_its_limit_leaves_the_rest_to_the_next_runner_at_once(tmp_path: Path) -> None:
    async def go(runners: list[Store], r: Any) -> None:
        for i in range(5):
            await lapsed(runners[0], f"s_many{i}")
        await asyncio.sleep(0.01)
        t0 = time.monotonic()
        got = [await s.claim(runner=s.owner, lease_ms=LEASE_MS, limit=2, every_ms=PERIOD_MS) for s in runners]
        assert time.monotonic() - t0 < PERIOD_MS / 1000, "all within one period"
        assert [len(g) for g in got] == [2, 2, 1, 0], "a full pass gives the period's turn back"
        claimed = [c["sid"] for g in got for c in g]
        assert sorted(claimed) == [f"s_many{i}" for i in range(5)], "each session claimed once"
        for s, g in zip(runners, got, strict=True):
            for c in g:
                assert await r.hget(keys.session(c["sid"]), "runner") == s.owner

    run(tmp_path, go)


def test_a_runner_that_took_the_period_and_died_delays_takeover_by_that_period(tmp_path: Path) -> None:
    async def go(runners: list[Store], r: Any) -> None:
        await lapsed(runners[0], "s_late")
        # a runner took this period's pass and died before making it
        assert await r.set(keys.stack_pass("claim"), "r_dead", nx=True, px=PERIOD_MS)
        t0 = time.monotonic()
        taken: list[tuple[float, str]] = []
        while not taken and time.monotonic() - t0 < 5:
            for s in runners[1:]:
                got = await s.claim(runner=s.owner, lease_ms=LEASE_MS, limit=20, every_ms=PERIOD_MS)
                taken += [(time.monotonic() - t0, str(c["sid"])) for c in got]
            await asyncio.sleep(0.02)
        assert [sid for _, sid in taken] == ["s_late"]
        waited = taken[0][0]
        assert PERIOD_MS / 1000 * 0.8 <= waited < PERIOD_MS / 1000 + 0.5, waited

    run(tmp_path, go, stores=3)


def test_a_pass_without_a_period_always_scans(tmp_path: Path) -> None:
    """What the runner's drills and tests call directly (and a lone pass after a failover):
    ``every_ms`` 0 takes no turn and leaves none."""
    async def go(runners: list[Store], r: Any) -> None:
        await lapsed(runners[0], "s_direct")
        await asyncio.sleep(0.01)
        before = await fcalls(r)
        got = [await s.claim(runner=s.owner, lease_ms=LEASE_MS, limit=20) for s in runners[:2]]
        assert await fcalls(r) - before == 2
        assert [len(g) for g in got] == [1, 0]
        assert await r.exists(keys.stack_pass("claim")) == 0

    run(tmp_path, go, stores=2)


def test_several_runners_sweeping_in_one_period_make_one_sweep(tmp_path: Path) -> None:
    async def go(runners: list[Store], r: Any) -> None:
        before = await fcalls(r)
        for s in runners:
            assert await s.sweep(min_age_ms=0, every_ms=PERIOD_MS) == 0
        assert await fcalls(r) - before == 1
        await asyncio.sleep(PERIOD_MS / 1000 + 0.05)
        for s in runners:
            await s.sweep(min_age_ms=0, every_ms=PERIOD_MS)
        assert await fcalls(r) - before == 2

    run(tmp_path, go)


def test_in_a_cluster_the_stacks_passes_share_out_the_buckets_between_runners(tmp_path: Path) -> None:
    """In a cluster a pass looks at its share of the buckets; the share follows the stack's last
    pass, whichever runner made it, so ``share`` periods look at every bucket once. (One server
    stands in for the cluster's masters: the share is the store's, the calls per bucket are
    what they are on a cluster.)"""
    async def go(runners: list[Store], r: Any) -> None:
        seen: list[list[int]] = []
        for s in runners:
            s.cluster = True
            scan = s._scan

            async def spy(queue: Any, wait: bool = False, buckets: list[int] | None = None, _scan: Any = scan) -> Any:
                seen.append(list(buckets or []))
                return await _scan(queue, wait=wait, buckets=buckets)

            s._scan = spy  # type: ignore[method-assign]
        await lapsed(runners[0], "s_somewhere")
        got = []
        for k in range(4):
            await r.delete(keys.stack_pass("claim"))  # the next period
            s = runners[k % 2]
            got += await s.claim(runner=s.owner, lease_ms=LEASE_MS, limit=20, share=4, every_ms=PERIOD_MS)
        assert [len(g) for g in seen] == [keys.buckets() // 4] * 4
        assert sorted(b for g in seen for b in g) == list(range(keys.buckets())), "every bucket once"
        assert [c["sid"] for c in got] == ["s_somewhere"]

    run(tmp_path, go, stores=2)
