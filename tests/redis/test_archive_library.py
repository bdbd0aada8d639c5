"""The library's archive functions on a real Redis (no runner): what may be archived, that a drop
refuses once anything changed since the snapshot, and that a load puts back exactly what was
there. (The archive on a whole stack: tests/stack/test_archive.py.)
"""

from __future__ import annotations

import json
from typing import Any

import redis

from coxswain import keys
from tests.support.library import Library

SFX = list(keys.ARCHIVED)



_n = 0


def new_session(r: redis.Redis) -> str:
    lib = Library(r)
    sid = lib.create("s_arch")
    publish_all(r, sid)
    return sid


def patch_title(r: redis.Redis, sid: str, title: str) -> None:
    lib = Library(r)
    lib(lib.fns.patch(sid=sid, principal="p", owner="", fields=[("title", title)]))


def publish_all(r: redis.Redis, sid: str) -> None:
    """What a publisher does once the stream holds the outbox: trim it (cox_pub_done)."""
    base = keys.session(sid)
    r.set(base + keys.PUBLOCK, "o")
    lib = Library(r)
    lib(lib.fns.pub_done(sid=sid, owner="o", last=int(r.hget(base, "seq") or 0)))


def take(r: redis.Redis, sid: str, idle_ms: int = 0) -> dict[str, Any]:
    body = json.dumps({"type": "session.archived", "sid": sid, "idle_ms": idle_ms})
    lib = Library(r)
    return dict(lib(lib.fns.archive_take(sid=sid, idle_ms=idle_ms, owner="", body=body, suffixes=SFX)))


def drop(r: redis.Redis, sid: str, took: dict[str, Any]) -> dict[str, Any]:
    lib = Library(r)
    return dict(lib(lib.fns.archive_drop(sid=sid, seq=took["seq"], sha=took["sha"], suffixes=SFX)))


def load(r: redis.Redis, sid: str, took: dict[str, Any]) -> dict[str, Any]:
    body = json.dumps({"type": "session.restored", "sid": sid, "archived_seq": took["seq"]})
    lib = Library(r)
    return dict(lib(lib.fns.archive_load(sid=sid, snapshot=took["snapshot"], seq=took["seq"], owner="", body=body)))


def session_keys(r: redis.Redis, sid: str) -> dict[str, Any]:
    """Every key of the session but the transition replies, by suffix, with its content."""
    base = keys.session(sid)
    out: dict[str, Any] = {}
    for k in r.scan_iter(match=base + "*"):
        sfx = k[len(base):]
        if sfx.startswith(keys.TX):
            continue
        t = r.type(k)
        out[sfx] = (r.hgetall(k) if t == "hash" else r.lrange(k, 0, -1) if t == "list"
                    else sorted(r.smembers(k)) if t == "set" else r.get(k))
    return out


def test_a_drop_happens_only_when_nothing_changed_and_a_load_puts_back_exactly_that(r: redis.Redis) -> None:
    sid = new_session(r)
    base = keys.session(sid)
    r.sadd(base + keys.STANDING, "git status")
    r.hset(base + keys.CLIENT_IDS, "c1", json.dumps({"message_id": "m_1", "disposition": "started"}))
    took = take(r, sid)
    assert took["seq"] == 2 and took["principal"] == "p"
    last = r.lindex(base + keys.OUTBOX, -1)
    assert last is not None
    assert json.loads(last)["type"] == "session.archived"
    # the session.archived event is not published yet: nothing is dropped
    assert drop(r, sid, took) == {"dropped": False, "reason": "outbox not published"}
    publish_all(r, sid)
    before = session_keys(r, sid)
    # a change between the snapshot and the drop (a patch here): kept
    patch_title(r, sid, "renamed")
    publish_all(r, sid)
    assert drop(r, sid, took) == {"dropped": False, "reason": "changed"}
    # a change that records no event still changes the snapshot's sha1
    took = take(r, sid)
    publish_all(r, sid)
    before = session_keys(r, sid)
    r.sadd(base + keys.STANDING, "ls")
    assert drop(r, sid, took) == {"dropped": False, "reason": "changed"}
    r.srem(base + keys.STANDING, "ls")
    assert drop(r, sid, took) == {"dropped": True}
    assert session_keys(r, sid) == {}
    assert r.zscore(keys.active(keys.bucket(sid)), sid) is None
    # a drop of a session that is gone changes nothing
    assert drop(r, sid, took) == {"dropped": False, "reason": "gone"}
    assert load(r, sid, took) == {"restored": True}
    after = session_keys(r, sid)
    restored = json.loads(after.pop(keys.OUTBOX)[0])
    assert restored["type"] == "session.restored" and restored["seq"] == took["seq"] + 1
    assert after[""].pop("seq") == str(took["seq"] + 1)
    assert before[""].pop("seq") == str(took["seq"])
    assert after == before
    # a second load (a concurrent reload) finds it there and changes nothing
    assert load(r, sid, took) == {"restored": False}
    assert r.hget(base, "seq") == str(took["seq"] + 1)


def test_a_session_that_runs_waits_or_is_unpublished_is_not_taken(r: redis.Redis) -> None:
    sid = new_session(r)
    base = keys.session(sid)
    lib = Library(r)
    for message_id, text, mode, turn_id in (("m_1", "hi", "", "t_1"), ("m_2", "later", "queue", "t_2")):
        sent = lib(lib.fns.send(sid=sid, principal="p", message_id=message_id, text=text, mode=mode, client_id="",
                                runner="r_1", lease_ms=60000, turn_id=turn_id, owner="", models="", agents_md=""))
        assert sent["disposition"] == ("started" if mode == "" else "queued"), sent
    publish_all(r, sid)
    seq = r.hget(base, "seq")
    assert take(r, sid) == {"error": "not_idle", "detail": "busy"}
    assert r.hget(base, "seq") == seq, "a refused take records nothing"
    # not idle long enough: refused without looking further
    sid2 = new_session(r)
    assert take(r, sid2, idle_ms=3_600_000) == {"error": "not_idle", "detail": "used recently"}
    # unpublished events
    patch_title(r, sid2, "x")
    assert take(r, sid2) == {"error": "not_idle", "detail": "outbox not published"}
    publish_all(r, sid2)
    # a pending approval left behind (a turn's state the archive must not freeze)
    r.hset(keys.session(sid2) + keys.APPROVALS, "a_1", json.dumps({"state": "pending", "turn_id": "t"}))
    assert take(r, sid2) == {"error": "not_idle", "detail": "approval open"}
    assert take(r, "s_nosuchsession") == {"error": "not_found", "detail": "no such session"}


def test_the_idle_scan_answers_only_sessions_idle_long_enough(r: redis.Redis) -> None:
    sid = new_session(r)
    b = keys.bucket(sid)
    old = int(r.zscore(keys.active(b), sid) or 0)
    assert old > 0, "every event records the session's activity"
    r.zadd(keys.active(b), {sid: old - 10_000})
    lib = Library(r)
    assert sid in lib.queued(lib.fns.idle, buckets=[b], idle_ms=5000, limit=100)
    assert sid not in lib.queued(lib.fns.idle, buckets=[b], idle_ms=60000, limit=100)


def test_the_publishers_position_hint_is_no_change_a_drop_refuses_on(r: redis.Redis) -> None:
    """The archive's own ``session.archived`` is published after the snapshot, and its publisher's
    ``cox_pub_done`` keeps where the stream ends in the session hash (``pubpos``): a hint for the
    next publisher, not the session's state. A drop that refused on it would never drop anything
    (a whole-stack archive found every idle session 'changed' and kept it)."""
    sid = new_session(r)
    base = keys.session(sid)
    took = take(r, sid)
    r.set(base + keys.PUBLOCK, "o")
    lib = Library(r)
    lib(lib.fns.pub_done(sid=sid, owner="o", last=int(r.hget(base, "seq") or 0), stream=41))
    assert r.hget(base, "pubpos") == f"{took['seq']}:41"
    assert drop(r, sid, took) == {"dropped": True}
    assert not r.exists(base)
    loaded = load(r, sid, took)
    assert loaded.get("restored") is True
    assert r.hget(base, "pubpos") is None, "a restored session's publisher looks at the stream itself"
