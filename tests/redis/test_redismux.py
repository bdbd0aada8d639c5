"""The multiplexed Redis connection (:mod:`coxswain.redismux`) that carries the runner's ``FCALL``\\ s,
on a real Redis with its ACL (a password, a user): every call gets its own reply, whatever is
cancelled, times out, fails or breaks around it; failures are redis-py's exceptions."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import redis
import redis.asyncio as aredis
import redis.exceptions
import uvloop

from coxswain.redismux import Mux


def _mux(r: redis.Redis, **kw: Any) -> Mux:
    k = r.connection_pool.connection_kwargs
    return Mux(host=k["host"], port=k["port"], username=k.get("username"), password=k.get("password"), **kw)


def run(go: Callable[[], Coroutine[Any, Any, None]]) -> None:
    """On asyncio's loop and on uvloop's (the services'): their transports differ."""
    asyncio.run(go())
    uvloop.run(go())


def with_mux(r: redis.Redis, go: Callable[[Mux], Coroutine[Any, Any, None]], **kw: Any) -> None:
    """``go`` with a Mux to ``r``'s server, closed after it, on each loop (:func:`run`)."""
    async def main() -> None:
        m = _mux(r, **kw)
        try:
            await go(m)
        finally:
            await m.aclose()

    run(main)


def test_concurrent_calls_each_get_their_own_reply(r: redis.Redis) -> None:
    async def go(m: Mux) -> None:
        # 2,000 calls at once, of different lengths and kinds: answers in one write come back
        # in pieces, and each must reach the call that asked for it
        vals = [f"v{i}-" + "x" * (i % 97) * 40 for i in range(2000)]
        got = await asyncio.gather(*(m.call("ECHO", v) for v in vals))
        assert got == vals
        r.delete("mux:n")
        counts = await asyncio.gather(*(m.call("INCRBY", "mux:n", 1) for _ in range(300)))
        assert sorted(counts) == list(range(1, 301))

    with_mux(r, go)


def test_an_error_reply_is_redis_pys_exception_and_the_connection_goes_on(r: redis.Redis) -> None:
    async def go(m: Mux) -> None:
        with pytest.raises(redis.exceptions.ResponseError, match="Function not found"):
            await m.call("FCALL", "cox_not_a_function", 0)
        with pytest.raises(redis.exceptions.NoScriptError):
            await m.call("EVALSHA", "0" * 40, 0)
        r.set("mux:s", "a")
        with pytest.raises(redis.exceptions.ResponseError, match="WRONGTYPE"):
            await m.call("LPUSH", "mux:s", "x")
        assert await m.call("ECHO", "after") == "after"
        assert await m.call("GET", "mux:nothing") is None

    with_mux(r, go)


def test_cancelled_calls_leave_the_connection_in_step(r: redis.Redis) -> None:
    """A call cancelled at any point (before its write, after it, mid-reply) takes, and the next
    call on the connection gets its own reply, never the cancelled one's."""
    async def go(m: Mux) -> None:
        rng = random.Random(11)
        for i in range(300):
            big = "y" * rng.randrange(1, 200_000)  # a reply that arrives in pieces
            task = asyncio.ensure_future(m.call("ECHO", f"cancelled {i} {big}"))
            for _ in range(rng.randrange(0, 4)):
                await asyncio.sleep(0)
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=0.3)
            assert done, "a cancelled call did not end"
            assert await m.call("ECHO", f"mine {i}") == f"mine {i}"

    with_mux(r, go)


def test_a_broken_connection_fails_its_calls_and_the_next_call_connects_again(r: redis.Redis) -> None:
    async def go(m: Mux) -> None:
        me = await m.call("CLIENT", "ID")
        waiting = asyncio.ensure_future(m.call("BLPOP", "mux:never", 5))
        queued = asyncio.ensure_future(m.call("ECHO", "behind it"))
        await asyncio.sleep(0.1)
        assert r.client_kill_filter(_id=me) == 1
        for fut in (waiting, queued):
            with pytest.raises(redis.exceptions.ConnectionError):
                await asyncio.wait_for(fut, 2)
        # the next call opens a new connection, logged in again (the ACL admits no one else)
        assert await m.call("ECHO", "again") == "again"
        assert await m.call("CLIENT", "ID") != me

    with_mux(r, go)


def test_a_reply_not_read_in_time_is_a_timeout_and_a_late_reply_reaches_no_one(r: redis.Redis) -> None:
    async def go(m: Mux) -> None:
        with pytest.raises(redis.exceptions.TimeoutError):
            await m.call("BLPOP", "mux:later", 1)
        await asyncio.sleep(0.1)  # Redis sees the dropped connection and frees its BLPOP
        r.rpush("mux:later", "late")  # had the old connection survived, BLPOP would take it now
        assert await m.call("ECHO", "fresh") == "fresh"
        assert await m.call("LPOP", "mux:later") == "late"

    with_mux(r, go, timeout=0.2)


def test_wrong_credentials_and_no_server_fail_cleanly(r: redis.Redis) -> None:
    async def go() -> None:
        k = r.connection_pool.connection_kwargs
        bad = Mux(host=k["host"], port=k["port"], username=k.get("username"), password="not-the-password")
        with pytest.raises(redis.exceptions.AuthenticationError):
            await bad.call("PING")
        await bad.aclose()
        anon = Mux(host=k["host"], port=k["port"])
        with pytest.raises(redis.exceptions.AuthenticationError):  # NOAUTH: the ACL admits no default user
            await anon.call("PING")
        await anon.aclose()
        gone = Mux(host="127.0.0.1", port=1, connect_timeout=0.5)
        with pytest.raises(redis.exceptions.ConnectionError):
            await gone.call("PING")
        closed = _mux(r)
        assert await closed.call("PING") in ("PONG", True)
        await closed.aclose()
        with pytest.raises(redis.exceptions.ConnectionError):
            await closed.call("PING")

    run(go)


def test_of_takes_the_clients_server_and_credentials(r: redis.Redis) -> None:
    k = r.connection_pool.connection_kwargs
    url = f"redis://{k.get('username')}:{k.get('password')}@{k['host']}:{k['port']}/0"

    async def go() -> None:
        client = aredis.from_url(url, decode_responses=True)
        raw = aredis.from_url(url)
        try:
            m = Mux.of(client)
            assert m is not None
            assert await m.call("ECHO", "text") == "text"
            await m.aclose()
            b = Mux.of(raw)
            assert b is not None
            assert await b.call("ECHO", "bytes") == b"bytes"  # as the client would answer
            await b.aclose()
            tls = aredis.from_url(url.replace("redis://", "rediss://"))
            assert Mux.of(tls) is None  # TLS stays with redis-py
        finally:
            await client.aclose()
            await raw.aclose()

    run(go)
