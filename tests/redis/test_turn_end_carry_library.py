"""The turn's final response carried by ``cox_turn_end`` (its events and ops, with the
``close_leads`` op), in the library on a real Redis (no runner).

The call that ends the turn records the final response first and closes Lead admission with it:
one call a turn fewer than ``cox_emit`` then ``cox_turn_end``. It keeps both promises: the
response is in the log before ``turn.end`` and the next turn's start; a Lead saved before the
call is never dropped: the turn does not end (``goes_on``), the response is recorded, Leads stay
admitted, and a second call (nothing carried) ends it; a Stop closes whatever waits; a refused
call records nothing. Whole turns: tests/stack/test_lead.py.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from cox_runner.recorder import CLOSE_LEADS, take_leads_op
from coxswain import keys
from tests.redis.test_idempotent_library import busy_session
from tests.redis.test_lead_close_library import closed_flag, lead, types
from tests.support.library import Library


def end(lib: Library, sid: str, token: str, ops: list[tuple[str, str, str, str]] | None = None,
        carry: bool = True) -> dict[str, Any]:
    """End turn t_1 with its final response carried (``ops``: the response's ops, CLOSE_LEADS by default)."""
    msg = json.dumps({"type": "assistant.msg", "sid": sid, "turn_id": "t_1", "text": "done", "tool_calls": []})
    body = json.dumps({"type": "turn.end", "sid": sid, "turn_id": "t_1", "outcome": "completed"})
    return dict(lib(lib.fns.turn_end(
        sid=sid, token=token, owner="", end_body=body, next_turn_id="t_2", lease_ms=5000, plan="", handoff="",
        hold_next="", agents_md="", ops=([CLOSE_LEADS] if ops is None else ops) if carry else [],
        events=[msg] if carry else [])))


def seqs(r: redis.Redis, sid: str) -> dict[str, int]:
    return {json.loads(x)["type"]: json.loads(x)["seq"] for x in r.lrange(keys.of(sid, keys.OUTBOX), 0, -1)}


def test_the_response_is_recorded_before_the_end_and_the_next_turn(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib, queued=1)
    res = end(lib, sid, token, ops=[CLOSE_LEADS, ("hincrby", "", "tokens_in", "12")])
    assert res["next"] is not None and res["turn_id"] == "t_2" and "goes_on" not in res, res
    s = seqs(r, sid)
    assert s["assistant.msg"] < s["turn.end"] < s["turn.start"], types(r, sid)
    assert res["last"] == s["assistant.msg"], "last: the carried record's seq"
    assert r.hget(keys.session(sid), "tokens_in") == "12", "its ops ran"
    assert r.hget(keys.session(sid), "turn_id") == "t_2"


def test_a_lead_saved_before_the_call_keeps_the_turn_going_and_is_never_dropped(r: redis.Redis,
                                                                                 lib: Library) -> None:
    sid, token = busy_session(lib, queued=1)
    assert "error" not in lead(lib, sid)
    res = end(lib, sid, token)
    assert res.get("goes_on") is True and res["leads"] == 1 and res["next"] is None and res["ended"] == "", res
    assert res["last"] == seqs(r, sid)["assistant.msg"], "the response is recorded all the same"
    assert "turn.end" not in types(r, sid) and r.hget(keys.session(sid), "turn_id") == "t_1", "the turn goes on"
    assert closed_flag(r, sid) == "0" and "error" not in lead(lib, sid), "Leads still admitted"
    taken = lib(lib.fns.emit(sid=sid, token=token, owner="", ops=[take_leads_op("t_1")], events=[]))
    assert len(taken["taken"]) == 2
    # the turn's next end carries its next final response and ends as usual
    again = end(lib, sid, token)
    assert again["next"] is not None and "goes_on" not in again, again
    assert types(r, sid).count("assistant.msg") == 2 and types(r, sid).count("turn.end") == 1


def test_a_stop_closes_whatever_waits_and_the_turn_ends_stopped(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    assert "error" not in lead(lib, sid)
    assert lib(lib.fns.stop(sid=sid, principal="p", owner=""))["stopped"] is True
    res = end(lib, sid, token)
    assert "goes_on" not in res and res["ended"] == "t_1", res
    ended = [json.loads(x) for x in r.lrange(keys.of(sid, keys.OUTBOX), 0, -1) if '"turn.end"' in x]
    assert ended[0]["outcome"] == "stopped" and types(r, sid).index("assistant.msg") < types(r, sid).index("turn.end")


def test_nothing_carried_ends_as_before_and_says_last_0(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    assert "error" not in lead(lib, sid)
    res = end(lib, sid, token, carry=False)
    assert res["last"] == 0 and "goes_on" not in res and res["ended"] == "t_1", res
    assert "assistant.msg" not in types(r, sid)


def test_a_refused_call_records_nothing_and_ends_nothing(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    seq = r.hget(keys.session(sid), "seq")
    for ops, code in (([CLOSE_LEADS], "fenced"), ([CLOSE_LEADS, ("hset", ":nope", "f", "v")], "invalid"),
                      ([("spend", "", "", "0.1")], "invalid")):
        res = end(lib, sid, token + "0" if code == "fenced" else token, ops=ops)
        assert res.get("error") == code, (ops, res)
    assert r.hget(keys.session(sid), "seq") == seq and r.hget(keys.session(sid), "turn_id") == "t_1"
    assert closed_flag(r, sid) == "0" and "error" not in lead(lib, sid)
