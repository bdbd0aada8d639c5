"""A nats-py responder: echoes every request on ``bench.floor.rr`` (the request-reply floor)."""

from __future__ import annotations

import argparse
import asyncio
import signal

import nats
import uvloop
from nats.aio.msg import Msg

SUBJECT = "bench.floor.rr"


async def main(url: str) -> None:
    nc = await nats.connect(url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)

    async def echo(msg: Msg) -> None:
        await msg.respond(msg.data)

    await nc.subscribe(SUBJECT, cb=echo)
    await nc.flush()
    print("ready", flush=True)
    await stop.wait()
    await nc.drain()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--nats", required=True)
    uvloop.run(main(p.parse_args().nats))
