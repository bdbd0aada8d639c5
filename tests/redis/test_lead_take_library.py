"""Leads taken by the record of a safe boundary (``cox_emit``'s ``take_leads`` op), in the
library on a real Redis (no runner).

At a boundary with a Lead saved the runner skips the response's unstarted calls and applies
the Leads. It did that in two calls: a record of the skips (with whatever waited to be
recorded: the response, the last call's result) and a ``cox_take_leads`` of their own, so the
Lead reached the log a round trip after the boundary. The op takes them in the record's own
call, after its events, with that function's promise exactly (every Lead saved before it, marked
applied, each a user message, then one ``lead.applied``, none after it), under the same fence,
and only where a holder records (never in ``cox_turn_end``'s carried record). Whole turns:
tests/stack/test_lead.py.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from cox_runner.recorder import take_leads_op
from coxswain import keys
from tests.redis.test_idempotent_library import busy_session
from tests.redis.test_lead_close_library import lead, types
from tests.support.library import Library


def boundary(lib: Library, sid: str, token: str, ops: list[tuple[str, str, str, str]] | None = None) -> dict[str, Any]:
    """A call's result and the next call skipped, recorded with the op (or ``ops``)."""
    result = json.dumps({"type": "tool.result", "sid": sid, "turn_id": "t_1", "call_id": "c1", "ok": True,
                         "output": "listing"})
    skipped = json.dumps({"type": "tool.skipped", "sid": sid, "turn_id": "t_1", "call_id": "c2", "reason": "lead"})
    return dict(lib(lib.fns.emit(sid=sid, token=token, owner="",
                                 ops=[take_leads_op("t_1")] if ops is None else ops, events=[result, skipped])))


def logged(r: redis.Redis, sid: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in r.lrange(keys.of(sid, keys.OUTBOX), 0, -1)]


def test_the_leads_saved_before_the_record_are_taken_after_its_events_in_the_same_call(
        r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    first, second = lead(lib, sid), lead(lib, sid)
    res = boundary(lib, sid, token)
    ids = [first["lead_id"], second["lead_id"]]
    texts = [json.loads(str(r.hget(keys.of(sid, ":leads"), i)))["text"] for i in ids]
    assert [(x["lead_id"], x["text"]) for x in res["taken"]] == list(zip(ids, texts, strict=True)), res
    assert res["leads"] == 0, "nothing waits once they are taken"
    evs = logged(r, sid)
    tail = evs[-5:]
    assert [e["type"] for e in tail] == ["tool.result", "tool.skipped", "user.msg", "user.msg", "lead.applied"], tail
    assert [e["message_id"] for e in tail[2:4]] == ids and all(e["via"] == "lead" for e in tail[2:4])
    assert tail[4]["lead_ids"] == ids and tail[4]["turn_id"] == "t_1"
    seqs = [e["seq"] for e in evs]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "no gap, no repeat"
    assert r.llen(keys.of(sid, ":leadq")) == 0
    states = {k: json.loads(v)["state"] for k, v in r.hgetall(keys.of(sid, ":leads")).items()}
    assert states == {i: "applied" for i in ids}, states
    # a Lead saved after the record is not taken by it: it waits for the next boundary
    late = lead(lib, sid)
    assert "error" not in late
    again = boundary(lib, sid, token, ops=[])
    assert again["leads"] == 1 and "taken" not in again, again


def test_with_no_lead_waiting_the_record_is_made_and_nothing_is_taken(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    res = boundary(lib, sid, token)
    assert "taken" not in res and res["leads"] == 0, res
    assert types(r, sid)[-2:] == ["tool.result", "tool.skipped"]
    assert "lead.applied" not in types(r, sid)


def test_a_fenced_record_takes_nothing_and_records_nothing(r: redis.Redis, lib: Library) -> None:
    sid, _ = busy_session(lib)
    lead(lib, sid)
    before = types(r, sid)
    res = boundary(lib, sid, "999")
    assert res.get("error") == "fenced", res
    assert types(r, sid) == before
    assert r.llen(keys.of(sid, ":leadq")) == 1, "the Lead still waits for the lease's holder"


def test_only_a_holder_takes_leads_and_never_in_a_turns_end(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    lead(lib, sid)
    res = boundary(lib, sid, "")
    assert res.get("error") == "invalid" and "lease" in res.get("detail", ""), res
    before = types(r, sid)
    ended = lib(lib.fns.turn_end(sid=sid, token=token, owner="", end_body="", next_turn_id="t_2", lease_ms=5000,
                                 plan="", handoff="", hold_next="", agents_md="", ops=[take_leads_op("t_1")]))
    assert ended.get("error") == "invalid", ended
    assert types(r, sid) == before and r.llen(keys.of(sid, ":leadq")) == 1
