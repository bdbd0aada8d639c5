"""The outbox's publish lock in the library, on a real Redis (no runner): a call of the process
that holds the lock is handed what follows the batches that process was handed (marked
``CONTINUED``), never a seq twice or out of order, with another process's events between
included; a call of another process, or the sweeper's claim, is handed nothing while the lock is
held; ``cox_pub_done`` frees the lock and its high-water mark together. (The runner's side, whole
stacks: tests/stack/test_walking_skeleton.py and the fault tiers; the publisher:
tests/redis/test_outbox_publisher.py.)"""

from __future__ import annotations

import json

import redis

from cox_runner.redis.outbox import CONTINUED
from coxswain import keys
from tests.redis.test_idempotent_library import busy_session, emit
from tests.support.library import Library


def _seqs(batch: list[str]) -> list[int]:
    return [int(json.loads(e)["seq"]) for e in batch]


def _ev(sid: str, text: str) -> str:
    return json.dumps({"type": "agent.message", "sid": sid, "turn_id": "t_1", "text": text})


def _box(r: redis.Redis, sid: str) -> list[str]:
    return [str(e) for e in r.lrange(keys.session(sid) + keys.OUTBOX, 0, -1)]


def _published(r: redis.Redis, sid: str) -> None:
    """As if the stream held everything recorded so far and nobody published now."""
    base = keys.session(sid)
    r.delete(base + keys.PUBLOCK, base + keys.PUBHW, base + keys.OUTBOX)


def test_the_lock_holders_next_call_is_handed_what_follows_its_batch(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    base = keys.session(sid)
    _published(r, sid)
    first = emit(lib, sid, token, "o_1", [], [_ev(sid, "a"), _ev(sid, "b")])
    assert first[1] != CONTINUED and r.get(base + keys.PUBLOCK) == "o_1", "a free lock: taken, the head handed"
    s0 = _seqs(first[1:])
    # Another process records an event meanwhile: no batch for it, the lock is o_1's.
    other = emit(lib, sid, token, "o_2", [], [_ev(sid, "from o_2")])
    assert len(other) == 1
    # o_1 records more while its publisher holds the first batch: it is handed what follows
    # that batch, o_2's event first, in seq order, marked as a continuation.
    more = emit(lib, sid, token, "o_1", [], [_ev(sid, "c")])
    assert more[1] == CONTINUED, more
    s1 = _seqs(more[2:])
    assert s1 == list(range(s0[-1] + 1, s0[-1] + 3)), (s0, s1)
    assert int(r.get(base + keys.PUBHW) or 0) == s1[-1]
    # Nothing new since: a call that records nothing is handed nothing.
    assert len(emit(lib, sid, token, "o_1", [], [])) == 1
    # The lock is not renewed by a continuation: a publisher that died keeps it until it lapses.
    r.pexpire(base + keys.PUBLOCK, 300)
    emit(lib, sid, token, "o_1", [], [_ev(sid, "d")])
    assert int(r.pttl(base + keys.PUBLOCK)) <= 300


def test_the_sweepers_claim_is_never_handed_a_continuation(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    _published(r, sid)
    emit(lib, sid, token, "o_1", [], [_ev(sid, "a")])
    emit(lib, sid, token, "o_2", [], [_ev(sid, "b")])
    assert lib(lib.fns.pub_claim(sid=sid, owner="o_1")) == [], "the lock is held (by o_1 itself): nothing"
    assert lib(lib.fns.pub_claim(sid=sid, owner="o_2")) == []


def test_pub_done_hands_on_from_the_head_and_frees_lock_and_mark_together(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    base = keys.session(sid)
    _published(r, sid)
    s0 = _seqs(emit(lib, sid, token, "o_1", [], [_ev(sid, "a")])[1:])
    s1 = _seqs(emit(lib, sid, token, "o_1", [], [_ev(sid, "b")])[2:])
    # The publisher published the first batch only, and trims: the handed-on one is handed
    # again (it is not published yet; a publisher skips a seq already in the stream).
    again = lib(lib.fns.pub_done(sid=sid, owner="o_1", last=s0[-1]))
    assert _seqs(again) == s1
    s2 = _seqs(emit(lib, sid, token, "o_1", [], [_ev(sid, "c")])[2:])
    assert s2 == [s1[-1] + 1], "the mark is not moved back by a batch handed again"
    assert lib(lib.fns.pub_done(sid=sid, owner="o_1", last=s2[-1])) == []
    assert r.get(base + keys.PUBLOCK) is None and r.get(base + keys.PUBHW) is None
    assert r.llen(base + keys.OUTBOX) == 0
    # Free again: the next call takes the lock and is handed the head, not a continuation.
    nxt = emit(lib, sid, token, "o_1", [], [_ev(sid, "d")])
    assert nxt[1] != CONTINUED and _seqs(nxt[1:]) == [s2[-1] + 1]


def test_a_lock_lost_to_another_process_hands_nothing_on(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    base = keys.session(sid)
    _published(r, sid)
    emit(lib, sid, token, "o_1", [], [_ev(sid, "a")])
    r.set(base + keys.PUBLOCK, "o_2")  # o_1's lock lapsed and o_2's sweeper claimed it
    assert len(emit(lib, sid, token, "o_1", [], [_ev(sid, "b")])) == 1
    # A mark gone before its lock (it lapsed first) hands nothing on: pub_done will.
    r.set(base + keys.PUBLOCK, "o_1")
    r.delete(base + keys.PUBHW)
    assert len(emit(lib, sid, token, "o_1", [], [_ev(sid, "c")])) == 1


def test_a_long_tail_is_handed_on_a_batch_at_a_time(r: redis.Redis, lib: Library) -> None:
    sid, token = busy_session(lib)
    _published(r, sid)
    s0 = _seqs(emit(lib, sid, token, "o_1", [], [_ev(sid, "a")])[1:])
    for i in range(250):
        emit(lib, sid, token, "o_2", [], [_ev(sid, f"o_2 {i}")])
    more = emit(lib, sid, token, "o_1", [], [_ev(sid, "b")])
    assert more[1] == CONTINUED and _seqs(more[2:]) == list(range(s0[-1] + 1, s0[-1] + 201))
    rest = emit(lib, sid, token, "o_1", [], [])
    assert rest[1] == CONTINUED and _seqs(rest[2:]) == list(range(s0[-1] + 201, s0[-1] + 252))


def test_a_calls_events_take_consecutive_seqs_in_order_and_mark_the_session_once(r: redis.Redis, lib: Library) -> None:
    """A call records its events together (one RPUSH, the seq moved once): each still takes the
    next seq in the order recorded, the hash's seq ends at the last, and the session is marked
    dirty and active as a call recording one event marks it."""
    sid, token = busy_session(lib)
    base = keys.session(sid)
    b = keys.bucket(sid)
    _published(r, sid)
    r.zrem(keys.dirty(b), sid)
    before = int(r.hget(base, "seq") or 0)
    emit(lib, sid, token, "", [], [_ev(sid, f"e{k}") for k in range(7)])
    box = _box(r, sid)
    assert _seqs(box) == list(range(before + 1, before + 8)), box
    assert [json.loads(e)["text"] for e in box] == [f"e{k}" for k in range(7)]
    assert int(r.hget(base, "seq") or 0) == before + 7
    assert r.zscore(keys.dirty(b), sid) is not None and r.zscore(keys.active(b), sid) is not None
    # the next call goes on from there, one event or several
    emit(lib, sid, token, "", [], [_ev(sid, "next")])
    assert _seqs(_box(r, sid))[-1] == before + 8 == int(r.hget(base, "seq") or 0)


def test_a_fork_of_a_long_history_records_every_event_in_order(r: redis.Redis, lib: Library) -> None:
    """A fork records its whole copied history in one call: more events than Lua can unpack at
    once (8,000) still all reach the outbox, in order, with consecutive seqs."""
    sid = "s_long_fork"
    n = 9_000
    copied = [json.dumps({"type": "assistant.msg", "sid": sid, "turn_id": "t_0", "text": f"m{k}", "tool_calls": []})
              for k in range(n)]
    body = json.dumps({"type": "session.created", "sid": sid, "workspace": "/w", "model": "script"})
    lib(lib.fns.fork(sid=sid, principal="p", workspace="/w", model="script", title="", owner="", body=body,
                     events=copied))
    base = keys.session(sid)
    box = _box(r, sid)
    assert len(box) == n + 1 and _seqs(box) == list(range(1, n + 2))
    assert [json.loads(e)["text"] for e in box[1:]] == [f"m{k}" for k in range(n)]
    assert int(r.hget(base, "seq") or 0) == n + 1


def test_pub_done_trims_by_seq_even_when_the_outbox_skips_one(r: redis.Redis, lib: Library) -> None:
    """``cox_pub_done`` trims up to ``last`` in one LTRIM when the outbox's seqs are consecutive;
    should they ever not be, it still drops exactly the entries at or below ``last``."""
    sid, token = busy_session(lib)
    base = keys.session(sid)
    _published(r, sid)
    held = _seqs(emit(lib, sid, token, "o_1", [], [_ev(sid, f"e{k}") for k in range(6)])[1:])
    # consecutive: the head's three go at once
    lib(lib.fns.pub_done(sid=sid, owner="o_1", last=held[2]))
    assert _seqs(_box(r, sid)) == held[3:]
    # a gap (an entry gone from the middle): trimmed by seq, not by distance from the head
    r.lrem(base + keys.OUTBOX, 1, _box(r, sid)[1])
    assert _seqs(_box(r, sid)) == [held[3], held[5]]
    r.set(base + keys.PUBLOCK, "o_1")
    lib(lib.fns.pub_done(sid=sid, owner="o_1", last=held[4]))
    assert _seqs(_box(r, sid)) == [held[5]]
