"""Wire timelines of one send, one queue hand-off, one tool call and one Lead (``trace.py``).

One session on the otherwise idle stack does each once while every Redis command and NATS
message is recorded; the timelines are cut from the event log's ts (whole ms, so a window is
widened to the enclosing milliseconds) or the client's wall clock around a request.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from coxswain import keys

from . import session
from .client import Pool
from .stack import Stack
from .trace import Recorder, redis_clients

CALLS = 20
LEAD_STEPS = 200


async def _idle(r: aioredis.Redis, sid: str, timeout: float = 60.0) -> None:
    base = keys.session(sid)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        busy, queued = await r.hget(base, "busy"), await r.llen(base + keys.QUEUE)
        if busy == "0" and queued == 0:
            return
        await asyncio.sleep(0.02)
    raise TimeoutError(f"session {sid} still busy after {timeout}s")


async def _seq_at_least(r: aioredis.Redis, sid: str, seq: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if int(await r.hget(keys.session(sid), "seq") or 0) >= seq:
            return
        await asyncio.sleep(0.002)
    raise TimeoutError(f"session {sid} did not reach seq {seq}")


async def record(stack: Stack, pool: Pool) -> dict[str, Any]:
    s = (await session.create(pool, 1, "trace", title="trace"))[0]
    sid = s["id"]
    for j in range(max(CALLS, LEAD_STEPS)):
        (Path(s["workspace"]) / f"d{j}").mkdir(exist_ok=True)
    url = stack.servers.redis.admin_url
    rec = Recorder(url, stack.servers.nats.admin_url, redis_clients(stack.all_procs(), stack.servers.redis.port))
    poll = aioredis.Redis.from_url(url, decode_responses=True, single_connection_client=True)
    rec.ignore_ports.add(str((await poll.client_info())["addr"]).rsplit(":", 1)[1])
    marks: dict[str, tuple[float, float]] = {}

    async def work() -> None:
        t0 = time.time()
        await session.send(pool, sid, "trace ping")
        marks["send"] = (t0, time.time())
        await _idle(poll, sid)
        await session.send(pool, sid, session.script([{"text": "first", "delay_ms": 40}]), mode="queue")
        for j in range(2):
            await session.send(pool, sid, session.script([{"text": f"queued {j}"}]), mode="queue")
        await _idle(poll, sid)
        calls = [{"name": "list_dir", "args": {"path": f"d{k}"}} for k in range(CALLS)]
        await session.send(pool, sid, session.script([{"tools": calls}, {"text": "done"}]))
        await _idle(poll, sid)
        seq = int(await poll.hget(keys.session(sid), "seq") or 0)
        walk = [{"tools": [{"name": "list_dir", "args": {"path": f"d{j}"}}]} for j in range(LEAD_STEPS)]
        await session.send(pool, sid, session.script(walk, text="walk"))
        await _seq_at_least(poll, sid, seq + 12)  # the turn is a few steps in
        t0 = time.time()
        status, body = await pool.post(f"/v1/sessions/{sid}/lead",
                                       {"text": session.script([{"text": "lead taken"}], text="lead")})
        marks["lead"] = (t0, time.time())
        if status != 202:
            raise RuntimeError(f"lead answered {status}: {body!r}")
        await _idle(poll, sid)

    try:
        await rec.run(work)
        rec.port_names.update(redis_clients(stack.all_procs(), stack.servers.redis.port))
    finally:
        await poll.aclose()
    evs = await session.events(pool, sid)
    out: dict[str, Any] = {"lua_calls_seen": rec.lua_calls}

    def cut(name: str, t_from: float, t_to: float, what: str) -> None:
        out[name] = {"what": what, "window_ms": round((t_to - t_from) * 1000, 2),
                     "lines": rec.timeline(t_from, t_to)}

    t0, t1 = marks["send"]
    cut("send", t0, t1, "client POST /messages -> 202 (client wall clock)")
    queued = {e["message_id"] for e in evs if e["type"] == "queue.added"}
    last_end: dict[str, Any] | None = None
    for e in evs:
        if e["type"] == "turn.end":
            last_end = e
        elif e["type"] == "turn.start" and last_end is not None and e["message_id"] in queued:
            first = next((x for x in evs if x["type"] == "assistant.msg" and x.get("turn_id") == e["turn_id"]), None)
            if first is not None:
                cut("handoff", (last_end["ts"] - 1) / 1000, (first["ts"] + 1) / 1000,
                    "turn.end -> the next queued turn's first output (assistant.msg); ts in whole ms, so the "
                    "window opens 1 ms early")
            break
    tcalls = [e for e in evs if e["type"] == "tool.call" and e["args"].get("path") in ("d10", "d11")]
    if len(tcalls) >= 2:
        cut("tool_call", (tcalls[0]["ts"] - 1) / 1000, (tcalls[1]["ts"] + 1) / 1000,
            "tool.call #10 -> tool.call #11 of a 20-call response; the window opens 1 ms early")
    applied = next((e for e in evs if e["type"] == "lead.applied"), None)
    if applied:
        cut("lead", marks["lead"][0], (applied["ts"] + 1) / 1000, "client POST /lead -> lead.applied ts")
    return out
