"""Our side of every peer's comparison, measured once per bench run whatever the peers.

A fresh two-runner stack and the script ``[list_dir] + 2 x [5 ms, list_dir] + [5 ms, "done"]``:
three tool rounds and 15 ms of sleeping, as the peers' three 5 ms tool steps.

- warm-up: a load that is not measured (``sweep.warm_up``), as every peer gets one.
- queue: S sessions x 5 messages in ``mode=queue`` (the sweep's load): turns/s, hand-off, queue
  wait, CPU per turn of every stack process, the verdict from the event log. Repeated on fresh
  sessions until at least ``sweep.MIN_TURNS`` turns, as the sweep's points: the CPU of a process
  is read in 10 ms ticks, and S=10 once over is 50 turns in ~0.3 s, where the ticks of nine
  processes moved CPU per turn by a tenth from run to run (a peer's S=10 runs take seconds).
- steer: a long turn going, then a message with ``mode=steer``: latency from the POST to the new
  turn's start, the old turn stopped, no overlap in the event log.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from .. import session, verdict
from ..client import Pool, Watch
from ..profiles import Counts
from ..stack import Stack
from ..stats import summary
from ..sweep import load, rounds_for, warmed
from .base import LONG_ROUNDS, MESSAGES, TIMEOUT_S


def script_3x5() -> str:
    steps: list[dict[str, Any]] = [{"tools": [{"name": "list_dir", "args": {"path": "."}}]}]
    steps += [{"tools": [{"name": "list_dir", "args": {"path": f"d{k}"}}], "delay_ms": 5} for k in (1, 2)]
    steps.append({"text": "done", "delay_ms": 5})
    return session.script(steps, text="three tool rounds")


async def steer(stack: Stack, pool: Pool, n: int) -> dict[str, Any]:
    s = (await session.create(pool, 1, "steer", title="steer"))[0]
    ws = Path(s["workspace"])
    for j in range(LONG_ROUNDS):
        (ws / f"d{j}").mkdir(exist_ok=True)
    long = session.script([{"tools": [{"name": "list_dir", "args": {"path": f"d{j}"}}], "delay_ms": 5}
                           for j in range(LONG_ROUNDS)], text="long")
    w = await Watch(stack.port, stack.token, s["id"]).start()
    lat, seen, post_ms = [], [], []
    try:
        for i in range(n):
            await w.idle(TIMEOUT_S)
            mark = len(w.events)
            res = await session.send(pool, w.sid, long)
            _, _, st = await w.wait_type("turn.start", TIMEOUT_S, mark, message_id=res["message_id"])
            await w.wait_type("tool.result", TIMEOUT_S, mark, turn_id=st["turn_id"])
            t0w, t0 = time.time(), time.perf_counter()
            new = await session.send(pool, w.sid, session.script([{"text": "steered"}], text=f"steer {i}"), mode="steer")
            post_ms.append((time.perf_counter() - t0) * 1000)
            _, t2, ns = await w.wait_type("turn.start", TIMEOUT_S, mark, message_id=new["message_id"])
            lat.append(ns["ts"] - t0w * 1000)
            seen.append((t2 - t0) * 1000)
            await w.idle(TIMEOUT_S)
    finally:
        await w.close()
    logs = await session.all_events(pool, [s["id"]])
    v = verdict.check(logs, {})
    stopped = sum(1 for e in logs[s["id"]] if e["type"] == "turn.end" and e.get("outcome") == "stopped")
    return {"n": n, "post_to_new_turn_start_ts_ms": summary(lat, 2), "post_to_new_turn_start_seen_ms": summary(seen, 2),
            "post_ms": summary(post_ms, 2), "no_overlap": v["no_overlap"], "stopped_turns": stopped}


async def measure(tmp: Path, c: Counts, log: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"queue": []}
    async with warmed(tmp / "peer-ours", 2, lambda j: script_3x5(), lambda j: "done", log) as (stack, pool):
        for n in c.peer_threads:
            r = await load(stack, pool, n, MESSAGES, lambda j: script_3x5(), TIMEOUT_S * 3, workspace=f"peer{n}",
                           answer=lambda j: "done", rounds=rounds_for(n, MESSAGES))
            out["queue"].append(r)
            log(f"  peer ours S={n}: {r['turns_per_s']} turns/s")
        out["steer"] = await steer(stack, pool, c.peer_steer_n)
    return out
