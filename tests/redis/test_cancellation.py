"""A task cancelled while it talks to Redis is cancelled: Stop, steer and a lost lease all end
work by cancelling a task, and a cancellation the client swallows lets that work go on.

Seen in CI: a steered turn streamed the rest of its answer (a minute) after the steer, because
the cancellation reached redis-py as it wrote a delta's ``cox_emit``. redis-py writes every
command under ``asyncio.wait_for(write, socket_timeout)``, and on Python 3.11 ``wait_for`` returns
the write's result instead of raising when the cancellation lands as the write completes
(CPython gh-86296, fixed in 3.12); :mod:`coxswain.redisfix` gives it 3.12's semantics.
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import redis

from cox.servers import NatsServer
from coxswain import logs
from coxswain.service import connect_nats, connect_redis

TRIES = 300


async def _missed(loop_calls: Any) -> int:
    """Cancel a task running ``loop_calls()`` at random points, TRIES times; how many of the
    cancellations did not take within 0.3 s."""
    rng = random.Random(7)
    missed = 0
    for _ in range(TRIES):
        task = asyncio.ensure_future(loop_calls())
        await asyncio.sleep(rng.random() * 0.002)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=0.3)
        if not done:
            missed += 1
            while not task.done():  # ended for the count's sake (each cancel is a new try)
                task.cancel()
                await asyncio.wait({task}, timeout=0.05)
    return missed


def test_a_task_cancelled_mid_redis_command_is_cancelled(r: redis.Redis) -> None:
    """Every cancellation drops the connection it hit, so many land while the next command
    connects again (AUTH, HELLO, a health check: each a write under ``wait_for``)."""
    kw = r.connection_pool.connection_kwargs

    async def go() -> int:
        client: Any = await connect_redis(f"redis://{kw['host']}:{kw['port']}/0", logs.get("test"),
                                          password=kw.get("password"))

        async def loop_calls() -> None:
            while True:
                await client.eval("return redis.call('INCR', KEYS[1])", 1, "cancel:counter")

        try:
            return await _missed(loop_calls)
        finally:
            await client.aclose()

    missed = asyncio.run(go())
    assert missed == 0, f"{missed} of {TRIES} cancellations were swallowed: the task went on"


def test_a_task_cancelled_mid_nats_request_is_cancelled(tmp_path: Path) -> None:
    """A guard check, a judge's decision and a doorbell's ask are NATS requests (``wait_for``
    on the reply): a cancellation that lands as the reply does must not be traded for it."""

    async def go(url: str) -> int:
        nc = await connect_nats(url, "cancel-test", logs.get("test"))

        async def echo(msg: Any) -> None:
            await msg.respond(b"ok")

        await nc.subscribe("cancel.echo", cb=echo)

        async def loop_calls() -> None:
            while True:
                await nc.request("cancel.echo", b"hi", timeout=5)

        try:
            return await _missed(loop_calls)
        finally:
            await nc.close()

    with NatsServer(tmp_path / "nats") as ns:
        missed = asyncio.run(go(ns.admin_url))
    assert missed == 0, f"{missed} of {TRIES} cancellations were swallowed: the task went on"
