"""Runs at sweep scale: N scripted tasks started with ``POST /v1/runs`` (unattended, yolo), runners
in {1, 2, 4}, a fresh stack per runner count, and a person's interactive send while they run.

Each task is one run of one turn: the ``script`` model answers once after D ms and the turn
completes, so the run ends ``completed`` in turn 1. The tasks are started at most 64 at a time (a
sweep's ``--parallel``); the stack drives at most ``[runs] max_active`` run turns at once, so the
floor of tasks/s is ``max_active`` turns back to back with only the model's time between them,
capped by the cores at the floor's CPU per turn (``sweep.ideal``).

Figures: tasks/s = tasks / (last run.end ts - first POST, client wall clock); CPU per task = CPU
of every stack process over the load / tasks, against the same floor per turn the sweep uses
(one task is one turn plus its run.start and run.end); every run's outcome (all must be
``completed``, else the point counts zero). While the runs go, an interactive session is sent
``interactive_n`` one-turn messages one at a time: POST -> its ``turn.start`` (server ts) at p50
and p99, against the same on the idle stack before the load (``[runs] max_active`` leaves a
person's turn out of the bound: it must not wait behind the sweep).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from coxswain import keys

from . import session
from .client import Pool
from .stack import CONFIG, CpuMeter, Servers, Stack
from .stats import ratio, summary
from .sweep import ideal, redis_client

MAX_ACTIVE = 8


async def _wait_runs_ended(redis_url: str, sids: list[str], timeout: float) -> dict[str, dict[str, Any]]:
    """Every run's ``run`` field once all have ended, read from Redis (one pipelined read every
    100 ms, read-only), so the gateway carries no polling load of the bench's."""
    r = redis_client(redis_url)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while loop.time() < deadline:
            async with r.pipeline(transaction=False) as pipe:
                for sid in sids:
                    pipe.hget(keys.session(sid), "run")
                got = [json.loads(x) if x else {} for x in await pipe.execute()]
            if all(g.get("state") == "ended" for g in got):
                return dict(zip(sids, got, strict=True))
            await asyncio.sleep(0.1)
    finally:
        await r.aclose()
    raise TimeoutError(f"not every one of {len(sids)} runs ended within {timeout}s")


async def _interactive(pool: Pool, sid: str, n: int, stop: asyncio.Event | None = None) -> list[float]:
    """POST -> the message's turn.start (server ts - client wall clock before the POST), one at a time."""
    out: list[float] = []
    for i in range(n):
        if stop is not None and stop.is_set():
            break
        before = (await session.events(pool, sid))
        after = before[-1]["seq"] if before else 0
        t0 = time.time() * 1000
        res = await session.send(pool, sid, session.script([{"text": f"hi {i}"}], text=f"person {i}"))
        mid = res["message_id"]
        for _ in range(600):
            status, batch = await pool.get(f"/v1/sessions/{sid}/events?format=json&after={after}&limit=1000")
            starts = [e for e in (batch if status == 200 else []) if e["type"] == "turn.start" and e.get("message_id") == mid]
            ends = [e for e in (batch if status == 200 else []) if e["type"] == "turn.end"]
            if starts and ends:
                out.append(starts[0]["ts"] - t0)
                break
            await asyncio.sleep(0.02)
    return out


async def point(stack: Stack, pool: Pool, tasks: int, delay_ms: int, interactive_n: int, timeout: float,
                cpu_floor_per_turn_ms: Callable[[float], float]) -> dict[str, Any]:
    status, person = await pool.post("/v1/sessions", {"workspace": "person"})
    if status != 201:
        raise RuntimeError(f"create answered {status}: {person!r}")
    idle = await _interactive(pool, person["id"], interactive_n)
    sem = asyncio.Semaphore(64)
    refused: list[Any] = []
    sids: list[str] = []

    async def start(i: int) -> None:
        body = {"workspace": f"task-{i}", "text": session.script([{"text": f"task {i} done", "delay_ms": delay_ms}],
                                                                  text=f"task {i}"),
                "confirm": "yolo", "unattended": True, "max_turns": 3}
        async with sem:
            st, res = await pool.post("/v1/runs", body)
        if st != 201:
            refused.append((st, res))
        else:
            sids.append(res["session_id"])

    meter = CpuMeter(stack.all_procs()).start()
    t0w = time.time()
    stop = asyncio.Event()
    busy = asyncio.create_task(_interactive(pool, person["id"], interactive_n, stop))
    await session.gather_all([start(i) for i in range(tasks)], timeout)
    runs = await _wait_runs_ended(stack.servers.redis.admin_url, sids, timeout)
    meter.stop()
    stop.set()
    during = await busy
    outcomes: dict[str, int] = {}
    for run in runs.values():
        outcomes[run.get("outcome", "?")] = outcomes.get(run.get("outcome", "?"), 0) + 1
    ends, events = [], 0
    for sid in sids:
        evs = await session.events(pool, sid)
        ends += [e["ts"] for e in evs if e["type"] == "run.end"]
        events += len(evs)
    per_task_events = events / max(1, len(sids))
    span_s = (max(ends) - t0w * 1000) / 1000 if ends else float("nan")
    ok = not refused and outcomes == {"completed": tasks}
    tps = tasks / span_s if span_s > 0 else 0.0
    floor_ms = cpu_floor_per_turn_ms(per_task_events)
    ide = ideal(MAX_ACTIVE, 1, delay_ms, floor_ms)
    cpu_ms = meter.total / max(1, tasks) * 1000
    return {
        "tasks": tasks, "outcomes": outcomes, "refused": len(refused), "ok": ok,
        "span_s": round(span_s, 3), "tasks_per_s": round(tps, 1), "tasks_per_s_counted": round(tps, 1) if ok else 0.0,
        "cpu_ms_per_task": round(cpu_ms, 2), "cpu_floor_ms_per_task": round(floor_ms, 3),
        "events_per_task": round(per_task_events, 2), "cpu_s_by_process": meter.spent,
        "interactive_idle_ms": summary(idle, 1), "interactive_during_ms": summary(during, 1),
        "ideal": ide,
        "ratio": {"tasks_per_s": ratio(ide["turns_per_s"], tps if ok else None),
                  "cpu_per_task": ratio(cpu_ms, floor_ms),
                  "interactive_p99": ratio(summary(during, 1).get("p99"), summary(idle, 1).get("p99"))},
    }


async def runs(tmp: Path, tasks: int, runners: tuple[int, ...], delay_ms: int, interactive_n: int, timeout: float,
               cpu_floor_per_turn_ms: Callable[[float], float], log: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    config = CONFIG + f"\n[runs]\nmax_active = {MAX_ACTIVE}\n"
    for n_runners in runners:
        where = tmp / f"runs-r{n_runners}"
        servers = Servers(where).start()
        stack = Stack(where, servers, n_runners, config=config)
        try:
            stack.start()
            pool = Pool(stack.port, stack.token, size=32)
            t0 = time.perf_counter()
            try:
                r = await point(stack, pool, tasks, delay_ms, interactive_n, timeout, cpu_floor_per_turn_ms)
            except Exception as exc:  # noqa: BLE001 - a failed point is reported, the others still run
                r = {"tasks": tasks, "error": repr(exc), "tasks_per_s_counted": 0.0}
            finally:
                pool.close()
            r["runners"] = n_runners
            out.append(r)
            log(f"  runs runners={n_runners} tasks={tasks}: {r.get('tasks_per_s', '-')} tasks/s "
                f"(ok {r.get('ok')}), cpu/task {r.get('cpu_ms_per_task')} ms, interactive p99 "
                f"{r.get('interactive_during_ms', {}).get('p99')} ms (idle {r.get('interactive_idle_ms', {}).get('p99')})"
                f" ({time.perf_counter() - t0:.0f}s)")
        finally:
            stack.stop()
            servers.stop()
    return out

