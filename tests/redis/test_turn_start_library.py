"""The calls that begin a turn hand its runner the session, and a turn's end checks its calls.

Performance work (issue #23) took two reads off every turn's start and end; these are what the
runner now relies on instead, in the library on a real Redis (no runner):

- ``cox_send`` that starts a turn and ``cox_turn_end`` that starts the next one answer ``info``,
  the session hash as the turn began (read in the same atomic call, so it holds the turn's id and
  an empty stop flag), and the turn reads nothing more at its start;
- ``cox_turn_end`` refuses ``open_calls`` (and changes nothing) while a call of the turn has no
  result: the runner then closes the calls and ends the turn again, so a turn whose calls all
  closed needs no read of ``:open`` before its end.
"""

from __future__ import annotations

import json
from typing import Any

import redis

from coxswain import keys
from tests.support.library import Library

_n = 0


def new_session(lib: Library) -> str:
    sid = lib.create("s_start")
    return sid


def send(lib: Library, sid: str, message_id: str, mode: str, turn_id: str) -> dict[str, Any]:
    return dict(lib(lib.fns.send(sid=sid, principal="p", message_id=message_id, text=f"text of {message_id}",
                                 mode=mode, client_id="", runner="r_1", lease_ms=5000, turn_id=turn_id, owner="",
                                 models="", agents_md="")))


def end(lib: Library, sid: str, token: str, turn_id: str, next_turn: str) -> dict[str, Any]:
    body = json.dumps({"type": "turn.end", "sid": sid, "turn_id": turn_id, "outcome": "completed",
                       "finish_reason": None, "detail": None})
    return dict(lib(lib.fns.turn_end(sid=sid, token=token, owner="", end_body=body, next_turn_id=next_turn,
                                     lease_ms=5000, plan="", handoff="", hold_next="", agents_md="")))


def test_a_send_that_starts_a_turn_hands_over_the_session_as_it_began(r: redis.Redis, lib: Library) -> None:
    sid = new_session(lib)
    sent = send(lib, sid, "m_1", "", "t_1")
    assert sent["disposition"] == "started"
    assert sent["info"] == r.hgetall(keys.session(sid)), "the reply is the hash, whole and as it is now"
    assert sent["info"]["turn_id"] == "t_1" and sent["info"]["stop"] == "" and sent["info"]["workspace"] == "/w"
    queued = send(lib, sid, "m_2", "queue", "t_x")
    assert queued["disposition"] == "queued" and "info" not in queued, "a queued message begins no turn"


def test_a_turn_end_that_starts_the_next_turn_hands_over_the_session(r: redis.Redis, lib: Library) -> None:
    sid = new_session(lib)
    token = str(send(lib, sid, "m_1", "", "t_1")["token"])
    send(lib, sid, "m_2", "queue", "t_x")
    nxt = end(lib, sid, token, "t_1", "t_2")
    assert nxt["next"]["message_id"] == "m_2" and nxt["turn_id"] == "t_2"
    assert nxt["info"] == r.hgetall(keys.session(sid))
    assert nxt["info"]["turn_id"] == "t_2" and nxt["info"]["message_id"] == "m_2"
    idle = end(lib, sid, token, "t_2", "t_3")
    assert idle["next"] is None and "info" not in idle, "going idle begins no turn"


def test_a_turn_with_a_call_still_open_is_not_ended(r: redis.Redis, lib: Library) -> None:
    sid = new_session(lib)
    token = str(send(lib, sid, "m_1", "", "t_1")["token"])
    send(lib, sid, "m_2", "queue", "t_x")
    call = json.dumps({"type": "tool.call", "sid": sid, "turn_id": "t_1", "call_id": "c_1", "name": "list_dir",
                       "args": {}})
    lib(lib.fns.emit(sid=sid, token=token, owner="", ops=[("hset", keys.OPEN_CALLS, "c_1", "list_dir")],
                     events=[call]))
    before = (r.hgetall(keys.session(sid)), r.lrange(keys.of(sid, keys.OUTBOX), 0, -1),
              r.lrange(keys.session(sid) + ":q", 0, -1))
    refused = end(lib, sid, token, "t_1", "t_2")
    assert refused["error"] == "open_calls", refused
    after = (r.hgetall(keys.session(sid)), r.lrange(keys.of(sid, keys.OUTBOX), 0, -1),
             r.lrange(keys.session(sid) + ":q", 0, -1))
    assert after == before, "a refused end changes nothing: no event, the turn and its queue as they were"
    result = json.dumps({"type": "tool.result", "sid": sid, "turn_id": "t_1", "call_id": "c_1", "ok": False,
                         "output": "Cancelled"})
    lib(lib.fns.emit(sid=sid, token=token, owner="", ops=[("hdel", keys.OPEN_CALLS, "c_1", "")], events=[result]))
    nxt = end(lib, sid, token, "t_1", "t_2")
    assert nxt["next"]["message_id"] == "m_2", "with its calls closed the turn ends and the queue runs on"
    types = [json.loads(x)["type"] for x in r.lrange(keys.of(sid, keys.OUTBOX), 0, -1)]
    assert types.index("tool.result") < types.index("turn.end")


def test_only_the_turn_a_blank_session_begins_first_is_fresh(r: redis.Redis, lib: Library) -> None:
    """``fresh``: the log holds nothing of the conversation before the message this turn began
    with, so the runner makes the transcript of that message alone (it reads no log). Said by the
    call that began the turn, once in a session's life; never after a turn, never on a fork."""
    sid = new_session(lib)
    first = send(lib, sid, "m_1", "", "t_1")
    assert first["disposition"] == "started" and first.get("fresh") is True, first
    send(lib, sid, "m_2", "queue", "t_x")
    nxt = end(lib, sid, str(first["token"]), "t_1", "t_2")
    assert nxt["next"]["message_id"] == "m_2" and not nxt.get("fresh"), "the second turn follows a first one"
    assert end(lib, sid, str(first["token"]), "t_2", "t_3")["next"] is None
    again = send(lib, sid, "m_3", "", "t_4")
    assert again["disposition"] == "started" and not again.get("fresh"), again


def test_a_fork_is_never_fresh_its_log_holds_the_source_conversation(r: redis.Redis, lib: Library) -> None:
    sid = "s_forked_fresh"
    copied = [json.dumps({"type": "user.msg", "sid": sid, "turn_id": "t_0", "message_id": "m_0", "text": "before",
                          "via": "send"}),
              json.dumps({"type": "assistant.msg", "sid": sid, "turn_id": "t_0", "text": "answered", "tool_calls": []})]
    body = json.dumps({"type": "session.created", "sid": sid, "workspace": "/w", "model": "script"})
    lib(lib.fns.fork(sid=sid, principal="p", workspace="/w", model="script", title="", owner="", body=body,
                     events=copied))
    sent = send(lib, sid, "m_1", "", "t_1")
    assert sent["disposition"] == "started" and not sent.get("fresh"), sent


def test_a_blank_session_s_first_turn_begun_after_a_persons_operation_is_fresh(r: redis.Redis, lib: Library) -> None:
    """A message queued behind a person's operation (an undo, a ``!command``) on a session that
    never had a turn begins when the operation ends: still the first turn."""
    sid = new_session(lib)
    op = lib(lib.fns.op_begin(sid=sid, principal="p", runner="r_1", lease_ms=5000, op="restore"))
    assert send(lib, sid, "m_1", "queue", "t_x")["disposition"] == "queued"
    nxt = end(lib, sid, str(op["token"]), "", "t_1")
    assert nxt["next"]["message_id"] == "m_1" and nxt.get("fresh") is True, nxt
