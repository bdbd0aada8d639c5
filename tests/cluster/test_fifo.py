"""FIFO and no overlap under load: 20 sessions x 10 messages with random queue, steer and Stop,
sent concurrently to a stack with two turn-runners, judged from the event log alone."""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

from tests.support.logcheck import check_accepted, log_of, replay
from tests.support.stack import Api, Stack, script, stack_fixture

SESSIONS = 20
MESSAGES = 10
SEED = int(os.environ.get("COX_TEST_SEED", "0")) or random.randrange(1, 1 << 30)


stack = stack_fixture("fifo", runners=2, also_cluster=True)


def a_message(rng: random.Random, label: str) -> str:
    """A short turn of a random shape: text, commands, several calls, or a write."""
    kind = rng.choice(["text", "text", "command", "calls", "write"])
    if kind == "text":
        return script({"text": f"{label} done", "delay_ms": rng.randrange(20, 400)}, text=label)
    if kind == "command":
        return script({"text": "Sleeping.", "tools": [{"name": "run_command", "args": {"command": "sleep 0.2"}}]},
                      {"text": f"{label} done"}, text=label)
    if kind == "calls":
        calls = [{"name": "run_command", "args": {"command": f"echo {label}-{i}"}} for i in range(4)]
        return script({"tools": calls, "delay_ms": 50}, {"text": f"{label} done"}, text=label)
    return script({"tools": [{"name": "write_file", "args": {"path": f"{label}.txt", "content": label}}]},
                  {"text": f"{label} done", "delay_ms": 100}, text=label)


def drive_session(api: Api, sid: str, rng: random.Random, out: dict[str, Any]) -> None:
    """Send MESSAGES messages one request at a time, with random modes and Stops between."""
    replies: list[dict[str, Any]] = []
    stops: list[list[str]] = []
    sent = 0
    while sent < MESSAGES:
        time.sleep(rng.random() * float(os.environ.get("COX_TEST_SPACING", "0.25")))  # spacing between a person's actions, not a synchronisation
        roll = rng.random()
        if roll < 0.1 and sent:
            r = api.http.post(f"/v1/sessions/{sid}/stop")
            assert r.status_code == 200, r.text
            stops.append(r.json()["discarded"])
            continue
        mode = None if roll < 0.25 else "steer" if roll < 0.4 else "queue"
        label = f"m{sent}"
        r = api.send(sid, a_message(rng, label), mode=mode)
        if r.status_code == 409 and mode is None:
            assert r.json()["error"] == "busy", r.text
            continue
        assert r.status_code == 202, r.text
        replies.append({**r.json(), "mode": mode})
        sent += 1
    out["replies"] = replies
    out["stops"] = stops


def test_fifo_and_no_overlap_across_sessions_and_runners(stack: Stack) -> None:
    print(f"seed {SEED}")
    master = random.Random(SEED)
    results: dict[str, dict[str, Any]] = {}
    errors: list[BaseException] = []
    with stack.client(timeout=60) as api:
        sids = [api.create(f"fifo-{i}")["id"] for i in range(SESSIONS)]

    def worker(sid: str, seed: int) -> None:
        try:
            with stack.client(timeout=60) as api:
                out: dict[str, Any] = {}
                drive_session(api, sid, random.Random(seed), out)
                results[sid] = out
        except BaseException as exc:  # noqa: BLE001 - reported below with the seed
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(sid, master.randrange(1 << 30))) for sid in sids]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert not errors, f"seed {SEED}: {errors[0]!r}"
    assert len(results) == SESSIONS
    with stack.client(timeout=60) as api:
        for sid in sids:
            api.wait_idle(sid, timeout=120)
        elapsed = time.monotonic() - started
        totals = {"turns": 0, "discarded": 0, "steered": 0, "stopped": 0, "closed_calls": 0}
        runners_seen: set[str] = set()
        for sid in sids:
            evs = log_of(api, sid)
            try:
                r = replay(evs)
                check_accepted(r, results[sid]["replies"])
            except AssertionError as exc:
                raise AssertionError(f"seed {SEED}, session {sid}: {exc}") from exc
            # what each Stop answered is what the log recorded as discarded, in order
            assert [d for d in results[sid]["stops"] if d] == r.discarded, (sid, results[sid]["stops"], r.discarded)
            totals["turns"] += len(r.starts)
            totals["discarded"] += len(r.discarded_ids())
            totals["steered"] += sum(1 for x in results[sid]["replies"] if x["disposition"] == "steered")
            totals["stopped"] += sum(1 for o in r.ends.values() if o == "stopped")
            totals["closed_calls"] += r.closed_calls
            assert set(r.ends.values()) <= {"completed", "stopped"}, r.ends
        for name in stack.runner_names():
            if "turn.end" in stack.log(name):
                runners_seen.add(name)
    print(f"seed {SEED}: {SESSIONS * MESSAGES} messages in {elapsed:.1f}s: {totals}")
    assert totals["turns"] + totals["discarded"] == SESSIONS * MESSAGES
    assert totals["steered"] > 0 and totals["stopped"] > 0 and totals["discarded"] > 0
    assert runners_seen == set(stack.runner_names()), "both runners ran turns"


def test_concurrent_sends_to_one_idle_session_start_exactly_one_turn(stack: Stack) -> None:
    """Many clients send at the same moment, through both runners: one send starts the turn,
    the rest are refused (no mode), queued in one order with distinct positions, or steered."""
    from concurrent.futures import ThreadPoolExecutor

    with stack.client(timeout=60) as api:
        for mode in (None, "queue", "steer"):
            sid = api.create(f"race-{mode}")["id"]
            barrier = threading.Barrier(8)

            def one(i: int, sid: str = sid, mode: str | None = mode, barrier: threading.Barrier = barrier) -> Any:
                with stack.client(timeout=60) as c:
                    barrier.wait()
                    return c.send(sid, script({"text": f"r{i}", "delay_ms": 3000}, text=f"r{i}"), mode=mode)

            with ThreadPoolExecutor(8) as pool:
                rs = list(pool.map(one, range(8)))
            assert all(r.status_code in (202, 409) for r in rs), [r.text for r in rs]
            ok = [r.json() for r in rs if r.status_code == 202]
            started = [x for x in ok if x["disposition"] == "started"]
            assert len(started) == 1, ok
            if mode is None:
                assert len(ok) == 1 and all(r.json()["error"] == "busy" for r in rs if r.status_code == 409)
            elif mode == "queue":
                queued = sorted((x for x in ok if x["disposition"] == "queued"), key=lambda x: x["position"])
                assert [x["position"] for x in queued] == list(range(1, 8)), ok
            else:
                assert len(ok) == 8 and all(x["disposition"] == "steered" for x in ok if x is not started[0])
            res = api.http.post(f"/v1/sessions/{sid}/stop").json()
            if mode == "queue":
                assert res["discarded"] == [x["message_id"] for x in queued], "discarded in FIFO order"
            api.wait_idle(sid, timeout=60)
            r = replay(log_of(api, sid))
            assert set(r.starts) | set(r.discarded_ids()) == {x["message_id"] for x in ok}
            assert started[0]["message_id"] == r.starts[0]
