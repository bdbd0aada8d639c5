"""Idempotent transitions: a retried call whose first attempt ran answers the first attempt's reply.

Two parts. The library's semantics, called directly on a real Redis (no runner): a transition
id answered twice runs once, even after the state moved on; a lost batch of the outbox is handed
again only while its publish lock is still the caller's; the kept reply expires and lives in the
session's slot. Then whole stacks whose runner drops a reply after Redis ran the call
(``COX_FAULT_DROP_REPLY``, docs/operations.md): the turn goes on as if nothing happened.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from cox_runner.redis.store import LIBRARY
from coxswain import keys

from .logcheck import log_of, replay
from .runners import records
from .stack import Api, Stack, library_redis, script, stack_fixture

# ---------------------------------------------------------------------------------------------
# The library, on a real Redis


@pytest.fixture(scope="module")
def r(tmp_path_factory: pytest.TempPathFactory) -> Iterator[redis.Redis]:
    yield from library_redis(tmp_path_factory.mktemp("idem-redis"))


def call(r: redis.Redis, fn: str, sid: str, *args: str, tx: str = "") -> list[str]:
    """One FCALL, the transition id last (as cox_runner.redis.store sends it)."""
    return list(r.fcall(fn, 1, keys.session(sid), sid, *args, tx))  # type: ignore[arg-type]


def head(res: list[str]) -> dict[str, Any]:
    return dict(json.loads(res[0]))


_n = 0


def busy_session(r: redis.Redis, queued: int = 0) -> tuple[str, str]:
    """A session with a turn running (its lease token) and ``queued`` messages waiting."""
    global _n
    _n += 1
    sid = f"s_idem{_n}"
    body = json.dumps({"type": "session.created", "sid": sid, "workspace": "/w", "model": "script"})
    r.fcall("cox_create", 2, keys.session(sid), keys.principal("p"), sid, "p", "/w", "script", "", body, "",
            "")  # type: ignore[arg-type]
    sent = head(call(r, "cox_send", sid, "p", "m_1", "first", "", "", "r_1", "5000", "t_1", "", "", ""))
    assert sent["disposition"] == "started", sent
    for i in range(queued):
        call(r, "cox_send", sid, "p", f"m_q{i}", f"queued {i}", "queue", "", "r_1", "5000", f"t_q{i}", "", "", "")
    return sid, str(sent["token"])


def turn_end(r: redis.Redis, sid: str, token: str, next_turn: str, tx: str, owner: str = "") -> list[str]:
    end = json.dumps({"type": "turn.end", "sid": sid, "turn_id": "x", "outcome": "completed"})
    return call(r, "cox_turn_end", sid, token, owner, end, next_turn, "5000", "", "", "", "", tx=tx)


def state(r: redis.Redis, sid: str) -> tuple[Any, ...]:
    base = keys.session(sid)
    return (r.hget(base, "seq"), r.hget(base, "turn_id"), r.get(base + keys.LEASE), r.llen(base + keys.QUEUE),
            r.llen(base + keys.OUTBOX))


def test_a_turn_end_answered_twice_runs_once_even_after_the_lease_moved_on(r: redis.Redis) -> None:
    sid, token = busy_session(r, queued=1)
    first = turn_end(r, sid, token, "t_2", tx="x_end1")
    h = head(first)
    assert h["next"]["message_id"] == "m_q0" and h["turn_id"] == "t_2", h
    after = state(r, sid)
    again = turn_end(r, sid, token, "t_2", tx="x_end1")
    assert again[0] == first[0], "the retry must get the first attempt's reply, byte for byte"
    assert state(r, sid) == after, "the retry ran the transition again"
    # The turn that started ends too (no next: the session goes idle, the lease is dropped) ...
    assert head(turn_end(r, sid, token, "t_3", tx="x_end2"))["next"] is None
    assert r.get(keys.session(sid) + keys.LEASE) is None
    idle = state(r, sid)
    # ... and the first call's retry still gets its own answer, not "fenced".
    assert turn_end(r, sid, token, "t_2", tx="x_end1")[0] == first[0]
    assert state(r, sid) == idle
    # A new transition under the old token is refused as ever.
    assert head(turn_end(r, sid, token, "t_4", tx="x_end3")).get("error") == "fenced"


def test_an_emit_answered_twice_records_its_events_once(r: redis.Redis) -> None:
    sid, token = busy_session(r)
    ev = json.dumps({"type": "agent.message", "sid": sid, "turn_id": "t_1", "text": "hello"})
    args = (token, "", "1", "hset", "", "note", "1", ev, ev)
    first = head(call(r, "cox_emit", sid, *args, tx="x_emit"))
    seq = r.hget(keys.session(sid), "seq")
    assert first["last"] == first["first"] + 1 == int(seq or 0)
    assert head(call(r, "cox_emit", sid, *args, tx="x_emit")) == first
    assert r.hget(keys.session(sid), "seq") == seq
    # Without a transition id a call runs each time (and keeps nothing).
    before = set(r.scan_iter(keys.session(sid) + keys.TX + "*"))
    call(r, "cox_emit", sid, *args)
    call(r, "cox_emit", sid, *args)
    assert int(r.hget(keys.session(sid), "seq") or 0) == int(seq or 0) + 4
    assert set(r.scan_iter(keys.session(sid) + keys.TX + "*")) == before


def test_a_lost_batch_is_handed_again_only_while_the_publish_lock_is_the_callers(r: redis.Redis) -> None:
    sid, token = busy_session(r)
    base = keys.session(sid)
    r.delete(base + keys.PUBLOCK, base + keys.OUTBOX)  # as if everything so far was published
    ev = json.dumps({"type": "agent.message", "sid": sid, "turn_id": "t_1", "text": "batch"})
    first = call(r, "cox_emit", sid, token, "o_1", "0", ev, tx="x_pub")
    assert len(first) == 2 and r.get(base + keys.PUBLOCK) == "o_1", "the first attempt took the lock"
    r.pexpire(base + keys.PUBLOCK, 100)
    again = call(r, "cox_emit", sid, token, "o_1", "0", ev, tx="x_pub")
    assert again == first, "the caller never got its batch: it is handed again"
    assert int(r.pttl(base + keys.PUBLOCK)) > 1000, "and the lock renewed for it"
    r.set(base + keys.PUBLOCK, "o_2")  # the lock lapsed and another process publishes now
    assert call(r, "cox_emit", sid, token, "o_1", "0", ev, tx="x_pub") == first[:1]
    r.delete(base + keys.PUBLOCK)  # or it was published and the lock freed
    assert call(r, "cox_emit", sid, token, "o_1", "0", ev, tx="x_pub") == first[:1]
    assert r.llen(base + keys.OUTBOX) == 1


def test_a_call_that_forgot_its_transition_id_is_refused_not_cut_short(r: redis.Redis) -> None:
    sid, token = busy_session(r)
    ev = json.dumps({"type": "agent.message", "sid": sid, "turn_id": "t_1", "text": "last"})
    seq = r.hget(keys.session(sid), "seq")
    res = r.fcall("cox_emit", 1, keys.session(sid), sid, token, "", "0", ev)  # type: ignore[arg-type]
    assert json.loads(res[0]).get("error") == "invalid"
    assert r.hget(keys.session(sid), "seq") == seq


def test_a_kept_reply_expires_and_lives_in_the_sessions_slot(r: redis.Redis) -> None:
    sid, token = busy_session(r)
    head(call(r, "cox_close_leads", sid, token, tx="x_keep"))
    k = keys.tx(sid, "x_keep")
    assert 0 < int(r.pttl(k)) <= keys.TX_KEEP_MS
    assert key_slot(k.encode()) == key_slot(keys.session(sid).encode())
    assert f"local TX_KEEP_MS = {keys.TX_KEEP_MS}\n" in LIBRARY, "keys.TX_KEEP_MS mirrors the library"


def test_a_refusal_is_kept_too_so_a_retry_cannot_turn_it_into_a_start(r: redis.Redis) -> None:
    """The first attempt of a plain send to a busy session was refused: its retry gets the same
    refusal even once the session went idle, and nothing starts behind the caller's back."""
    sid, token = busy_session(r)
    args = ("p", "m_2", "second", "", "", "r_1", "5000", "t_2", "", "", "")
    assert head(call(r, "cox_send", sid, *args, tx="x_busy")).get("error") == "busy"
    turn_end(r, sid, token, "t_9", tx="")
    assert head(call(r, "cox_send", sid, *args, tx="x_busy")).get("error") == "busy"
    assert r.hget(keys.session(sid), "busy") == "0"


# ---------------------------------------------------------------------------------------------
# Whole stacks, a reply dropped after Redis ran the call

FAULTS = {"COX_TEST_FAULTS": "1"}


def ok(resp: Any, status: int = 202) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    return dict(resp.json())


def work(label: str) -> str:
    """A turn with a tool round (a written file) that runs long enough for a message to queue."""
    return script({"text": f"{label}: writing", "delay_ms": 400,
                   "tools": [{"name": "write_file", "args": {"path": f"{label}.txt", "content": label}}]},
                  {"text": f"{label} done"}, text=label)


def retried(stack: Stack) -> list[dict[str, Any]]:
    return [rec for name in stack.runner_names() for rec in records(stack, name)
            if rec.get("event") in ("redis.call_retry", "redis.call_failed", "drive.store_down", "drive.lease_lost")]


def shape(evs: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """A log with ids and times taken out: what two runs of the same messages must share."""
    return [(e["type"], e.get("outcome", ""), e.get("via", ""), e.get("name", ""), str(e.get("ok", "")))
            for e in evs if e["type"] not in ("assistant.delta", "usage")]


def run_two(api: Api, name: str) -> tuple[str, list[dict[str, Any]]]:
    """A session, a message that starts and one queued behind it; both run to their end."""
    sid = api.create(name)["id"]
    a = ok(api.send(sid, work("one")))
    assert a["disposition"] == "started", a
    b = ok(api.send(sid, work("two"), mode="queue"))
    assert b["disposition"] == "queued", b
    api.wait_idle(sid, timeout=30)
    evs = log_of(api, sid)
    rep = replay(evs)
    assert rep.starts == [a["message_id"], b["message_id"]]
    assert sorted(rep.ends.values()) == ["completed", "completed"], rep.ends
    assert [e["type"] for e in evs].count("turn.end") == 2
    ws = Path(api.session(sid)["workspace"])
    assert (ws / "one.txt").read_text() == "one" and (ws / "two.txt").read_text() == "two"
    return sid, evs


turn_end_dropped = stack_fixture("idem-turn-end", runners=1,
                                 runner_env={**FAULTS, "COX_FAULT_DROP_REPLY": "cox_turn_end:1"})


def test_a_lost_turn_end_reply_no_longer_crashes_the_next_message(turn_end_dropped: Stack) -> None:
    """The first turn_end ran (turn 1 ended, the queued message began in the same call) and its
    reply was lost: the retry gets that reply, so the runner runs the begun turn, not a takeover."""
    with turn_end_dropped.client() as api:
        sid, evs = run_two(api, "lost-turn-end")
        seen = retried(turn_end_dropped)
        assert [(x["event"], x["fn"]) for x in seen] == [("redis.call_retry", "cox_turn_end")], seen
        # the next message on the same session runs as usual
        c = ok(api.send(sid, "three"))
        st = api.wait_type(sid, "turn.start", message_id=c["message_id"], after=evs[-1]["seq"])
        assert api.wait_type(sid, "turn.end", turn_id=st["turn_id"])["outcome"] == "completed"
        replay(log_of(api, sid))


begin_and_emit_dropped = stack_fixture("idem-begin-emit", runners=1, runner_env={
    **FAULTS, "COX_FAULT_DROP_REPLY": "cox_send:1,cox_emit:2,cox_emit:3,cox_op_begin:1"})


def test_lost_replies_of_a_begin_and_of_an_emit_record_nothing_twice(begin_and_emit_dropped: Stack) -> None:
    """The first send (it began the turn) and the second emit (twice in a row) ran, their replies
    lost: the send is still answered 202 started and its turn runs; the log is the same as a clean
    run of the same messages on the same runner: no event twice, no gap, every turn completed."""
    stack = begin_and_emit_dropped
    with stack.client() as api:
        _, faulted = run_two(api, "lost-begin-emit")
        seen = retried(stack)
        assert sorted((x["event"], x["fn"], x["attempt"]) for x in seen if x["fn"] != "cox_op_begin") == [
            ("redis.call_retry", "cox_emit", 1), ("redis.call_retry", "cox_emit", 2),
            ("redis.call_retry", "cox_send", 1)], seen
        _, clean = run_two(api, "clean")  # the plan is used up: nothing is dropped now
        assert len(retried(stack)) == len(seen)
        assert shape(faulted) == shape(clean)


def test_a_lost_reply_of_a_persons_short_lease_leaves_no_session_stuck_busy(begin_and_emit_dropped: Stack) -> None:
    """A ``!command`` on an idle session takes a short lease (cox_op_begin) whose reply is lost:
    the retry gets the token the first attempt took (not 409 busy from its own lease), so the
    command runs under it and the session is idle again at once, not after a takeover."""
    stack = begin_and_emit_dropped
    with stack.client() as api:
        sid = api.create("lost-op-begin")["id"]
        r = api.http.post(f"/v1/sessions/{sid}/observe", json={"command": "printf observed-once"})
        assert r.status_code == 202, r.text
        assert api.session(sid)["busy"] is False, "the person's lease was released with the command's end"
        evs = log_of(api, sid)
        assert [e["output"] for e in evs if e["type"] == "observed"] == ["exit code 0\nobserved-once"]
        seen = [x for x in retried(stack) if x.get("fn") == "cox_op_begin"]
        assert [(x["event"], x["attempt"]) for x in seen] == [("redis.call_retry", 1)], seen
        assert not [x for x in records(stack, stack.runner_names()[0]) if x.get("event") == "lease.claimed"]
