"""Per-tool-call control-plane overhead: one model response of N no-op tool calls, zero delay.

The no-op tool is ``list_dir`` of an empty folder (a different folder per call, so the progress
guard never sees the same call twice). Its own time is measured here, in this process, with the
runner's own function on the same files through ``asyncio.to_thread`` as the runner calls it.

Per call = (turn time - N x tool time) / N, the headline figure; "marginal" takes a one-call turn
of the same shape off first, so the turn's fixed cost (transcript load, two model requests,
turn end) is not spread over the calls. Reads in a row are recorded as a group (docs/design.md),
so the same N calls are also timed one per response ("per step"): each a model request, and a
record and a publish of its own (the response goes with its read's record). Turn time is server-side (turn.start -> turn.end ts).
The event ts also split each call: tool.call -> policy.decision (guard), policy.decision ->
tool.result (tool + its record), tool.result -> next tool.call (loop). A read that guard allows
records its call, decision and result in one call (their ts are equal), so for ``list_dir`` the
guard and tool parts read 0 and the whole call shows as the loop's part.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from cox_runner.workspace import tools

from . import session
from .client import Pool, Watch
from .stack import Stack
from .stats import summary

TIMEOUT_S = 120.0


def _steps(n: int, apart: bool = False) -> list[dict[str, Any]]:
    """One response of ``n`` calls, or (``apart``) ``n`` responses of one call each."""
    calls = [{"name": "list_dir", "args": {"path": f"d{k:04d}"}} for k in range(n)]
    if apart:
        return [*({"tools": [c]} for c in calls), {"text": "done"}]
    return [{"tools": calls}, {"text": "done"}]


async def tool_time_ms(ws: Path, n: int) -> float:
    """Mean time of the runner's list_dir on these folders, as the runner runs it (a thread)."""
    for k in range(min(n, 20)):
        await asyncio.to_thread(tools.list_dir, ws, f"d{k:04d}")
    t0 = time.perf_counter()
    for k in range(n):
        await asyncio.to_thread(tools.list_dir, ws, f"d{k:04d}")
    return (time.perf_counter() - t0) * 1000 / n


async def _turn(pool: Pool, w: Watch, n: int, apart: bool = False) -> dict[str, Any]:
    await w.idle(TIMEOUT_S)
    mark = len(w.events)
    t0 = time.perf_counter()
    res = await session.send(pool, w.sid, session.script(_steps(n, apart), text=f"{n} calls"))
    _, _, start = await w.wait_type("turn.start", TIMEOUT_S, mark, message_id=res["message_id"])
    tid = start["turn_id"]
    _, t_end, end = await w.wait_type("turn.end", TIMEOUT_S, mark, turn_id=tid)
    client_ms = (t_end - t0) * 1000
    evs = [e for _, e in w.events[mark:] if e.get("turn_id") == tid]
    by_call: dict[str, dict[str, int]] = {}
    order: list[str] = []
    for e in evs:
        cid = e.get("call_id")
        if cid and e["type"] in ("tool.call", "policy.decision", "tool.result"):
            if cid not in by_call:
                order.append(cid)
            by_call.setdefault(cid, {})[e["type"]] = e["ts"]
    guard, tool, loop = [], [], []
    for i, cid in enumerate(order):
        c = by_call[cid]
        guard.append(c["policy.decision"] - c["tool.call"])
        tool.append(c["tool.result"] - c["policy.decision"])
        if i + 1 < len(order):
            loop.append(by_call[order[i + 1]]["tool.call"] - c["tool.result"])
    ok = sum(1 for e in evs if e["type"] == "tool.result" and e.get("ok"))
    return {"calls": n, "ok": ok, "outcome": end.get("outcome"), "server_ms": end["ts"] - start["ts"],
            "client_ms": client_ms, "events": len(evs),
            "split_ts_ms_mean": {"guard": _mean(guard), "tool_and_record": _mean(tool), "loop": _mean(loop)}}


def _mean(xs: list[int]) -> float:
    return round(sum(xs) / len(xs), 3) if xs else 0.0


async def per_call(stack: Stack, pool: Pool, n: int, turns: int,
                   during: Callable[[Callable[[], Awaitable[Any]]], Awaitable[Any]] | None = None) -> dict[str, Any]:
    """``turns`` rounds of (a one-call turn, an ``n``-call turn). ``during`` wraps an extra
    unmeasured ``n``-call turn (the profiler attaches there)."""
    s = (await session.create(pool, 1, "tools", title="tools"))[0]
    ws = Path(s["workspace"])
    for k in range(n):
        (ws / f"d{k:04d}").mkdir(exist_ok=True)
    tool_ms = await tool_time_ms(ws, n)
    w = await Watch(stack.port, stack.token, s["id"]).start()
    big, small, apart = [], [], []
    try:
        await _turn(pool, w, 1)  # warm-up
        for _ in range(turns):
            small.append(await _turn(pool, w, 1))
            big.append(await _turn(pool, w, n))
            apart.append(await _turn(pool, w, n, apart=True))
        profiled = None
        if during is not None:
            profiled = await during(lambda: _turn(pool, w, n))
    finally:
        await w.close()
    t_big = sorted(r["server_ms"] for r in big)[len(big) // 2]
    t_small = sorted(r["server_ms"] for r in small)[len(small) // 2]
    t_apart = sorted(r["server_ms"] for r in apart)[len(apart) // 2]
    per = (t_big - n * tool_ms) / n
    marginal = ((t_big - t_small) - (n - 1) * tool_ms) / (n - 1)
    return {
        "calls": n, "turns": turns, "tool_ms": round(tool_ms, 4),
        "turn_ms_median": t_big, "one_call_turn_ms_median": t_small,
        "per_call_ms": round(per, 3), "marginal_per_call_ms": round(marginal, 3),
        "apart_turn_ms_median": t_apart, "per_step_ms": round((t_apart - n * tool_ms) / n, 3),
        "apart_all_ok": all(r["ok"] == n and r["outcome"] == "completed" for r in apart),
        "client_turn_ms": summary(r["client_ms"] for r in big),
        "all_ok": all(r["ok"] == n and r["outcome"] == "completed" for r in big),
        "split_ts_ms_mean": big[len(big) // 2]["split_ts_ms_mean"],
        "events_per_call": round(big[0]["events"] / n, 2),
        "profiled_turn": profiled,
    }
