"""Idempotent transitions in the library, called directly on a real Redis (no runner): a transition
id answered twice runs once, even after the state moved on; a lost batch of the outbox is handed
again only while its publish lock is still the caller's; the kept reply expires and lives in the
session's slot. (Whole stacks whose runner drops a reply: tests/stack/test_idempotent.py.)
"""

from __future__ import annotations

import json
from typing import Any

import redis
from redis.crc import key_slot

from cox_runner.redis.fns import Sent, StateOp
from cox_runner.redis.store import LIBRARY
from coxswain import keys
from tests.support.library import Library

_n = 0


def busy_session(lib: Library, queued: int = 0) -> tuple[str, str]:
    """A session with a turn running (its lease token) and ``queued`` messages waiting."""
    sid = lib.create("s_idem")
    sent = send(lib, sid, "m_1", "first", "", "t_1")
    assert sent["disposition"] == "started", sent
    for i in range(queued):
        send(lib, sid, f"m_q{i}", f"queued {i}", "queue", f"t_q{i}")
    return sid, str(sent["token"])


def send(lib: Library, sid: str, message_id: str, text: str, mode: str, turn_id: str, tx: str = "") -> Sent:
    return lib(lib.fns.send(sid=sid, principal="p", message_id=message_id, text=text, mode=mode, client_id="",
                            runner="r_1", lease_ms=5000, turn_id=turn_id, owner="", models="", agents_md=""), tx=tx)


def turn_end(lib: Library, sid: str, token: str, next_turn: str, tx: str, owner: str = "") -> list[str]:
    """The whole reply (its head first), to compare a retry's byte for byte."""
    end = json.dumps({"type": "turn.end", "sid": sid, "turn_id": "x", "outcome": "completed"})
    lib(lib.fns.turn_end(sid=sid, token=token, owner=owner, end_body=end, next_turn_id=next_turn, lease_ms=5000,
                         plan="", handoff="", hold_next="", agents_md=""), tx=tx)
    return lib.raw


def head(res: list[str]) -> dict[str, Any]:
    return dict(json.loads(res[0]))


def emit(lib: Library, sid: str, token: str, owner: str, ops: list[StateOp], events: list[str],
         tx: str = "") -> list[str]:
    lib(lib.fns.emit(sid=sid, token=token, owner=owner, ops=ops, events=events), tx=tx)
    return lib.raw


def state(r: redis.Redis, sid: str) -> tuple[Any, ...]:
    base = keys.session(sid)
    return (r.hget(base, "seq"), r.hget(base, "turn_id"), r.get(base + keys.LEASE), r.llen(base + keys.QUEUE),
            r.llen(base + keys.OUTBOX))


def test_a_turn_end_answered_twice_runs_once_even_after_the_lease_moved_on(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib, queued=1)
    first = turn_end(lib, sid, token, "t_2", tx="x_end1")
    h = head(first)
    assert h["next"]["message_id"] == "m_q0" and h["turn_id"] == "t_2", h
    after = state(r, sid)
    again = turn_end(lib, sid, token, "t_2", tx="x_end1")
    assert again[0] == first[0], "the retry must get the first attempt's reply, byte for byte"
    assert state(r, sid) == after, "the retry ran the transition again"
    # The turn that started ends too (no next: the session goes idle, the lease is dropped) ...
    assert head(turn_end(lib, sid, token, "t_3", tx="x_end2"))["next"] is None
    assert r.get(keys.session(sid) + keys.LEASE) is None
    idle = state(r, sid)
    # ... and the first call's retry still gets its own answer, not "fenced".
    assert turn_end(lib, sid, token, "t_2", tx="x_end1")[0] == first[0]
    assert state(r, sid) == idle
    # A new transition under the old token is refused as ever.
    assert head(turn_end(lib, sid, token, "t_4", tx="x_end3")).get("error") == "fenced"


def test_an_emit_answered_twice_records_its_events_once(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    ev = json.dumps({"type": "agent.message", "sid": sid, "turn_id": "t_1", "text": "hello"})
    ops: list[StateOp] = [("hset", "", "note", "1")]
    first = head(emit(lib, sid, token, "", ops, [ev, ev], tx="x_emit"))
    seq = r.hget(keys.session(sid), "seq")
    assert first["last"] == first["first"] + 1 == int(seq or 0)
    assert head(emit(lib, sid, token, "", ops, [ev, ev], tx="x_emit")) == first
    assert r.hget(keys.session(sid), "seq") == seq
    # Without a transition id a call runs each time (and keeps nothing).
    before = set(r.scan_iter(keys.session(sid) + keys.TX + "*"))
    emit(lib, sid, token, "", ops, [ev, ev])
    emit(lib, sid, token, "", ops, [ev, ev])
    assert int(r.hget(keys.session(sid), "seq") or 0) == int(seq or 0) + 4
    assert set(r.scan_iter(keys.session(sid) + keys.TX + "*")) == before


def test_a_lost_batch_is_handed_again_only_while_the_publish_lock_is_the_callers(r: redis.Redis,
                                                                                   lib: Library) -> None:
    sid, token = busy_session(lib)
    base = keys.session(sid)
    r.delete(base + keys.PUBLOCK, base + keys.OUTBOX)  # as if everything so far was published
    ev = json.dumps({"type": "agent.message", "sid": sid, "turn_id": "t_1", "text": "batch"})
    first = emit(lib, sid, token, "o_1", [], [ev], tx="x_pub")
    assert len(first) == 2 and r.get(base + keys.PUBLOCK) == "o_1", "the first attempt took the lock"
    r.pexpire(base + keys.PUBLOCK, 100)
    again = emit(lib, sid, token, "o_1", [], [ev], tx="x_pub")
    assert again == first, "the caller never got its batch: it is handed again"
    assert int(r.pttl(base + keys.PUBLOCK)) > 1000, "and the lock renewed for it"
    r.set(base + keys.PUBLOCK, "o_2")  # the lock lapsed and another process publishes now
    assert emit(lib, sid, token, "o_1", [], [ev], tx="x_pub") == first[:1]
    r.delete(base + keys.PUBLOCK)  # or it was published and the lock freed
    assert emit(lib, sid, token, "o_1", [], [ev], tx="x_pub") == first[:1]
    assert r.llen(base + keys.OUTBOX) == 1


def test_a_call_that_forgot_its_transition_id_is_refused_not_cut_short(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    ev = json.dumps({"type": "agent.message", "sid": sid, "turn_id": "t_1", "text": "last"})
    seq = r.hget(keys.session(sid), "seq")
    # Raw on purpose: the facade (and cox_runner.redis.store) always sends the id; this is the library's
    # own check of a caller that does not (counted in tests/fast/test_contract.py).
    res = r.fcall("cox_emit", 1, keys.session(sid), sid, token, "", "0", ev)
    assert json.loads(res[0]).get("error") == "invalid"
    assert r.hget(keys.session(sid), "seq") == seq


def test_a_kept_reply_expires_and_lives_in_the_sessions_slot(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    assert lib(lib.fns.close_leads(sid=sid, token=token), tx="x_keep")["closed"]
    k = keys.tx(sid, "x_keep")
    assert 0 < int(r.pttl(k)) <= keys.TX_KEEP_MS
    assert key_slot(k.encode()) == key_slot(keys.session(sid).encode())
    assert f"local TX_KEEP_MS = {keys.TX_KEEP_MS}\n" in LIBRARY, "keys.TX_KEEP_MS mirrors the library"


def test_a_refusal_is_kept_too_so_a_retry_cannot_turn_it_into_a_start(r: redis.Redis, lib: Library) -> None:
    """The first attempt of a plain send to a busy session was refused: its retry gets the same
    refusal even once the session went idle, and nothing starts behind the caller's back."""
    sid, token = busy_session(lib)
    assert send(lib, sid, "m_2", "second", "", "t_2", tx="x_busy").get("error") == "busy"
    turn_end(lib, sid, token, "t_9", tx="")
    assert send(lib, sid, "m_2", "second", "", "t_2", tx="x_busy").get("error") == "busy"
    assert r.hget(keys.session(sid), "busy") == "0"


def test_a_transition_another_caller_made_answers_its_reply_marked_and_runs_nothing(r: redis.Redis,
                                                                                      lib: Library) -> None:
    """A request the gateway sent to a late home and then to another runner carries one transition
    id to both, each runner's call naming itself (``x_<id>.<by>``): the first call makes the send;
    the second, whenever it comes, answers the same reply marked ``tx_replay`` and changes
    nothing (no second message, turn or lease); the first caller's own retry gets its reply as it
    was, unmarked (it must still act on it)."""
    sid = lib.create("s_two")
    base = keys.session(sid)
    first = send(lib, sid, "m_1", "once", "", "t_1", tx="x_req1.c_home")
    assert first["disposition"] == "started", first
    raw_first = lib.raw[0]
    after = state(r, sid)
    other = send(lib, sid, "m_2", "once", "", "t_2", tx="x_req1.c_other")
    assert other.get("tx_replay") is True, other
    assert {k: v for k, v in other.items() if k != "tx_replay"} == first, "the first call's reply"
    assert state(r, sid) == after, "the second caller's call changed something"
    own = send(lib, sid, "m_3", "once", "", "t_3", tx="x_req1.c_home")
    assert lib.raw[0] == raw_first and "tx_replay" not in own, "the same caller's retry: its reply as it was"
    # once the first turn ended, a late second call still answers the first reply, starting nothing
    turn_end(lib, sid, str(first["token"]), "t_9", tx="")
    idle = state(r, sid)
    late = send(lib, sid, "m_4", "once", "", "t_4", tx="x_req1.c_late")
    assert late.get("tx_replay") is True and late["message_id"] == "m_1", late
    assert state(r, sid) == idle and r.hget(base, "busy") == "0"
    # a refusal is carried to the other caller as it was made (marked, still the error)
    sid2, _ = busy_session(lib)
    assert send(lib, sid2, "m_b", "busy", "", "t_b", tx="x_req2.c_a").get("error") == "busy"
    again = send(lib, sid2, "m_b", "busy", "", "t_b", tx="x_req2.c_b")
    assert again.get("error") == "busy" and again.get("tx_replay") is True, again


def test_a_transition_id_naming_its_caller_is_read_whole(r: redis.Redis, lib: Library) -> None:
    sid = lib.create("s_txid")
    seq = r.hget(keys.session(sid), "seq")
    for bad in ("x_a.", "x_a.b.c", "x_a.b c", "x_.b", "y_a.b"):
        assert send(lib, sid, "m_1", "x", "", "t_1", tx=bad).get("error") == "invalid", bad
    assert r.hget(keys.session(sid), "seq") == seq, "a refused id changed the session"
    assert send(lib, sid, "m_1", "x", "", "t_1", tx="x_a.c_b-1")["disposition"] == "started"


def test_a_not_found_is_not_kept_so_the_same_request_runs_once_its_session_is_back(r: redis.Redis,
                                                                                    lib: Library) -> None:
    """A request for an archived session finds none (``not_found``, nothing ran); the runner
    loads the session back and runs the same request again under the same transition id, which
    must then run, not answer the kept refusal (CI's archive drills: 404 for a send to an
    archived session)."""
    sid = "s_back1"
    assert send(lib, sid, "m_1", "x", "", "t_1", tx="x_arch.c_a").get("error") == "not_found"
    assert r.exists(keys.tx(sid, "x_arch")) == 0
    body = json.dumps({"type": "session.created", "sid": sid, "workspace": "/w", "model": "script"})
    lib(lib.fns.create(sid=sid, principal="p", workspace="/w", model="script", title="", body=body, owner=""))
    assert send(lib, sid, "m_1", "x", "", "t_1", tx="x_arch.c_a")["disposition"] == "started"
    again = send(lib, sid, "m_2", "x", "", "t_2", tx="x_arch.c_b")
    assert again.get("tx_replay") is True and again["message_id"] == "m_1", again
