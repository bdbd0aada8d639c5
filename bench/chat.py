"""A person's chat: each message sent when the last turn has ended, so the session is idle
between turns and every turn is a drive of its own (the sweep's messages are queued: one drive
carries the transcript from turn to turn, and this cost never shows there).

``sessions`` sessions each take ``turns`` turns of one ``list_dir`` round (a response with a call,
its result, an answer: the log grows by ~12 events a turn), a round at a time: one message to
every session, then every turn's end. The CPU of every stack process is metered over the first
``window`` rounds and over the last ``window``: a turn's start whose cost grows with the
session's length (the whole log read and rebuilt at every turn start, before the runner kept
transcripts) shows as the late window's CPU per turn over the early one's, which should be ~1.
"""

from __future__ import annotations

import asyncio
from typing import Any

from . import session
from .client import Pool, Watch
from .stack import CpuMeter, Stack

TIMEOUT_S = 60.0


def _script(r: int) -> str:
    return session.script([{"tools": [{"name": "list_dir", "args": {"path": "."}}]}, {"text": f"answer {r}"}],
                          text=f"chat turn {r}")


async def turn_cost(stack: Stack, pool: Pool, sessions: int, turns: int, window: int) -> dict[str, Any]:
    window = max(1, min(window, turns // 2))
    made = await session.create(pool, sessions, "chat", title="chat")
    watches = [await Watch(stack.port, stack.token, s["id"]).start() for s in made]
    meters: dict[str, CpuMeter] = {}
    try:
        for r in range(turns):
            if r in (0, turns - window):
                meters["early" if r == 0 else "late"] = CpuMeter(stack.all_procs()).start()
            marks = [len(w.events) for w in watches]
            await asyncio.gather(*(session.send(pool, w.sid, _script(r)) for w in watches))
            await asyncio.gather(*(w.wait(lambda e: e["type"] == "turn.end", TIMEOUT_S, start=m)
                                   for w, m in zip(watches, marks, strict=True)))
            if r == window - 1:
                meters["early"].stop()
            if r == turns - 1:
                meters["late"].stop()
    finally:
        for w in watches:
            await w.close()
    per = window * sessions

    def ms(m: CpuMeter, only: str = "") -> float:
        return round(sum(v for k, v in m.spent.items() if k.startswith(only)) / per * 1000, 2)

    early, late = meters["early"], meters["late"]
    return {
        "sessions": sessions, "turns": turns, "window": window,
        "events_per_session": round(sum(len(w.events) for w in watches) / sessions),
        "early_cpu_ms_per_turn": ms(early), "late_cpu_ms_per_turn": ms(late),
        "early_runner_cpu_ms_per_turn": ms(early, "turn-runner"), "late_runner_cpu_ms_per_turn": ms(late, "turn-runner"),
        "late_cpu_s_by_process": late.spent,
    }
