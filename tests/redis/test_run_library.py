"""Runs in the library, on a real Redis (no runner): ``cox_run`` makes a run and begins its first
turn in one call; ``cox_turn_end`` queues exactly one ``continue`` per unfinished turn (a retry
of the same transition runs nothing again), ends the run on ``completed``, a person's Stop,
``context_full`` or ``max_turns``; sends are refused ``run_active`` while it runs; the run slots
bound run turns, spread them over the runners that wait, and lapse unless renewed. (Whole
stacks: tests/stack/test_runs.py, tests/faults/test_run_takeover.py.)"""

from __future__ import annotations

import json
import time
from typing import Any

import redis

from cox_runner import transcript
from coxswain import keys
from tests.support.library import Library

_n = 0


def new_run(lib: Library, max_turns: int = 3, confirm: str = "person", unattended: bool = False) -> tuple[str, str]:
    """A run with its first turn begun: (sid, lease token)."""
    global _n
    _n += 1
    sid = f"s_run{_n}"
    created = json.dumps({"type": "session.created", "sid": sid, "workspace": "/w", "model": "script"})
    start = json.dumps({"type": "run.start", "sid": sid, "confirm": confirm, "unattended": unattended,
                        "max_turns": max_turns})
    head = lib(lib.fns.run(sid=sid, principal="p", workspace="/w", model="script", title="", body=created, owner="",
                           message_id=f"m_{sid}", text="the task", runner="r_1", lease_ms=5000, turn_id="t_1",
                           agents_md="", run=json.dumps({"confirm": confirm, "unattended": unattended,
                                                         "max_turns": max_turns}), start_body=start))
    assert "error" not in head, head
    return sid, str(head["token"])


def end_turn(lib: Library, sid: str, token: str, outcome: str, next_turn: str, tx: str = "") -> dict[str, Any]:
    body = json.dumps({"type": "turn.end", "sid": sid, "turn_id": "x", "outcome": outcome})
    return dict(lib(lib.fns.turn_end(sid=sid, token=token, owner="", end_body=body, next_turn_id=next_turn,
                                     lease_ms=5000, plan="", handoff="", hold_next="", agents_md=""), tx=tx))


def log(r: redis.Redis, sid: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in r.lrange(keys.of(sid, keys.OUTBOX), 0, -1)]


def run_of(r: redis.Redis, sid: str) -> dict[str, Any]:
    return dict(json.loads(str(r.hget(keys.session(sid), "run"))))


def test_a_run_is_made_and_its_first_turn_begun_in_one_call(r: redis.Redis, lib: Library) -> None:
    sid, _ = new_run(lib)
    types = [e["type"] for e in log(r, sid)]
    assert types == ["session.created", "run.start", "user.msg", "turn.start"]
    assert run_of(r, sid) == {"state": "running", "confirm": "person", "unattended": False, "max_turns": 3,
                              "turns": 1}
    assert r.hget(keys.session(sid), "busy") == "1" and r.hget(keys.session(sid), "task") == "the task"


def test_an_unfinished_turn_queues_one_continue_even_when_its_end_is_retried(r: redis.Redis, lib: Library) -> None:
    sid, token = new_run(lib)
    first = end_turn(lib, sid, token, "hard_budget", "t_2", tx="x_end1")
    again = end_turn(lib, sid, token, "hard_budget", "t_2", tx="x_end1")  # its reply was lost: the same call
    assert first == again and first["next"] == {"message_id": "m_2", "text": "continue", "mode": "run"}
    evs = log(r, sid)
    msgs = [e for e in evs if e["type"] == "user.msg"]
    assert [(m["text"], m["via"]) for m in msgs] == [("the task", "send"), ("continue", "run")]
    assert len([e for e in evs if e["type"] == "turn.end"]) == 1
    assert r.llen(keys.of(sid, keys.QUEUE)) == 0
    assert run_of(r, sid)["turns"] == 2 and run_of(r, sid)["last"] == "hard_budget"
    assert r.hget(keys.session(sid), "task") == "the task", "a continue goes on with the run's task"


def test_max_turns_completed_and_context_full_end_the_run(r: redis.Redis, lib: Library) -> None:
    sid, token = new_run(lib, max_turns=2)
    end_turn(lib, sid, token, "crashed", "t_2")
    out = end_turn(lib, sid, token, "error", "t_3")
    assert out["next"] is None and r.hget(keys.session(sid), "busy") == "0"
    ends = [e for e in log(r, sid) if e["type"] == "run.end"]
    assert [(e["outcome"], e["turns"]) for e in ends] == [("max_turns", 2)]
    assert run_of(r, sid)["state"] == "ended" and run_of(r, sid)["outcome"] == "max_turns"

    sid, token = new_run(lib)
    end_turn(lib, sid, token, "completed", "t_2")
    assert [e["outcome"] for e in log(r, sid) if e["type"] == "run.end"] == ["completed"]

    sid, token = new_run(lib)
    end_turn(lib, sid, token, "context_full", "t_2")
    assert [e["outcome"] for e in log(r, sid) if e["type"] == "run.end"] == ["context_full"]


def test_sends_are_refused_while_it_runs_a_stop_ends_it_and_then_it_is_a_chat(r: redis.Redis, lib: Library) -> None:
    sid, token = new_run(lib, unattended=True)
    before = r.hget(keys.session(sid), "seq")
    for mode in ("", "queue", "steer"):
        head = lib(lib.fns.send(sid=sid, principal="p", message_id="m_x", text="hi", mode=mode, client_id="",
                                runner="r_1", lease_ms=5000, turn_id="t_x", owner="", models="", agents_md=""))
        assert head.get("error") == "run_active", (mode, head)
    lead = lib(lib.fns.lead(sid=sid, principal="p", lead_id="l_1", text="hi", client_id="", max_pending=8, owner="",
                            want_turn=""))
    assert lead.get("error") == "run_active", "no Lead into an unattended run"
    assert r.hget(keys.session(sid), "seq") == before, "nothing recorded"
    lib(lib.fns.stop(sid=sid, principal="p", owner=""))
    end_turn(lib, sid, token, "stopped", "t_2")
    assert [e["outcome"] for e in log(r, sid) if e["type"] == "run.end"] == ["stopped"]
    head = lib(lib.fns.send(sid=sid, principal="p", message_id="m_y", text="go on", mode="", client_id="",
                            runner="r_1", lease_ms=5000, turn_id="t_y", owner="", models="", agents_md=""))
    assert head["disposition"] == "started"
    assert run_of(r, sid)["turns"] == 1, "an ordinary turn is not the run's"


def test_a_supervised_run_takes_a_lead(r: redis.Redis, lib: Library) -> None:
    sid, _ = new_run(lib)
    lead = lib(lib.fns.lead(sid=sid, principal="p", lead_id="l_1", text="look", client_id="", max_pending=8,
                            owner="", want_turn=""))
    assert lead["pending"] == 1, lead


def test_going_idle_never_leaves_a_running_run(r: redis.Redis, lib: Library) -> None:
    """A Stop while the session is held between turns discards the waiting continue: the call
    that lets the session go idle ends the run."""
    sid, token = new_run(lib)
    body = json.dumps({"type": "turn.end", "sid": sid, "turn_id": "x", "outcome": "error"})
    held = lib(lib.fns.turn_end(sid=sid, token=token, owner="", end_body=body, next_turn_id="t_2", lease_ms=5000,
                                plan="", handoff="", hold_next="1", agents_md=""))
    assert held.get("held") is True and r.llen(keys.of(sid, keys.QUEUE)) == 1
    stopped = lib(lib.fns.stop(sid=sid, principal="p", owner=""))
    assert stopped["discarded"] == ["m_2"]
    lib(lib.fns.turn_end(sid=sid, token=token, owner="", end_body="", next_turn_id="t_3", lease_ms=5000, plan="",
                         handoff="", hold_next="", agents_md=""))
    assert r.hget(keys.session(sid), "busy") == "0"
    assert [e["outcome"] for e in log(r, sid) if e["type"] == "run.end"] == ["stopped"]


def slots(lib: Library, runner: str, *entries: str, max_active: int = 3, lease_ms: int = 5000) -> dict[str, Any]:
    return dict(lib(lib.fns.run_slots(runner=runner, max_active=max_active, lease_ms=lease_ms, entries=list(entries))))


def granted(res: dict[str, Any]) -> list[str]:
    g = res["granted"]
    return list(g) if isinstance(g, list) else []


def test_the_slots_bound_run_turns_first_come_first_served(r: redis.Redis, lib: Library) -> None:
    r.delete(keys.RUN_SLOTS, keys.RUN_POLLERS)
    res = slots(lib, "r_a", "?r_a|s1|1", "?r_a|s2|1", "?r_a|s3|1", "?r_a|s4|1")
    assert granted(res) == ["r_a|s1|1", "r_a|s2|1", "r_a|s3|1"] and res["active"] == 3
    again = slots(lib, "r_a", "+r_a|s1|1", "+r_a|s2|1", "+r_a|s3|1", "?r_a|s4|1")
    assert granted(again) == [], "over the bound it waits"
    res = slots(lib, "r_a", "-r_a|s1|1", "+r_a|s2|1", "+r_a|s3|1", "?r_a|s4|1")
    assert granted(res) == ["r_a|s4|1"] and res["active"] == 3
    res = slots(lib, "r_a", "?r_a|s4|1")  # run again after a lost reply: still granted
    assert granted(res) == ["r_a|s4|1"]


def test_the_slots_are_shared_between_runners_that_wait_and_lapse_unless_renewed(r: redis.Redis,
                                                                                 lib: Library) -> None:
    r.delete(keys.RUN_SLOTS, keys.RUN_POLLERS)
    slots(lib, "r_b", "?r_b|s9|1", max_active=4)  # r_b waits too (one turn granted)
    res = slots(lib, "r_a", *(f"?r_a|s{i}|1" for i in range(4)), max_active=4)
    assert len(granted(res)) == 2, "two runners wait: each gets its share of four"
    res = slots(lib, "r_b", "+r_b|s9|1", "?r_b|s8|1", max_active=4)
    assert granted(res) == ["r_b|s8|1"]
    r.delete(keys.RUN_SLOTS, keys.RUN_POLLERS)
    slots(lib, "r_c", "?r_c|s1|1", max_active=1, lease_ms=200)
    assert granted(slots(lib, "r_d", "?r_d|s2|2", max_active=1)) == []
    time.sleep(0.3)  # r_c died: its slot was not renewed
    assert granted(slots(lib, "r_d", "?r_d|s2|2", max_active=1)) == ["r_d|s2|2"]



def shape(messages: list[Any]) -> list[Any]:
    """A transcript without the build's clock (each part's timestamp is when it was built)."""
    return [(type(m).__name__, [(type(p).__name__, getattr(p, "content", None)) for p in m.parts],
             getattr(m, "instructions", None), getattr(m, "metadata", None)) for m in messages]


def test_a_runs_first_turn_builds_from_the_message_what_the_log_would_give(r: redis.Redis, lib: Library) -> None:
    """``cox_run`` hands the session as the turn began (``info``), and the run's first turn builds
    its transcript from its message without reading the log (``TurnLoop._load``): the same
    transcript, up to the same seq, as building it from the events the call wrote."""
    sid, _ = new_run(lib)
    info = json.loads(lib.raw[0])["info"]
    assert info == r.hgetall(keys.session(sid)), "info is the session hash as the turn began"
    events = log(r, sid)
    assert int(info["seq"]) == events[-1]["seq"]
    from_log = transcript.build(events)
    fresh = transcript.of_message("the task", "send", int(info["seq"]))
    assert shape(fresh.request_messages("i")) == shape(from_log.request_messages("i"))
    assert (fresh.seq, fresh.seqs) == (from_log.seq, from_log.seqs)


class _Spy:
    """The runner's Store as RunSlots uses it, on this module's Redis: each call's entries kept,
    and the reply of chosen calls lost after Redis ran them (the connection broke)."""

    def __init__(self, lib: Library) -> None:
        self.lib = lib
        self.fns = self
        self.calls: list[list[str]] = []
        self.lose: set[int] = set()

    async def run_slots(self, **kw: Any) -> dict[str, Any]:
        self.calls.append(list(kw["entries"]))
        res = await self.lib.fns.run_slots(**kw)
        if len(self.calls) - 1 in self.lose:
            raise redis.exceptions.ConnectionError("the reply was lost")
        return dict(res)

    async def drop_idle(self) -> None:
        return None


async def test_a_runner_with_many_waiting_run_turns_asks_for_no_more_than_could_be_granted(
        r: redis.Redis, lib: Library) -> None:
    """A sweep queues a thousand run turns on a runner: each call asked for every one of them
    (a ZSCORE each in Redis, at every slot freed). It asks for the first max_active, in order;
    the order holds, and a turn granted by a call whose reply was lost is granted again."""
    import asyncio

    import structlog

    from cox_runner.runslots import RunSlots
    from coxswain.config import RunsConfig, Settings

    r.delete(keys.RUN_SLOTS, keys.RUN_POLLERS)
    spy = _Spy(lib)
    rs = RunSlots(spy, Settings(runs=RunsConfig(max_active=3)), "r_sweep", structlog.get_logger())  # type: ignore[arg-type]
    loop = asyncio.create_task(rs.run())
    order: list[int] = []

    async def turn(i: int) -> None:
        await rs.acquire(f"s{i}", "1")
        order.append(i)
        await asyncio.sleep(0.005)
        rs.release(f"s{i}")

    try:
        spy.lose = {3}
        tasks = []
        for i in range(60):
            tasks.append(asyncio.create_task(turn(i)))
            await asyncio.sleep(0)  # asked in this order
        await asyncio.wait_for(asyncio.gather(*tasks), 30)
    finally:
        loop.cancel()
    assert order == list(range(60)), "first come, first served"
    asks = [sum(1 for e in c if e.startswith("?")) for c in spy.calls]
    assert max(asks) <= 3, f"a call asked for {max(asks)} turns while at most 3 could be granted"
    assert len(spy.calls) > 3, "the lost reply was not exercised"
    assert rs.held == 0
    # no slot leaked (the lost reply's grants were taken again): Redis holds only what was freed
    # here after the loop's last call, not yet given back
    assert set(r.zrange(keys.RUN_SLOTS, 0, -1)) <= set(rs._freed)
