"""The measuring side of a floor, as its own process: ``python -m bench.floor.probe KIND ...``.

Each kind does ``--n`` sequential round trips after ``--warmup`` unmeasured ones and prints one
JSON line: the latency summary in ms, wall time, and this process's CPU per operation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import unquote, urlsplit

import uvloop

from bench.client import Pool
from bench.stats import summary

PAYLOAD = b"x" * 256
CAS = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0
"""


async def timed(n: int, warmup: int, op: Callable[[int], Awaitable[Any]], pace_ms: float = 0.0) -> dict[str, Any]:
    """``pace_ms``: a pause before each operation (not timed), for a floor made at a figure's own
    pace rather than back to back."""
    for i in range(warmup):
        await op(i)
    samples = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for i in range(n):
        if pace_ms:
            await asyncio.sleep(pace_ms / 1000)
        t0 = time.perf_counter()
        await op(i)
        samples.append((time.perf_counter() - t0) * 1000)
    wall = time.perf_counter() - wall0
    cpu = time.process_time() - cpu0
    out = {"ms": summary(samples, 4), "wall_s": round(wall, 3), "client_cpu_us": round(cpu / n * 1e6, 1)}
    return {**out, "pace_ms": pace_ms} if pace_ms else out


async def nats_rr(a: argparse.Namespace) -> dict[str, Any]:
    import nats

    nc = await nats.connect(a.nats)
    try:
        return await timed(a.n, a.warmup, lambda i: nc.request("bench.floor.rr", PAYLOAD, timeout=5))
    finally:
        await nc.drain()


async def js_publish(a: argparse.Namespace) -> dict[str, Any]:
    import nats
    from nats.js import api

    nc = await nats.connect(a.nats)
    js = nc.jetstream()
    name = "BENCHFLOOR"
    await js.add_stream(api.StreamConfig(name=name, subjects=["bench.floor.js.>"], storage=api.StorageType.FILE,
                                         duplicate_window=300.0))
    try:
        return await timed(a.n, a.warmup, lambda i: js.publish(
            "bench.floor.js.s1", PAYLOAD, timeout=5, headers={"Nats-Msg-Id": f"s1:{i}:{time.time_ns()}"}))
    finally:
        await js.delete_stream(name)
        await nc.drain()


async def handoff_chain(a: argparse.Namespace) -> dict[str, Any]:
    """A hand-off's own I/O as one chain, nothing of ours in between: the Redis script that ends
    turn A (and takes the next message), A's events published to JetStream without waiting (a
    hand-off must publish them; its next turn does not wait for the ack), the script recording
    turn B's first output, B's publish and its ack (and A's). Timed from the first script sent to
    the last ack: the operations the summed floor (2 scripts + 1 publish) adds up, measured as
    they run, one after another and on two servers that each sync to the one disk (ANALYSIS.md)."""
    import nats
    import redis.asyncio as aioredis
    from nats.js import api

    nc = await nats.connect(a.nats)
    js = nc.jetstream()
    name = "BENCHFLOORCHAIN"
    await js.add_stream(api.StreamConfig(name=name, subjects=["bench.floor.chain.>"], storage=api.StorageType.FILE,
                                         duplicate_window=300.0))
    r = aioredis.Redis.from_url(a.redis, decode_responses=True)
    sha = await r.script_load(CAS)
    await r.set("bench:floor:chain", "0")

    async def cas(k: int) -> None:
        if await r.evalsha(sha, 1, "bench:floor:chain", str(k % 2), str((k + 1) % 2)) != 1:
            raise RuntimeError("the chain's compare-and-set found another value")

    def publish(k: int) -> Awaitable[Any]:
        return js.publish("bench.floor.chain.s1", PAYLOAD, timeout=5, headers={"Nats-Msg-Id": f"c:{k}:{time.time_ns()}"})

    async def op(i: int) -> None:
        await cas(2 * i)
        a_acked = asyncio.ensure_future(publish(2 * i))
        await cas(2 * i + 1)
        await publish(2 * i + 1)
        await a_acked

    try:
        return await timed(a.n, a.warmup, op)
    finally:
        await r.delete("bench:floor:chain")
        await r.aclose()
        await js.delete_stream(name)
        await nc.drain()


async def redis_cas(a: argparse.Namespace) -> dict[str, Any]:
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(a.redis, decode_responses=True)
    sha = await r.script_load(CAS)
    await r.set("bench:floor:cas", "0")
    try:
        return await timed(a.n, a.warmup, lambda i: r.evalsha(sha, 1, "bench:floor:cas", str(i % 2), str((i + 1) % 2)))
    finally:
        await r.delete("bench:floor:cas")
        await r.aclose()


async def redis_cas_raw(a: argparse.Namespace) -> dict[str, Any]:
    """The same script over a bare socket speaking RESP: the client library's share taken out."""
    import redis.asyncio as aioredis

    r = aioredis.Redis.from_url(a.redis)
    loaded = await r.script_load(CAS)
    sha = loaded.encode() if isinstance(loaded, str) else bytes(loaded)
    await r.set("bench:floor:cas", "0")
    await r.aclose()
    url = urlsplit(a.redis)
    reader, writer = await asyncio.open_connection(url.hostname, url.port)

    def send(*args: bytes) -> None:
        writer.write(b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(x), x) for x in args))

    if url.password:  # the server admits only known users: log in first, outside the timing
        user = [unquote(url.username).encode()] if url.username else []
        send(b"AUTH", *user, unquote(url.password).encode())
        if not (await reader.readline()).startswith(b"+OK"):
            raise RuntimeError("redis refused the floor probe's AUTH")

    async def op(i: int) -> None:
        send(b"EVALSHA", sha, b"1", b"bench:floor:cas", str(i % 2).encode(), str((i + 1) % 2).encode())
        line = await reader.readline()
        if not line.startswith(b":"):
            raise RuntimeError(f"unexpected reply {line!r}")

    try:
        return await timed(a.n, a.warmup, op)
    finally:
        writer.close()


async def _posts(a: argparse.Namespace, path: str, body: dict[str, Any], token: str | None = None) -> dict[str, Any]:
    """POSTs of ``body`` to the floor app's ``path`` with the lean client (with ``token`` as its
    bearer token if given), each answered 202."""
    pool = Pool(a.port, token, size=1)

    async def op(i: int) -> None:
        status, _ = await pool.post(path, body)
        if status != 202:
            raise RuntimeError(f"floor app answered {status}")

    try:
        return await timed(a.n, a.warmup, op, a.pace_ms)
    finally:
        pool.close()


async def http_post(a: argparse.Namespace) -> dict[str, Any]:
    return await _posts(a, "/publish", {"pad": "x" * 200})


async def send_chain(a: argparse.Namespace) -> dict[str, Any]:
    """HTTP POST -> the ASGI app -> NATS request -> the responder's Redis script -> back: a send's
    path with the same hops and processes and nothing of ours in between."""
    return await _posts(a, "/chain", {"text": "ping", "pad": "x" * 100})


async def send_chain_fastapi(a: argparse.Namespace) -> dict[str, Any]:
    """The same chain through a FastAPI app written as any would write the send route (a path
    pattern, a bearer dependency, a validated body and reply: ``fastapi_app.py``)."""
    from bench.floor import fastapi_app

    return await _posts(a, "/v1/sessions/s_floor/messages", {"text": "ping", "pad": "x" * 100}, fastapi_app.TOKEN)


async def http_post_httpx(a: argparse.Namespace) -> dict[str, Any]:
    import httpx

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{a.port}") as c:
        async def op(i: int) -> None:
            r = await c.post("/publish", json={"pad": "x" * 200})
            if r.status_code != 202:
                raise RuntimeError(f"floor app answered {r.status_code}")

        return await timed(a.n, a.warmup, op)


SAMPLE_EVENT = {"seq": 41, "ts": 1764800000000, "sid": "s_1m90cgmatk3fgjygx1jr5", "turn_id": "t_1m90cgmtpz0gf047rxpwz",
                "type": "tool.call", "call_id": "call_038689a7cc9a", "name": "list_dir", "args": {"path": "d1"}}
"""A typical event of a turn (a tool call), as the services record and read it."""


async def python(a: argparse.Namespace) -> dict[str, Any]:
    """The interpreter's floor, no server: what the services' Python does for one event, in one
    process (the event validated against the events union, dumped to JSON, parsed back, and one
    pass through the event loop). Its CPU per op moves with the machine's speed at running
    Python, which the servers' floors do not measure: compared across machines, it tells how much
    of a change in our ratios is the interpreter's (bench/compare.py)."""
    from coxswain import events

    async def op(i: int) -> None:
        ev = events.EVENT.validate_python(SAMPLE_EVENT)
        json.loads(events.EVENT.dump_json(ev))
        await asyncio.sleep(0)

    return await timed(a.n, a.warmup, op)


KINDS = {"python": python, "nats_rr": nats_rr, "js_publish": js_publish, "redis_cas": redis_cas, "redis_cas_raw": redis_cas_raw,
         "handoff_chain": handoff_chain,
         "http_post": http_post, "http_post_httpx": http_post_httpx, "send_chain": send_chain,
         "send_chain_fastapi": send_chain_fastapi}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("kind", choices=sorted(KINDS))
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--nats", default="")
    p.add_argument("--redis", default="")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--pace-ms", type=float, default=0.0)
    a = p.parse_args()
    res = uvloop.run(asyncio.wait_for(KINDS[a.kind](a), 300))
    print(json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
