"""Where a latency's wall time goes: every Redis command and NATS message in a window.

A CPU profile (``profile.py``) cannot show time spent waiting (a sleep, a round trip). For
that, the bench records, while one small workload runs on an otherwise idle stack, every
command Redis executes (``MONITOR``, top-level commands only: a function's inner calls are
counted, not listed) and every NATS message (a subscriber on ``>``: requests, replies,
JetStream API calls and publishes), each with its time. ``timeline`` then lists what happened
between two events of the log, with the gaps between steps; a gap with nothing on the wire is
time spent inside a process (CPU, or a sleep).

MONITOR slows Redis down; it runs only here, never while a figure is measured.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import nats
import psutil
import redis.asyncio as aioredis


def redis_clients(procs: dict[str, psutil.Process], redis_port: int) -> dict[str, str]:
    """Local port of each process's Redis connections -> the process's name."""
    out = {}
    for name, p in procs.items():
        with contextlib.suppress(psutil.Error):
            for c in p.net_connections(kind="tcp"):
                if c.raddr and c.raddr.port == redis_port:
                    out[str(c.laddr.port)] = name
    return out


class Recorder:
    def __init__(self, redis_url: str, nats_url: str, port_names: dict[str, str] | None = None) -> None:
        self.redis_url, self.nats_url = redis_url, nats_url
        self.records: list[tuple[float, str, str]] = []
        self.lua_calls = 0
        self.port_names = port_names or {}
        self.ignore_ports: set[str] = set()

    async def run(self, work: Callable[[], Awaitable[Any]]) -> Any:
        r = aioredis.Redis.from_url(self.redis_url, decode_responses=True)
        nc = await nats.connect(self.nats_url)

        async def on_msg(msg: Any) -> None:
            self.records.append((time.time(), "nats", f"{msg.subject} {len(msg.data)}B"))

        sub = await nc.subscribe(">", cb=on_msg)
        await nc.flush()
        ready = asyncio.Event()

        async def monitor() -> None:
            async with r.monitor() as m:
                ready.set()
                while True:
                    cmd = await m.next_command()
                    if cmd.get("client_type") == "lua":
                        self.lua_calls += 1
                        continue
                    port = str(cmd.get("client_port"))
                    if port in self.ignore_ports:
                        continue
                    self.records.append((float(cmd["time"]), f"redis<{port}", str(cmd["command"])[:150]))

        task = asyncio.create_task(monitor())
        try:
            await asyncio.wait_for(ready.wait(), 10)
            await asyncio.sleep(0.2)
            return await work()
        finally:
            await asyncio.sleep(0.3)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            await sub.unsubscribe()
            await nc.drain()
            await r.aclose()

    def timeline(self, t_from: float, t_to: float, drop: tuple[str, ...] = ()) -> list[str]:
        """What happened in [t_from, t_to] (seconds), as lines ``+ms (gap ms) source what``."""
        rows = sorted(r for r in self.records if t_from <= r[0] <= t_to and not any(d in r[2] for d in drop))
        out, last = [], t_from
        for t, src, what in rows:
            if src.startswith("redis<"):
                src = "redis<" + self.port_names.get(src[6:], src[6:])
            out.append(f"+{(t - t_from) * 1000:7.2f} ms (gap {(t - last) * 1000:6.2f}) {src:12} {what}")
            last = t
        out.append(f"+{(t_to - t_from) * 1000:7.2f} ms (gap {(t_to - last) * 1000:6.2f}) end of window")
        return out
