"""Small helpers over the v1 API for the scenarios: scripts, bounded session creation, event logs."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any, TypeVar

from .client import Pool

T = TypeVar("T")


def script(steps: list[dict[str, Any]], text: str = "bench") -> str:
    """A message for the built-in ``script`` model (docs/api.md)."""
    return f"{text}\n```script\n{json.dumps(steps)}\n```"


async def create(pool: Pool, n: int, workspace: str, title: str | None = None, concurrency: int = 16,
                 timeout: float = 600.0) -> list[dict[str, Any]]:
    """``n`` sessions, at most ``concurrency`` requests in flight."""
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> dict[str, Any]:
        body: dict[str, Any] = {"workspace": workspace}
        if title:
            body["title"] = f"{title} {i}"
        async with sem:
            status, s = await pool.post("/v1/sessions", body)
        if status != 201:
            raise RuntimeError(f"create answered {status}: {s!r}")
        return dict(s)

    return await gather_all([one(i) for i in range(n)], timeout)


async def send(pool: Pool, sid: str, text: str, mode: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"text": text}
    if mode:
        body["mode"] = mode
    status, res = await pool.post(f"/v1/sessions/{sid}/messages", body)
    if status != 202:
        raise RuntimeError(f"send answered {status}: {res!r}")
    return dict(res)


async def events(pool: Pool, sid: str) -> list[dict[str, Any]]:
    """The session's whole event log (JSON reads, resumed by seq until empty)."""
    out: list[dict[str, Any]] = []
    for _ in range(1000):
        after = out[-1]["seq"] if out else 0
        status, batch = await pool.get(f"/v1/sessions/{sid}/events?format=json&after={after}&limit=10000")
        if status != 200:
            raise RuntimeError(f"events answered {status}: {batch!r}")
        if not batch:
            return out
        out.extend(batch)
    return out


async def all_events(pool: Pool, sids: list[str], concurrency: int = 8) -> dict[str, list[dict[str, Any]]]:
    sem = asyncio.Semaphore(concurrency)

    async def one(sid: str) -> tuple[str, list[dict[str, Any]]]:
        async with sem:
            return sid, await events(pool, sid)

    return dict(await gather_all([one(s) for s in sids], 600.0))


async def gather_all(coros: list[Coroutine[Any, Any, T]], timeout: float) -> list[T]:
    """Run all; the first failure (or the timeout) cancels the rest and is raised."""
    try:
        async with asyncio.timeout(timeout), asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(c) for c in coros]
    except ExceptionGroup as eg:
        raise eg.exceptions[0] from eg
    return [t.result() for t in tasks]
