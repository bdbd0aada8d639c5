"""A nats-py responder: echoes every request on ``bench.floor.rr`` (the request-reply floor), and
answers ``bench.floor.chain`` after one Redis script (redis-py, the CAS of ``probe.py``): the far
end of the chained floor (``asgi_app.py``'s ``/chain``)."""

from __future__ import annotations

import argparse
import asyncio
import signal

import nats
import redis.asyncio as aioredis
import uvloop
from nats.aio.msg import Msg

from bench.floor.asgi_app import CHAIN
from bench.floor.probe import CAS

SUBJECT = "bench.floor.rr"
CHAIN_KEY = "bench:floor:chain"
CHAIN_REPLY = b'{"ok":true}'


async def main(url: str, redis_url: str) -> None:
    nc = await nats.connect(url)
    r = aioredis.Redis.from_url(redis_url, decode_responses=True)
    sha = await r.script_load(CAS)
    await r.set(CHAIN_KEY, "0")
    flip = [0]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def echo(msg: Msg) -> None:
        await msg.respond(msg.data)

    async def chain(msg: Msg) -> None:
        i = flip[0] = flip[0] + 1
        await r.evalsha(sha, 1, CHAIN_KEY, str(i % 2), str((i + 1) % 2))
        await msg.respond(CHAIN_REPLY)

    await nc.subscribe(SUBJECT, cb=echo)
    await nc.subscribe(CHAIN, cb=chain)
    await nc.flush()
    print("ready", flush=True)
    await stop.wait()
    await nc.drain()
    await r.delete(CHAIN_KEY)
    await r.aclose()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--nats", required=True)
    p.add_argument("--redis", required=True)
    a = p.parse_args()
    uvloop.run(main(a.nats, a.redis))
