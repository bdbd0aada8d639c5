"""Daily spend budgets in the library on a real Redis (no runner; docs/api.md, "Budgets").

A turn that reached a budget ends with a pause (``cox_turn_end``'s ``pause``): the session goes
idle with its waiting messages kept, and every send and Lead is refused ``budget_reached``, in the
same atomic step, so no send slips in between. ``cox_budget_resume`` lifts the pause only when
today's budgets are above what was spent, and then starts the first waiting message (the rest
follow in order). A pause of an earlier day is over: the next send lifts it and runs the waiting
messages before itself. The counters: ``cox_emit``'s ``spend`` op counts the session's spend of
the day, ``cox_spend`` the principal's.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from coxswain import keys
from tests.support.library import Library

DAY_MS = 86_400_000




_n = 0


def today(r: redis.Redis) -> int:
    sec, usec = r.time()
    return int((sec * 1000 + usec // 1000) // DAY_MS)


def send(lib: Library, sid: str, message_id: str, mode: str = "", turn_id: str = "t_x", over: str = "") -> Any:
    return lib(lib.fns.send(sid=sid, principal="p", message_id=message_id, text=message_id, mode=mode, client_id="",
                            runner="r_1", lease_ms=5000, turn_id=turn_id, owner="", models="", agents_md="",
                            over=over))


def busy_session(lib: Library) -> tuple[str, str]:
    sid = lib.create("s_budget")
    sent = send(lib, sid, "m_0", turn_id="t_1")
    assert sent["disposition"] == "started", sent
    return sid, str(sent["token"])


def spend(lib: Library, sid: str, token: str, usd: float) -> dict[str, Any]:
    return dict(lib(lib.fns.emit(sid=sid, token=token, owner="", ops=[("spend", "", "", repr(usd))], events=[])))


def pause_of(day: int, spent: float = 0.12, limit: float = 0.1) -> str:
    return json.dumps({"budget": "session_spend", "limit": limit, "spent": spent, "day": day,
                       "detail": "the session's daily spend budget is reached"})


def end(lib: Library, sid: str, token: str, pause: str, outcome: str = "spend_limit") -> dict[str, Any]:
    body = json.dumps({"type": "turn.end", "sid": sid, "turn_id": "t_1", "outcome": outcome, "finish_reason": None,
                       "detail": None})
    return dict(lib(lib.fns.turn_end(sid=sid, token=token, owner="", end_body=body, next_turn_id="t_2",
                                     lease_ms=5000, plan="", handoff="", hold_next="", agents_md="", pause=pause)))


def resume(lib: Library, sid: str, session_spend: str = "", principal_usd: str = "", principal_spend: str = "",
           turn_id: str = "t_3") -> dict[str, Any]:
    return dict(lib(lib.fns.budget_resume(sid=sid, owner="", session_spend=session_spend, principal_usd=principal_usd,
                                          principal_spend=principal_spend, runner="r_1", lease_ms=5000,
                                          turn_id=turn_id, agents_md="", by="patch")))


def outbox(r: redis.Redis, sid: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in r.lrange(keys.of(sid, keys.OUTBOX), 0, -1)]


def queued_ids(r: redis.Redis, sid: str) -> list[str]:
    return [json.loads(x)["message_id"] for x in r.lrange(keys.of(sid, keys.QUEUE), 0, -1)]


def paused(r: redis.Redis, sid: str) -> bool:
    return r.zscore(keys.paused(keys.bucket(sid)), sid) is not None


def test_the_spend_op_counts_the_session_s_spend_of_the_day(lib: Library, r: redis.Redis) -> None:
    sid, token = busy_session(lib)
    first = spend(lib, sid, token, 0.03)
    second = spend(lib, sid, token, 0.04)
    assert first["spend_day"] == second["spend_day"] == today(r)
    assert second["spend_today"] == pytest.approx(0.07)
    # a count of an earlier day starts again at 0
    r.hset(keys.session(sid), mapping={"spend_day": str(today(r) - 1), "spend_today": "5"})
    assert spend(lib, sid, token, 0.01)["spend_today"] == pytest.approx(0.01)
    plain = dict(lib(lib.fns.emit(sid=sid, token=token, owner="", ops=[], events=[])))
    assert "spend_day" not in plain, "no spend op: nothing said about spend"


def test_the_principal_s_spend_of_the_day(lib: Library, r: redis.Redis) -> None:
    assert lib(lib.fns.spend(principal="pat", add="0"))["usd"] == 0
    assert lib(lib.fns.spend(principal="pat", add="0.25"))["usd"] == pytest.approx(0.25)
    got = lib(lib.fns.spend(principal="pat", add="0.5"))
    assert got["usd"] == pytest.approx(0.75) and got["day"] == today(r)
    r.hset(keys.principal_spend("pat"), "day", str(today(r) - 1))
    assert lib(lib.fns.spend(principal="pat", add="0"))["usd"] == 0, "a new day starts at 0"
    assert lib(lib.fns.spend(principal="pat", add="0.1"), tx="x_pat1")["usd"] == pytest.approx(0.1)
    assert lib(lib.fns.spend(principal="pat", add="0.1"), tx="x_pat1")["usd"] == pytest.approx(0.1), \
        "a retried call (same transition id) counts once"


def test_a_paused_session_keeps_its_queue_and_refuses_sends_until_resumed(lib: Library, r: redis.Redis) -> None:
    sid, token = busy_session(lib)
    assert send(lib, sid, "m_1", "queue")["disposition"] == "queued"
    assert send(lib, sid, "m_2", "queue")["disposition"] == "queued"
    spend(lib, sid, token, 0.12)
    ended = end(lib, sid, token, pause_of(today(r)))
    assert ended["paused"] is True and ended["next"] is None
    h = r.hgetall(keys.session(sid))
    assert h["busy"] == "0" and json.loads(h["budget"])["budget"] == "session_spend"
    assert queued_ids(r, sid) == ["m_1", "m_2"], "the waiting messages stay waiting, in order"
    assert paused(r, sid)
    reached = [e for e in outbox(r, sid) if e["type"] == "budget.reached"]
    assert len(reached) == 1 and reached[0]["waiting"] == 2 and reached[0]["limit"] == 0.1
    for mode in ("", "queue", "steer"):
        refused = send(lib, sid, f"m_no{mode}", mode)
        assert refused["error"] == "budget_reached", refused
        assert "daily spend budget" in refused["detail"]
    lead = dict(lib(lib.fns.lead(sid=sid, principal="p", lead_id="l_1", text="x", client_id="", max_pending=8,
                                 owner="", want_turn="")))
    assert lead["error"] == "budget_reached"
    assert queued_ids(r, sid) == ["m_1", "m_2"], "a refused send records nothing"

    still = resume(lib, sid, session_spend="0.1")
    assert still == {"resumed": False, "paused": True, "budget": "session_spend"}, "0.12 spent of 0.10: still paused"
    r.hset(keys.session(sid), "spend_limit", "0.5")
    going = resume(lib, sid, session_spend="0.1")
    assert going["resumed"] is True and going["next"]["message_id"] == "m_1" and going["turn_id"] == "t_3"
    h = r.hgetall(keys.session(sid))
    assert "budget" not in h and h["busy"] == "1" and h["message_id"] == "m_1"
    assert queued_ids(r, sid) == ["m_2"] and not paused(r, sid)
    types = [e["type"] for e in outbox(r, sid)]
    assert types[-3:] == ["budget.resumed", "user.msg", "turn.start"]
    # the queue goes on as after any turn
    nxt = end(lib, sid, going["token"], "", outcome="completed")
    assert nxt["next"]["message_id"] == "m_2"


def test_the_principal_s_budget_keeps_a_session_paused(lib: Library, r: redis.Redis) -> None:
    sid, token = busy_session(lib)
    send(lib, sid, "m_1", "queue")
    end(lib, sid, token, json.dumps({"budget": "principal_spend", "limit": 1.0, "spent": 1.2, "day": today(r),
                                     "detail": "the owner's budget"}))
    assert resume(lib, sid, principal_usd="1.2", principal_spend="1.0")["budget"] == "principal_spend"
    assert resume(lib, sid, principal_usd="1.2", principal_spend="2.0")["next"]["message_id"] == "m_1"


def test_the_principal_over_refuses_a_send_to_a_session_not_paused(lib: Library, r: redis.Redis) -> None:
    sid, _token = busy_session(lib)
    refused = send(lib, sid, "m_1", "queue", over="its owner spent $1.00 of $1 today")
    assert refused["error"] == "budget_reached" and "its owner" in refused["detail"]
    assert queued_ids(r, sid) == []


def test_a_pause_of_an_earlier_day_is_over_and_the_queue_runs_before_the_send(lib: Library, r: redis.Redis) -> None:
    sid, token = busy_session(lib)
    send(lib, sid, "m_1", "queue")
    send(lib, sid, "m_2", "queue")
    end(lib, sid, token, pause_of(today(r) - 1))
    # (a pause recorded yesterday; the turn ended just now, so it ends as at a day's end)
    h = r.hgetall(keys.session(sid))
    assert "budget" not in h and h["message_id"] == "m_1", "a stale pause holds nothing back"

    sid, token = busy_session(lib)
    send(lib, sid, "m_1", "queue")
    send(lib, sid, "m_2", "queue")
    end(lib, sid, token, pause_of(today(r)))
    r.hset(keys.session(sid), "budget", pause_of(today(r) - 1))  # as if the day had passed since
    got = send(lib, sid, "m_3", turn_id="t_9")
    assert got["disposition"] == "queued" and got["position"] == 2, got
    assert got["resumed"]["next"]["message_id"] == "m_1" and got["resumed"]["turn_id"] == "t_9"
    assert queued_ids(r, sid) == ["m_2", "m_3"], "the waiting messages first, then this one"
    resumed = [e for e in outbox(r, sid) if e["type"] == "budget.resumed"]
    assert resumed[-1]["by"] == "day"


def test_a_stop_as_the_turn_reaches_a_budget_does_not_pause(lib: Library, r: redis.Redis) -> None:
    sid, token = busy_session(lib)
    stopped = lib(lib.fns.stop(sid=sid, principal="p", owner=""))
    assert stopped["stopped"] is True
    ended = end(lib, sid, token, pause_of(today(r)))
    assert "paused" not in ended and "budget" not in r.hgetall(keys.session(sid))
