"""Memory: RSS of every process after N idle sessions, and what one session costs in Redis.

Sessions are created through the API (at most 32 requests in flight) on a fresh stack. Then:
RSS per process before/after; Redis ``used_memory`` delta / N, just created (with where those
bytes are: the transition replies, the principal index, the activity indexes) and idle (once the
transition replies expired), against a floor measured on the same server (:func:`_floor`: the
same fields in one hash and one owner-index entry per session); ``MEMORY USAGE`` of a sample of
session hashes against the bytes of their fields and values; JetStream bytes per session. A
sample of sessions then runs one short turn each, and the same is read again ("after one turn").
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import nats
import psutil
import redis.asyncio as aioredis

from coxswain import keys, subjects

from . import session
from .client import Pool
from .stack import Stack
from .sweep import wait_all_idle

SAMPLE = 200
SUFFIXES = (keys.LEASE, keys.QUEUE, keys.STEER, keys.LEADS, keys.LEAD_ORDER, keys.CLIENT_IDS, keys.APPROVALS,
            keys.OPEN_CALLS, keys.OUTBOX, keys.PUBLOCK, keys.OBSERVED, ":standing")
"""Every key a session may own beside its hash (coxswain/keys.py; ``:standing`` from the runner)."""


def _mb(stack: Stack, read: Callable[[psutil.Process], int]) -> dict[str, float]:
    out = {}
    for name, p in stack.all_procs().items():
        try:
            out[name] = round(read(p) / 2**20, 1)
        except Exception:  # noqa: BLE001 - a process that went away reads as absent
            continue
    return out


def rss_mb(stack: Stack) -> dict[str, float]:
    return _mb(stack, lambda p: int(p.memory_info().rss))


def pss_mb(stack: Stack) -> dict[str, float]:
    """What each process costs with what it shares divided among the sharers: cox up's services
    are forks of one process (cox/forkserver.py), whose pages each RSS counts whole."""
    return _mb(stack, lambda p: int(p.memory_full_info().pss))


async def _redis_state(r: aioredis.Redis, sids: list[str]) -> dict[str, Any]:
    info = await r.info("memory")
    usage, raw = [], []
    for sid in sids:
        base = keys.session(sid)
        usage.append(int(await r.memory_usage(base, samples=0) or 0))
        h = await r.hgetall(base)
        raw.append(sum(len(str(k)) + len(str(v)) for k, v in h.items()))
        async with r.pipeline(transaction=False) as pipe:
            for suffix in SUFFIXES:
                pipe.memory_usage(base + suffix, samples=0)
            usage[-1] += sum(int(x or 0) for x in await pipe.execute())
    return {"used_memory": int(info["used_memory"]), "dbsize": int(await r.dbsize()),
            "session_keys_bytes_mean": round(sum(usage) / max(1, len(usage)), 1),
            "session_fields_bytes_mean": round(sum(raw) / max(1, len(raw)), 1)}


async def _js_bytes(url: str) -> int:
    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().stream_info(subjects.EVENTS_STREAM)
        return int(info.state.bytes)
    finally:
        await nc.drain()


async def measure(stack: Stack, pool: Pool, n: int, log: Any) -> dict[str, Any]:
    r = aioredis.Redis.from_url(stack.servers.redis.admin_url, decode_responses=True)
    try:
        rss0 = rss_mb(stack)
        mem0 = int((await r.info("memory"))["used_memory"])
        js0 = await _js_bytes(stack.servers.nats.admin_url)
        t0 = time.perf_counter()
        sessions = await session.create(pool, n, "mem", concurrency=32, timeout=1200)
        create_s = time.perf_counter() - t0
        sids = [s["id"] for s in sessions]
        await _wait_published(r)
        await asyncio.sleep(1.0)  # let allocators settle after the burst
        rss1 = rss_mb(stack)
        pss1 = pss_mb(stack)
        sample = sids[:SAMPLE]
        red1 = await _redis_state(r, sample)
        js1 = await _js_bytes(stack.servers.nats.admin_url)
        log(f"  memory: {n} sessions in {create_s:.1f}s; redis +{(red1['used_memory'] - mem0) / n:.0f} B/session")
        parts = await _parts(r, n)
        # A transition's reply (``:tx:``, kept TX_KEEP_MS for a retry whose reply was lost) is
        # per call, not per session: the idle figure is read once they have expired.
        expired_s = await _wait_tx_expired(r, keys.TX_KEEP_MS / 1000 + 30)
        idle_mem = int((await r.info("memory"))["used_memory"])
        floor = await _floor(r, sids)
        log(f"  memory: idle (replies expired after {expired_s:.0f}s) +{(idle_mem - mem0) / n:.0f} B/session; "
            f"bare floor {floor:.0f} B")
        turned = sample[:100]
        for sid in turned:
            await session.send(pool, sid, "hello")
        await wait_all_idle(stack.servers.redis.admin_url, turned, 120)
        await _wait_published(r)
        red2 = await _redis_state(r, turned)
        js2 = await _js_bytes(stack.servers.nats.admin_url)
    finally:
        await r.aclose()
    return {
        "sessions": n, "create_per_s": round(n / create_s, 1),
        "rss_mb_before": rss0, "rss_mb_after": rss1, "pss_mb_after": pss1,
        "rss_kb_per_session": {k: round((rss1[k] - rss0.get(k, 0)) * 1024 / n, 3) for k in rss1},
        "redis_bytes_per_session": round((red1["used_memory"] - mem0) / n, 1),
        "redis_idle_bytes_per_session": round((idle_mem - mem0) / n, 1),
        "redis_floor_bytes_per_session": round(floor, 1),
        "redis_parts_bytes_per_session": parts,
        "redis_session_keys_bytes": red1["session_keys_bytes_mean"],
        "redis_session_fields_bytes": red1["session_fields_bytes_mean"],
        "jetstream_bytes_per_session": round((js1 - js0) / n, 1),
        "after_one_turn": {"sessions": len(turned), "redis_session_keys_bytes": red2["session_keys_bytes_mean"],
                           "redis_session_fields_bytes": red2["session_fields_bytes_mean"],
                           "jetstream_bytes_per_turn": round((js2 - js1) / len(turned), 1)},
    }


async def _tx_keys(r: aioredis.Redis) -> list[str]:
    """Every transition reply kept (``<session key>:tx:<id>``, keys.TX)."""
    return [k async for k in r.scan_iter(match=f"cox:s:*{keys.TX}*", count=1000)]


async def _parts(r: aioredis.Redis, n: int) -> dict[str, float]:
    """Where a just-created session's bytes are, per session (``MEMORY USAGE``, exact): the
    transition replies, the principal index and the buckets' activity indexes."""
    tx = await _tx_keys(r)
    principals = [k async for k in r.scan_iter(match="cox:p:*", count=1000) if not k.endswith(":spend")]
    active = [keys.active(b) for b in range(keys.buckets())]

    async def usage(names: list[str]) -> int:
        total = 0
        for i in range(0, len(names), 500):
            async with r.pipeline(transaction=False) as pipe:
                for k in names[i:i + 500]:
                    pipe.memory_usage(k, samples=0)
                total += sum(int(x or 0) for x in await pipe.execute())
        return total

    return {"tx_replies": round(await usage(tx) / n, 1), "tx_keys_per_session": round(len(tx) / n, 2),
            "principal_index": round(await usage(principals) / n, 1),
            "active_indexes": round(await usage(active) / n, 1)}


async def _wait_tx_expired(r: aioredis.Redis, timeout: float) -> float:
    """Until no transition reply is left (they expire TX_KEEP_MS after their call); seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if not await _tx_keys(r):
            break
        await asyncio.sleep(2.0)
    await asyncio.sleep(1.0)  # the allocator's frees settle
    return time.monotonic() - t0


async def _floor(r: aioredis.Redis, sids: list[str]) -> float:
    """Bytes per session of the least a Redis store of these sessions holds, measured on the same
    server: each session's fields and values (its own, read back) in one hash, under a key as
    long as ours, and one entry (sid -> created) in one owner index, as its owner's listing
    needs. Redis picks the encodings (a listpack hash; a skiplist index past 128 entries), as it
    does for ours. Written, measured by ``used_memory``, deleted."""
    before = int((await r.info("memory"))["used_memory"])
    prefix = "cox:f:"  # the same length as the sessions' "cox:s:"
    written: list[str] = []
    for i in range(0, len(sids), 500):
        chunk = sids[i:i + 500]
        async with r.pipeline(transaction=False) as pipe:
            for sid in chunk:
                pipe.hgetall(keys.session(sid))
            hashes = await pipe.execute()
        async with r.pipeline(transaction=False) as pipe:
            for sid, h in zip(chunk, hashes, strict=True):
                if not h:
                    continue
                k = keys.session(sid).replace("cox:s:", prefix, 1)
                pipe.hset(k, mapping=h)
                pipe.zadd(prefix + "owner", {sid: int(h.get("created", 0))})
                written.append(k)
            await pipe.execute()
    await asyncio.sleep(0.5)
    after = int((await r.info("memory"))["used_memory"])
    for i in range(0, len(written), 500):
        await r.unlink(*written[i:i + 500])
    await r.unlink(prefix + "owner")
    return (after - before) / max(1, len(written))


async def _wait_published(r: aioredis.Redis, timeout: float = 120.0) -> None:
    """Until no outbox waits to be published (the dirty index is empty)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and await _dirty(r) > 0:
        await asyncio.sleep(0.1)


async def _dirty(r: aioredis.Redis) -> int:
    """Sessions whose outbox waits, over every bucket's dirty index."""
    async with r.pipeline(transaction=False) as pipe:
        for b in range(keys.buckets()):
            pipe.zcard(keys.dirty(b))
        return sum(await pipe.execute())
