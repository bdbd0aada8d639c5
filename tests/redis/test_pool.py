"""The services' Redis pool (:class:`coxswain.redisfix.WaitingPool`): its fast path when nobody
waits must keep what the blocking pool promises. At most ``max_connections`` at once; a command
past that waits for a connection (it is not refused "Too many connections", as redis-py's default
pool does: a runner driving ~100 sessions answered sends 503 and missed lease renewals); a wait
past ``timeout`` is a ConnectionError; a cancelled command gives its connection back."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

from coxswain import redisfix
from coxswain.redisfix import WaitingPool

redisfix.install()  # as the services have it: a cancellation is never swallowed


def _pool(r: redis.Redis, max_connections: int, timeout: float = 10.0) -> WaitingPool:
    kw = r.connection_pool.connection_kwargs
    return WaitingPool(host=kw["host"], port=kw["port"], password=kw.get("password"),
                       username=kw.get("username"), max_connections=max_connections, timeout=timeout,
                       decode_responses=True, socket_timeout=5)


def test_commands_past_the_bound_wait_for_a_connection_and_none_is_refused(r: redis.Redis) -> None:
    async def go() -> tuple[list[Any], int, int]:
        pool = _pool(r, 3)
        client = aioredis.Redis.from_pool(pool)
        most = 0

        async def one(i: int) -> Any:
            nonlocal most
            # BLPOP holds its connection for the whole 50 ms: 30 of them need waits at a bound of 3
            got = await client.blpop([f"pool:none:{i}"], timeout=0.05)
            most = max(most, len(pool._in_use_connections))
            return got

        try:
            out = await asyncio.gather(*(one(i) for i in range(30)), return_exceptions=True)
            made = len(pool._available_connections) + len(pool._in_use_connections)
            return out, most, made
        finally:
            await client.aclose()

    out, most, made = asyncio.run(go())
    assert [o for o in out if isinstance(o, BaseException)] == [], "a command past the bound must wait, not fail"
    assert out == [None] * 30
    assert most <= 3 and made <= 3, (most, made)


def test_a_wait_past_the_pools_timeout_is_a_connection_error(r: redis.Redis) -> None:
    async def go() -> None:
        client = aioredis.Redis.from_pool(_pool(r, 1, timeout=0.2))
        try:
            holder = asyncio.ensure_future(client.blpop(["pool:held"], timeout=1))
            await asyncio.sleep(0.05)
            with pytest.raises(redis.exceptions.ConnectionError):
                await client.get("pool:other")
            assert await holder is None
            assert await client.get("pool:other") is None, "usable again once the holder is done"
        finally:
            await client.aclose()

    asyncio.run(go())


def test_sequential_commands_reuse_one_connection_and_cancelled_ones_give_theirs_back(r: redis.Redis) -> None:
    async def go() -> tuple[int, int, int]:
        pool = _pool(r, 4)
        client = aioredis.Redis.from_pool(pool)
        try:
            for i in range(200):
                await client.set("pool:k", i)
            made = len(pool._available_connections) + len(pool._in_use_connections)
            for _ in range(100):
                task = asyncio.ensure_future(client.blpop(["pool:never"], timeout=1))
                await asyncio.sleep(0.002)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            in_use = len(pool._in_use_connections)
            assert await client.get("pool:k") == "199"
            return made, in_use, len(pool._available_connections) + len(pool._in_use_connections)
        finally:
            await client.aclose()

    made, in_use, after = asyncio.run(go())
    assert made == 1, f"{made} connections for 200 commands one after another"
    assert in_use == 0, f"{in_use} connections still taken after their commands were cancelled"
    assert after <= 4
