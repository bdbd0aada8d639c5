"""Lead admission closed by the turn's final response's own record (``cox_emit``'s ``close_leads``
op), in the library on a real Redis (no runner).

A response that asks for no call ends the turn unless a Lead waits; the runner closes Lead
admission before the turn's final work, atomically with the look for a saved Lead (docs/design.md,
"The turn loop"). The op does it in the call that records the response, one call fewer a turn:
it must keep ``cox_close_leads``'s promise exactly: a Lead saved before the record stays open to be
applied (and later ones are admitted), one after it is refused ``lead_closed``, a Stop closes
whatever waits, and a record that is refused closes nothing. Whole turns: tests/stack/test_lead.py.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from cox_runner.recorder import CLOSE_LEADS, take_leads_op
from coxswain import keys
from tests.redis.test_idempotent_library import busy_session
from tests.support.library import Library

_n = 0


def lead(lib: Library, sid: str) -> dict[str, Any]:
    global _n
    _n += 1
    return dict(lib(lib.fns.lead(sid=sid, principal="p", lead_id=f"l_{_n}", text=f"lead {_n}", client_id="",
                                 max_pending=8, owner="", want_turn="")))


def final(lib: Library, sid: str, token: str, ops: list[tuple[str, str, str, str]] | None = None) -> dict[str, Any]:
    """The turn's last response recorded with the op (or ``ops``)."""
    msg = json.dumps({"type": "assistant.msg", "sid": sid, "turn_id": "t_1", "text": "done", "tool_calls": []})
    return dict(lib(lib.fns.emit(sid=sid, token=token, owner="", ops=[CLOSE_LEADS] if ops is None else ops,
                                 events=[msg])))


def closed_flag(r: redis.Redis, sid: str) -> Any:
    return r.hget(keys.session(sid), "lead_closed")


def types(r: redis.Redis, sid: str) -> list[str]:
    return [json.loads(x)["type"] for x in r.lrange(keys.of(sid, keys.OUTBOX), 0, -1)]


def test_with_nothing_waiting_the_response_closes_admission_and_a_later_lead_is_refused(
        r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    res = final(lib, sid, token)
    assert res["closed"] is True and res["leads"] == 0, res
    assert closed_flag(r, sid) == "1"
    assert types(r, sid)[-1] == "assistant.msg", "the response is recorded with the close"
    late = lead(lib, sid)
    assert late.get("error") == "lead_closed", late
    assert "lead.saved" not in types(r, sid)


def test_a_lead_saved_before_the_response_keeps_admission_open(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    assert "error" not in lead(lib, sid)
    res = final(lib, sid, token)
    assert res["closed"] is False and res["leads"] == 1, res
    assert closed_flag(r, sid) == "0", "the saved Lead is applied next: the turn goes on"
    assert "error" not in lead(lib, sid), "and Leads are still admitted while it does"
    # once the Leads are taken, the next final response closes as before
    lib(lib.fns.emit(sid=sid, token=token, owner="", ops=[take_leads_op("t_1")], events=[]))
    assert final(lib, sid, token)["closed"] is True


def test_a_stop_closes_admission_whatever_waits(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    assert "error" not in lead(lib, sid)
    assert lib(lib.fns.stop(sid=sid, principal="p", owner=""))["stopped"] is True
    res = final(lib, sid, token)
    assert res["closed"] is True, res
    assert closed_flag(r, sid) == "1"


def test_a_record_without_the_op_says_nothing_of_closing(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    res = final(lib, sid, token, ops=[])
    assert res["closed"] is False, res
    assert closed_flag(r, sid) == "0"
    assert "error" not in lead(lib, sid)


def test_a_refused_record_closes_nothing(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    seq = r.hget(keys.session(sid), "seq")
    fenced = final(lib, sid, token + "0")
    assert fenced.get("error") == "fenced", fenced
    unleased = final(lib, sid, "")
    assert unleased.get("error") == "invalid" and "lease" in unleased["detail"], unleased
    bad = final(lib, sid, token, ops=[CLOSE_LEADS, ("hset", ":nope", "f", "v")])
    assert bad.get("error") == "invalid", bad
    assert closed_flag(r, sid) == "0" and r.hget(keys.session(sid), "seq") == seq, "nothing recorded, nothing closed"
    assert "error" not in lead(lib, sid)
