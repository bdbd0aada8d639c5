"""Latencies one person feels: send -> turn.start, Lead -> lead.applied, queue hand-off.

Clocks: "client" figures are the bench's ``perf_counter`` (µs resolution) from just before the
request is written to the reply or the event's arrival on the SSE stream; "server" figures use
the events' ``ts`` (ms, Redis ``TIME``), against the client's wall clock where one end is a
client action (same machine, same clock; resolution 1 ms, so a server figure may read 1 ms
early or late). All sends here go to an idle system, one at a time.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from . import session
from .client import Pool, Watch
from .stack import Stack
from .stats import summary
from .sweep import handoff_gaps, handoff_seen_gaps

TIMEOUT_S = 60.0
LEAD_STEPS = 400
LEAD_MODEL_MS = 20
"""The model's time a response in the lead phase's second part: a Lead then lands while it answers."""


async def _watches(stack: Stack, sessions: list[dict[str, Any]]) -> list[Watch]:
    return [await Watch(stack.port, stack.token, s["id"]).start() for s in sessions]


async def _close(watches: list[Watch]) -> None:
    for w in watches:
        await w.close()


async def send_to_start(stack: Stack, pool: Pool, n: int, k: int) -> dict[str, Any]:
    """``n`` sends (no script: a one-line echo turn), round robin over ``k`` idle sessions."""
    sessions = await session.create(pool, k, "send", title="send")
    watches = await _watches(stack, sessions)
    post, seen, server, first_output, between = [], [], [], [], []
    last_reply: float | None = None
    try:
        for i in range(k):  # warm-up: every session has had a turn
            await session.send(pool, watches[i].sid, "warm up")
        cpu0 = time.process_time()
        for i in range(n):
            w = watches[i % k]
            await w.idle(TIMEOUT_S)
            mark = len(w.events)
            t0w, t0 = time.time(), time.perf_counter()
            res = await session.send(pool, w.sid, f"ping {i}")
            t1 = time.perf_counter()
            if last_reply is not None:
                between.append((t0 - last_reply) * 1000)
            last_reply = t1
            if res["disposition"] != "started":
                raise RuntimeError(f"send to an idle session was {res['disposition']}")
            _, t2, ev = await w.wait_type("turn.start", TIMEOUT_S, mark, message_id=res["message_id"])
            post.append((t1 - t0) * 1000)
            seen.append((t2 - t0) * 1000)
            server.append(ev["ts"] - t0w * 1000)
            _, _, msg = await w.wait_type("assistant.msg", TIMEOUT_S, mark, turn_id=ev["turn_id"])
            first_output.append(msg["ts"] - ev["ts"])
            await w.idle(TIMEOUT_S)
        client_cpu = time.process_time() - cpu0
    finally:
        await _close(watches)
    return {
        "n": n, "sessions": k,
        "post_to_202_ms": summary(post), "post_to_turn_start_seen_ms": summary(seen),
        "post_to_turn_start_ts_ms": summary(server), "turn_start_to_first_output_ts_ms": summary(first_output),
        "between_ms": summary(between), "client_cpu_ms_per_send": round(client_cpu / n * 1000, 3),
    }


async def lead_applied(stack: Stack, pool: Pool, n: int, k: int = 4, delay_ms: int = 0) -> dict[str, Any]:
    """A Lead posted while a turn walks through boundaries (one list_dir per model response).
    ``delay_ms``: each response's generation time; with one longer than a step's own work the Lead
    mostly lands while the model answers (its boundary is the one after the response, as with a
    real model), with 0 while a call's record is on its way (the boundary after the call)."""
    sessions = await session.create(pool, k, f"lead{delay_ms or ''}", title="lead")
    for j in range(LEAD_STEPS):  # every session shares the workspace
        (Path(sessions[0]["workspace"]) / f"d{j}").mkdir(exist_ok=True)
    timing = {"delay_ms": delay_ms} if delay_ms else {}
    steps = [{**timing, "tools": [{"name": "list_dir", "args": {"path": f"d{j}"}}]} for j in range(LEAD_STEPS)]
    work = session.script(steps, text="walk the folders")
    watches = await _watches(stack, sessions)
    post, seen, server, step_gap, boundary = [], [], [], [], []
    refused: dict[str, int] = {}
    try:
        for i in range(n):
            w = watches[i % k]
            await w.idle(TIMEOUT_S)
            mark = len(w.events)
            res = await session.send(pool, w.sid, work)
            _, _, start = await w.wait_type("turn.start", TIMEOUT_S, mark, message_id=res["message_id"])
            tid = start["turn_id"]
            await w.wait_type("tool.result", TIMEOUT_S, mark, turn_id=tid)
            t0 = time.perf_counter()
            status, body = await pool.post(f"/v1/sessions/{w.sid}/lead",
                                           {"text": session.script([{"text": "lead taken"}], text=f"lead {i}")})
            t1 = time.perf_counter()
            if status != 202:
                key = str(body.get("error") if isinstance(body, dict) else status)
                refused[key] = refused.get(key, 0) + 1
                await _stop_turn(pool, w)
                continue
            lid = body["lead_id"]
            def is_applied(e: dict[str, Any], lid: str = lid) -> bool:
                return e.get("type") == "lead.applied" and lid in e["lead_ids"]

            at, t2, applied = await w.wait(is_applied, TIMEOUT_S, mark)
            _, _, saved = await w.wait_type("lead.saved", TIMEOUT_S, mark, lead_id=lid)
            post.append((t1 - t0) * 1000)
            seen.append((t2 - t0) * 1000)
            server.append(applied["ts"] - saved["ts"])
            if (t_boundary := boundary_seen(w.events, at)) is not None:
                boundary.append((t2 - t_boundary) * 1000)
            await w.idle(TIMEOUT_S)
            results = [e["ts"] for _, e in w.events[mark:] if e.get("type") == "tool.result" and e.get("turn_id") == tid]
            if len(results) > 1:
                step_gap.append((results[-1] - results[0]) / (len(results) - 1))
    finally:
        await _close(watches)
    return {
        "n": len(post), "refused": refused,
        "post_to_202_ms": summary(post), "post_to_lead_applied_seen_ms": summary(seen),
        "lead_saved_to_applied_ts_ms": summary(server),
        "boundary_interval_ts_ms": summary(step_gap),
        "boundary_to_lead_applied_seen_ms": summary(boundary),
    }


APPLYING = frozenset({"tool.skipped", "user.msg", "lead.applied"})
"""What a Lead's application records at a boundary: the calls not started, skipped; the Lead as
a user message; ``lead.applied``."""


def boundary_seen(events: list[tuple[float, dict[str, Any]]], applied_at: int) -> float | None:
    """When the stream brought the event that ended the action in flight as the Lead was applied
    (the call's result, or the response at the boundary after it), or None if the log does not
    show one right before the application."""
    j = applied_at - 1
    while j >= 0 and events[j][1].get("type") in APPLYING:
        j -= 1
    if j < 0 or events[j][1].get("type") not in ("tool.result", "assistant.msg"):
        return None
    return events[j][0]


async def _stop_turn(pool: Pool, w: Watch) -> None:
    await pool.post(f"/v1/sessions/{w.sid}/stop", {})
    await w.idle(TIMEOUT_S)


async def handoff(stack: Stack, pool: Pool, rounds: int, queued: int = 5, k: int = 10) -> dict[str, Any]:
    """turn.end -> the next queued turn's start, and -> its first model output (zero-delay model)."""
    k = max(1, min(k, rounds))
    sessions = await session.create(pool, k, "handoff", title="handoff")
    watches = await _watches(stack, sessions)
    not_queued = 0
    seen: list[float] = []
    try:
        for r in range(rounds):
            w = watches[r % k]
            await w.idle(TIMEOUT_S)
            await session.send(pool, w.sid, session.script([{"text": "first", "delay_ms": 40}]), mode="queue")
            for j in range(queued):
                res = await session.send(pool, w.sid, session.script([{"text": f"queued {j}"}]), mode="queue")
                not_queued += res["disposition"] != "queued"
            await w.idle(TIMEOUT_S)
        for w in watches:
            seen += handoff_seen_gaps(w.events)
    finally:
        await _close(watches)
    logs = await session.all_events(pool, [s["id"] for s in sessions])
    to_start, to_output = [], []
    for evs in logs.values():
        a, b = handoff_gaps(evs)
        to_start += a
        to_output += b
    return {
        "n": len(to_start), "not_queued": not_queued,
        "turn_end_to_next_turn_start_ts_ms": summary(to_start),
        "turn_end_to_next_first_output_ts_ms": summary(to_output),
        "turn_end_to_next_first_output_seen_ms": summary(seen),
    }
