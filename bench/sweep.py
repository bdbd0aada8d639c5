"""Throughput sweep: S sessions x M queued messages, the script model at D ms per response.

For each runner count a fresh stack; for each S, sessions are created (not timed), then every
session is sent its M messages (``mode=queue``, pipelined in order on one connection; at most
64 sessions fed at once) and the bench waits until every session is idle with an empty queue,
watching Redis read-only (one pipelined read every 100 ms, so the gateway carries no polling
load).

Figures (server ts unless named): turns/s = turns / (last turn.end ts - first send, client wall
clock); queue wait = turn.start ts - queue.added ts of each queued message; CPU per turn = CPU
of every stack process (services, nats-server, redis-server) over the load / turns; the
client's CPU is reported apart. The verdict (``verdict.py``) comes from the event log; a
throughput that breaks FIFO or no-overlap counts as zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from coxswain import keys

from . import session, verdict
from .client import Pool
from .stack import CpuMeter, Servers, Stack
from .stats import percentile, ratio, summary


def redis_client(redis_url: str, cluster: bool = False) -> Any:
    """The bench's own reader of the sessions' state (the cluster client on a Redis Cluster)."""
    if cluster:
        return aioredis.RedisCluster.from_url(redis_url, decode_responses=True)
    return aioredis.Redis.from_url(redis_url, decode_responses=True)


async def wait_all_idle(redis_url: str, sids: list[str], timeout: float, cluster: bool = False) -> bool:
    r = redis_client(redis_url, cluster)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    try:
        while loop.time() < deadline:
            async with r.pipeline(transaction=False) as pipe:
                for sid in sids:
                    base = keys.session(sid)
                    pipe.hget(base, "busy")
                    pipe.llen(base + keys.QUEUE)
                    pipe.llen(base + keys.OUTBOX)
                res = await pipe.execute()
            if all(res[i] == "0" and res[i + 1] == 0 and res[i + 2] == 0 for i in range(0, len(res), 3)):
                return True
            await asyncio.sleep(0.1)
        return False
    finally:
        await r.aclose()


async def read_logs(pool: Pool, redis_url: str, sids: list[str], tries: int = 5,
                    cluster: bool = False) -> tuple[dict[str, list[dict[str, Any]]], dict[str, int]]:
    """Every session's log, checked against its ``seq`` in Redis. A read that came back short
    (the gateway answered fewer events than the log holds) is retried, and counted: such a read
    is a fault of the read path, which the report names, not of the load."""
    r = redis_client(redis_url, cluster)
    try:
        async with r.pipeline(transaction=False) as pipe:
            for sid in sids:
                pipe.hget(keys.session(sid), "seq")
            seqs = [int(x or 0) for x in await pipe.execute()]
    finally:
        await r.aclose()
    want = dict(zip(sids, seqs, strict=True))
    logs = await session.all_events(pool, sids)
    short = {"short_reads": 0, "still_short": 0}
    for sid in sids:
        for _ in range(tries):
            if len(logs[sid]) >= want[sid]:
                break
            short["short_reads"] += 1
            await asyncio.sleep(0.2)
            logs[sid] = await session.events(pool, sid)
        short["still_short"] += len(logs[sid]) < want[sid]
    return logs, short


def handoff_gaps(evs: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """(turn.end -> next queued turn.start, turn.end -> that turn's first assistant.msg) in ms."""
    queued = {e["message_id"] for e in evs if e["type"] == "queue.added"}
    first_out: dict[str, float] = {}
    for e in evs:
        if e["type"] == "assistant.msg" and e["turn_id"] not in first_out:
            first_out[e["turn_id"]] = e["ts"]
    to_start, to_output = [], []
    last_end: dict[str, Any] | None = None
    for e in evs:
        if e["type"] == "turn.end":
            last_end = e
        elif e["type"] == "turn.start" and e["message_id"] in queued and last_end is not None:
            to_start.append(e["ts"] - last_end["ts"])
            if e["turn_id"] in first_out:
                to_output.append(first_out[e["turn_id"]] - last_end["ts"])
    return to_start, to_output


def handoff_seen_gaps(events: list[tuple[float, dict[str, Any]]]) -> list[float]:
    """turn.end -> the next queued turn's first assistant.msg, in ms on the client's clock: each
    event's arrival on one session's stream (``Watch.events``) in place of its ``ts``. An event's
    ``ts`` has whole milliseconds, too coarse for a gap of one or two; the two events reach the
    stream by the same path (the holder's publishes, the gateway, SSE), so their arrivals are as
    far apart as their publishes, to the microsecond. A later publish waiting behind an earlier
    one's trim makes a gap longer, never shorter."""
    return handoff_gaps([{**e, "ts": t * 1000} for t, e in events])[1]


MIN_TURNS = 500
"""Turns a point's CPU figure is measured over, at least: a process's CPU time is counted in
10 ms ticks, and over a 50-turn point (S=10, 5 messages) eight processes' rounding alone moved
CPU per turn by up to 1.6 ms (the 2- and 4-runner S=10 points read 3.1x and 2.5x their floor
where 600 turns read 1.8x and 2.0x). A smaller point runs in rounds of fresh sessions."""


def rounds_for(n_sessions: int, messages: int) -> int:
    return max(1, math.ceil(MIN_TURNS / max(1, n_sessions * messages)))


async def load(stack: Stack, pool: Pool, n_sessions: int, messages: int, text: Callable[[int], str],
               timeout: float, workspace: str = "sweep",
               answer: Callable[[int], str] | None = None, rounds: int = 1) -> dict[str, Any]:
    """One load: ``n_sessions`` fresh sessions, ``messages`` queued messages each; ``rounds``
    times one after the other (each on fresh sessions), its figures over all of them."""
    sessions = await session.create(pool, n_sessions * rounds, workspace, concurrency=16)
    sids = [s["id"] for s in sessions]
    accepted: dict[str, list[str]] = {sid: [] for sid in sids}
    dispositions: dict[str, int] = {}
    answers: dict[str, str] = {}
    sem = asyncio.Semaphore(64)

    async def feed(sid: str) -> None:
        # All of a session's messages pipelined on one connection: admitted in this order with
        # no client round trip between them, so they queue behind the first turn.
        async with sem:
            replies = await pool.pipelined("POST", f"/v1/sessions/{sid}/messages",
                                           [{"text": text(j), "mode": "queue"} for j in range(messages)])
        for j, (status, res) in enumerate(replies):
            if status != 202:
                raise RuntimeError(f"send answered {status}: {res!r}")
            accepted[sid].append(res["message_id"])
            if answer is not None:
                answers[res["message_id"]] = answer(j)
            dispositions[res["disposition"]] = dispositions.get(res["disposition"], 0) + 1

    clustered = stack.servers.redis_clustered
    cpu_s = client_s = sent_s = 0.0
    spent: dict[str, float] = {}
    switches: dict[str, list[int]] = {}
    finished = True
    starts: list[tuple[list[str], float]] = []
    for r in range(rounds):
        group = sids[r * n_sessions:(r + 1) * n_sessions]
        meter = CpuMeter(stack.all_procs()).start()
        t0w, t0 = time.time(), time.perf_counter()
        await session.gather_all([feed(s) for s in group], timeout)
        sent_s += time.perf_counter() - t0
        finished = await wait_all_idle(stack.servers.redis.admin_url, group, timeout, cluster=clustered) and finished
        meter.stop()
        cpu_s += meter.total
        client_s += meter.client_s
        for name, secs in meter.spent.items():
            spent[name] = round(spent.get(name, 0.0) + secs, 3)
        for name, (vol, inv) in meter.switches.items():
            acc = switches.setdefault(name, [0, 0])
            acc[0] += vol
            acc[1] += inv
        starts.append((group, t0w))
    logs, short = await read_logs(pool, stack.servers.redis.admin_url, sids, cluster=clustered)
    v = verdict.check(logs, accepted, answers)
    v["short_reads"] = short
    v["finished_in_time"] = finished
    ends = [e for evs in logs.values() for e in evs if e["type"] == "turn.end"]
    turns = len(ends)
    span_s = 0.0  # each round's, from its first send to its last turn's end
    for group, t0w in starts:
        last = [e["ts"] for sid in group for e in logs.get(sid, []) if e["type"] == "turn.end"]
        span_s += (max(last) - t0w * 1000) / 1000 if last else float("nan")
    waits = []
    for evs in logs.values():
        added = {e["message_id"]: e["ts"] for e in evs if e["type"] == "queue.added"}
        waits += [e["ts"] - added[e["message_id"]] for e in evs if e["type"] == "turn.start" and e["message_id"] in added]
    to_start, to_output = [], []
    for evs in logs.values():
        a, b = handoff_gaps(evs)
        to_start += a
        to_output += b
    events = sum(len(evs) for evs in logs.values())
    tps = turns / span_s if span_s > 0 else 0.0
    return {
        "sessions": n_sessions, "messages_per_session": messages, "rounds": rounds, "turns": turns,
        "dispositions": dispositions, "send_phase_s": round(sent_s, 3), "span_s": round(span_s, 3),
        "turns_per_s": round(tps, 1), "turns_per_s_counted": round(tps, 1) if v["ok"] and finished else 0.0,
        "queue_wait_ms": summary(waits, 1), "handoff_end_to_start_ms": summary(to_start, 1),
        "handoff_end_to_first_output_ms": summary(to_output, 1),
        "cpu_ms_per_turn": round(cpu_s / max(1, turns) * 1000, 2),
        "cpu_s_by_process": spent, "client_cpu_ms_per_turn": round(client_s / max(1, turns) * 1000, 2),
        # Wake-ups: a process switched off its CPU to wait (voluntary) or preempted (involuntary),
        # per turn; the same work spread over more processes wakes each up for less of it.
        "switches_per_turn": {
            "voluntary": round(sum(v for v, _ in switches.values()) / max(1, turns), 2),
            "involuntary": round(sum(i for _, i in switches.values()) / max(1, turns), 2),
            "by_process": {name: [round(v / max(1, turns), 2), round(i / max(1, turns), 2)]
                           for name, (v, i) in switches.items()},
        },
        "events_per_turn": round(events / max(1, turns), 2), "verdict": v,
    }


WARMUP_MESSAGES = 3
"""Messages per session of :func:`warm_up`'s load."""


async def warm_up(stack: Stack, pool: Pool, text: Callable[[int], str], answer: Callable[[int], str] | None,
                  log: Any) -> None:
    """A load that is not measured, on a fresh stack before its first measured point: twice as
    many sessions as runners (at least 4), :data:`WARMUP_MESSAGES` queued messages each, the
    point's own script. A fresh process pays for its first turns once (the model layer imported
    when first used, first connections, the interpreter's caches), and the floors are measured
    after their own warm-up round trips: without this the first point of every stack, and each
    runner of a 4-runner stack, carried those costs (4 runners at S=10: 14.8 ms a turn cold,
    12.3 warm, on one machine). A failure here is logged; the points then report their own."""
    n = max(4, 2 * stack.runners)
    try:
        await load(stack, pool, n, WARMUP_MESSAGES, text, 120.0, workspace="warmup", answer=answer)
    except Exception as exc:  # noqa: BLE001 - the measured points say what is wrong
        log(f"  warm-up load failed: {exc!r}")


@contextlib.asynccontextmanager
async def warmed(where: Path, runners: int, text: Callable[[int], str], answer: Callable[[int], str] | None,
                 log: Any, kind: str = "single") -> AsyncIterator[tuple[Stack, Pool]]:
    """A fresh stack (its own servers of ``kind``, ``runners`` runners) and a pool of 32
    connections to it, warmed by :func:`warm_up` with ``text``'s script; everything stopped after."""
    servers = Servers(where, kind).start()
    stack = Stack(where, servers, runners)
    try:
        stack.start()
        pool = Pool(stack.port, stack.token, size=32)
        try:
            await warm_up(stack, pool, text, answer, log)
            yield stack, pool
        finally:
            pool.close()
    finally:
        stack.stop()
        servers.stop()


def ideal(n_sessions: int, messages: int, delay_ms: int, cpu_floor_ms: float) -> dict[str, float]:
    """The most the floor allows: every session's turns back to back with only the model's time
    between them, all sessions at once, capped by the machine's cores at the floor's CPU per turn.
    Queue waits: the k-th queued message waits for the k turns ahead of it."""
    cores = os.cpu_count() or 1
    model_bound = n_sessions * 1000.0 / delay_ms
    cpu_bound = cores * 1000.0 / cpu_floor_ms if cpu_floor_ms > 0 else math.inf
    tps = min(model_bound, cpu_bound)
    stretch = model_bound / tps  # when the CPU binds, every turn ahead takes that much longer
    waits = sorted(float(k * delay_ms * stretch) for _ in range(n_sessions) for k in range(1, messages))
    return {"turns_per_s": round(tps, 1), "model_bound_turns_per_s": model_bound,
            "cpu_bound_turns_per_s": round(cpu_bound, 1), "queue_wait_p99_ms": round(percentile(waits, 99), 1),
            "queue_wait_p50_ms": round(percentile(waits, 50), 1)}


async def sweep(tmp: Path, sessions: tuple[int, ...], runners: tuple[int, ...], messages: int, delay_ms: int,
                timeout: float, cpu_floor_per_turn_ms: Callable[[float], float], log: Any,
                kinds: tuple[str, ...] = ("single",)) -> list[dict[str, Any]]:
    """Every (runners, sessions) point on each kind of servers (``single``, ``cluster``), in turn,
    each on a fresh stack; a point is tagged with its ``servers`` kind."""
    out: list[dict[str, Any]] = []
    def text(j: int) -> str:
        return session.script([{"text": f"turn {j} done", "delay_ms": delay_ms}], text=f"message {j}")

    def answer(j: int) -> str:
        return f"turn {j} done"

    for kind, n_runners in [(k, n) for k in kinds for n in runners]:
        async with warmed(tmp / f"sweep-{kind}-r{n_runners}", n_runners, text, answer, log, kind) as (stack, pool):
            for s in sessions:
                t0 = time.perf_counter()
                try:
                    r = await load(stack, pool, s, messages, text, timeout, workspace=f"sweep{s}", answer=answer,
                                   rounds=rounds_for(s, messages))
                except Exception as exc:  # noqa: BLE001 - a failed point is reported, the sweep goes on
                    r = {"sessions": s, "error": repr(exc), "turns_per_s_counted": 0.0}
                r["runners"] = n_runners
                r["servers"] = kind
                if kind == "cluster":
                    r["clustered"] = {"nats": stack.servers.nats_clustered, "redis": stack.servers.redis_clustered}
                if "error" not in r:
                    ide = ideal(s, messages, delay_ms, cpu_floor_per_turn_ms(r["events_per_turn"]))
                    r["ideal"] = ide
                    r["ratio"] = {
                        "turns_per_s": ratio(ide["turns_per_s"], r["turns_per_s_counted"] or None),
                        "queue_wait_p99": ratio(r["queue_wait_ms"].get("p99"), ide["queue_wait_p99_ms"]),
                        "cpu_per_turn": ratio(r["cpu_ms_per_turn"], cpu_floor_per_turn_ms(r["events_per_turn"])),
                    }
                    r["cpu_floor_ms_per_turn"] = round(cpu_floor_per_turn_ms(r["events_per_turn"]), 3)
                out.append(r)
                log(f"  sweep {kind} runners={n_runners} S={s}: {r.get('turns_per_s', '-')} turns/s "
                    f"(counted {r.get('turns_per_s_counted')}), p99 wait {r.get('queue_wait_ms', {}).get('p99')} ms, "
                    f"verdict {r.get('verdict', {}).get('ok')} ({time.perf_counter() - t0:.0f}s)")
    return out


def cluster_vs_single(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each (runners, sessions) measured on both kinds: turns/s and CPU per turn on the
    clusters and on single servers, and cluster / single for each."""
    by = {(p.get("servers", "single"), p["runners"], p["sessions"]): p for p in points if "error" not in p}
    out = []
    for (kind, n_runners, s), c in sorted(by.items()):
        one = by.get(("single", n_runners, s))
        if kind != "cluster" or one is None:
            continue
        out.append({
            "runners": n_runners, "sessions": s, "clustered": c.get("clustered"),
            "turns_per_s": {"single": one["turns_per_s_counted"], "cluster": c["turns_per_s_counted"],
                            "ratio": ratio(c["turns_per_s_counted"] or None, one["turns_per_s_counted"] or None)},
            "cpu_ms_per_turn": {"single": one["cpu_ms_per_turn"], "cluster": c["cpu_ms_per_turn"],
                                "ratio": ratio(c["cpu_ms_per_turn"], one["cpu_ms_per_turn"])},
        })
    return out
