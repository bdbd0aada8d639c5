"""Idle sessions: archived to JetStream KV and dropped from Redis, loaded back on use.

A whole stack whose sessions go idle within a second or two (``[sessions] idle_days`` as a
fraction of a day): an archived session reads, lists and streams from the archive, a new message
loads it back and its log goes on with no gap or duplicate; a busy or queued session is never
archived; a send arriving between the archive's put and its drop (the archiver paused there by
``COX_FAULT_ARCHIVE_PAUSE_S``) loses nothing. (The library's archive functions on a bare Redis:
tests/redis/test_archive_library.py.)
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import nats
import pytest

from coxswain import archive, keys
from tests.support.stack import Api, Stack, check_event, said, stack_fixture

IDLE_S = 2.5
PAUSE_S = 1.5
"""Shorter than IDLE_S: the session.archived event is activity, so no other runner takes the
session again while one is paused."""
CONFIG = f"""
[sessions]
idle_days = {IDLE_S / 86400!r}
archive_every_s = 0.3
"""

stack = stack_fixture("archive", runners=2, config=CONFIG, also_cluster=True,
                      runner_env={"COX_TEST_FAULTS": "1", "COX_FAULT_ARCHIVE_PAUSE_S": str(PAUSE_S)})


@pytest.fixture
def api(stack: Stack) -> Iterator[Api]:
    with stack.client() as a:
        yield a


def in_redis(stack: Stack, sid: str) -> bool:
    rc = stack.redis_client()
    try:
        return bool(rc.exists(keys.session(sid)))
    finally:
        rc.close()


def wait_dropped(stack: Stack, sid: str, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not in_redis(stack, sid):
            return
        time.sleep(0.1)
    raise AssertionError(f"{sid} was not archived within {timeout}s")


def kv_entry(stack: Stack, sid: str) -> archive.Entry | None:
    async def read() -> archive.Entry | None:
        nc = await nats.connect(stack.nats.admin_url)
        try:
            return await archive.read(await archive.bucket(nc.jetstream()), sid)
        finally:
            await nc.close()

    return asyncio.run(read())


def turn(api: Api, sid: str, text: str, after: int) -> None:
    r = api.send(sid, said(text))
    assert r.status_code == 202, r.text
    api.wait_type(sid, "turn.end", after=after, timeout=60)


def check_log(evs: list[dict[str, Any]]) -> None:
    assert [e["seq"] for e in evs] == list(range(1, len(evs) + 1)), "the log has a gap or a duplicate"
    for e in evs:
        check_event(e)


def test_an_idle_session_is_archived_and_comes_back_on_use(stack: Stack, api: Api) -> None:
    sid = api.create(title="keep me")["id"]
    turn(api, sid, "first", 0)
    turn(api, sid, "second", api.all_events(sid)[-1]["seq"])
    before = api.wait_idle(sid)
    last = api.all_events(sid)[-1]["seq"]
    changes = api.http.get(f"/v1/sessions/{sid}/changes")
    assert changes.status_code == 200, changes.text

    wait_dropped(stack, sid)
    rc = stack.redis_client()
    try:
        left = [k for k in rc.scan_iter(match=keys.session(sid) + "*") if keys.TX not in k]
        assert left == [], f"keys left in Redis: {left}"
        assert rc.zscore(keys.principal("local"), sid) is not None, "the listing's index keeps it"
    finally:
        rc.close()
    entry = kv_entry(stack, sid)
    assert entry is not None and entry.seq == last + 1
    evs = api.all_events(sid)
    assert evs[-1]["type"] == "session.archived" and evs[-1]["seq"] == last + 1
    check_log(evs)

    # Reads come from the archive, without loading it back.
    view = api.session(sid)
    assert view["last_seq"] == last + 1
    for field in ("title", "model", "workspace", "created", "usage", "busy", "queue"):
        assert view[field] == before[field], field
    listed = api.http.get("/v1/sessions").json()
    assert sid in [s["id"] for s in listed]
    assert [e["seq"] for e in api.events(sid, after=last)] == [last + 1]
    assert [e["seq"] for e in api.events(sid, after=last - 1, wait=1.0)] == [last, last + 1]
    assert api.http.get(f"/v1/sessions/{sid}/changes").json() == changes.json()
    assert api.http.get(f"/v1/sessions/{sid}", headers={"Authorization": "Bearer test-token-other"}
                        ).status_code == 404, "another principal does not see it in the archive either"
    assert not in_redis(stack, sid)

    # A message loads it back; the turn runs and the log goes on.
    turn(api, sid, "third", last + 1)
    evs = api.all_events(sid)
    check_log(evs)
    after = [e["type"] for e in evs if e["seq"] > last + 1]
    assert after[0] == "session.restored" and after[1:3] == ["user.msg", "turn.start"], after
    assert evs[last + 1]["archived_seq"] == last + 1
    assert [e["text"] for e in evs if e["type"] == "user.msg"] == [said("first"), said("second"), said("third")]
    assert kv_entry(stack, sid) is None, "the loaded entry is deleted"
    now = api.wait_idle(sid)
    assert now["title"] == "keep me" and now["usage"]["requests"] > before["usage"]["requests"]


def test_busy_or_queued_sessions_are_never_archived(stack: Stack, api: Api) -> None:
    sid = api.create()["id"]
    r = api.send(sid, said("slow", {"text": "slow done", "delay_ms": 6000}))
    assert r.status_code == 202, r.text
    r = api.send(sid, said("queued", {"text": "queued done", "delay_ms": 1000}), mode="queue")
    assert r.status_code == 202, r.text
    deadline = time.monotonic() + 6.5
    while time.monotonic() < deadline:
        assert in_redis(stack, sid), "a busy session was archived"
        time.sleep(0.2)
    api.wait_type(sid, "turn.end", timeout=30, after=0)
    evs = api.all_events(sid)
    assert "session.archived" not in [e["type"] for e in evs]
    # idle at last: now it is archived
    wait_dropped(stack, sid)
    evs = api.all_events(sid)
    check_log(evs)
    assert [e["type"] for e in evs].count("turn.end") == 2 and evs[-1]["type"] == "session.archived"


def test_a_send_while_archiving_loses_nothing(stack: Stack, api: Api) -> None:
    sid = api.create()["id"]
    turn(api, sid, "before", 0)
    # The archive's event is published before the drop, which the archiver holds back PAUSE_S:
    # a send now lands between the snapshot and the drop.
    archived = api.wait_type(sid, "session.archived", timeout=40)
    r = api.send(sid, said("during"))
    assert r.status_code == 202, r.text
    api.wait_type(sid, "turn.end", after=archived["seq"], timeout=60)
    evs = api.all_events(sid)
    check_log(evs)
    later = [e["type"] for e in evs if e["seq"] > archived["seq"]]
    assert later[:2] == ["user.msg", "turn.start"], f"the send did not land before the drop: {later}"
    assert [e["text"] for e in evs if e["type"] == "user.msg"] == [said("before"), said("during")]
    # the archiver, back from its pause, finds the session changed and drops nothing
    deadline = time.monotonic() + 20
    while not any('"archive.kept"' in line and sid in line
                  for n in stack.runner_names() for line in stack.log(n).splitlines()):
        assert time.monotonic() < deadline, "the archiver never found the session changed"
        time.sleep(0.1)
    # the session was not dropped under the turn; later it is archived again, and comes back
    wait_dropped(stack, sid)
    turn(api, sid, "after", api.all_events(sid)[-1]["seq"])
    evs = api.all_events(sid)
    check_log(evs)
    assert [e["text"] for e in evs if e["type"] == "user.msg"] == [said("before"), said("during"), said("after")]


def test_concurrent_uses_load_an_archived_session_once(stack: Stack, api: Api) -> None:
    sid = api.create()["id"]
    turn(api, sid, "one", 0)
    wait_dropped(stack, sid)
    replies: list[int] = []

    def send(text: str) -> None:
        with stack.client() as c:
            replies.append(c.send(sid, said(text), mode="queue").status_code)

    threads = [threading.Thread(target=send, args=(f"q{i}",)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert replies == [202, 202, 202]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        evs = api.all_events(sid)
        if [e["type"] for e in evs].count("turn.end") == 4:
            break
        time.sleep(0.2)
    evs = api.all_events(sid)
    check_log(evs)
    types = [e["type"] for e in evs]
    assert types.count("session.restored") == 1, types
    assert types.count("turn.end") == 4
    assert sorted(e["text"] for e in evs if e["type"] == "user.msg")[1:] == sorted(said(f"q{i}") for i in range(3))


def test_only_the_runner_writes_the_archive_and_even_it_may_not_erase_it(stack: Stack) -> None:
    """A forged entry would be loaded as a session's state: only the runner may put one, and
    nobody but admin may delete or purge the bucket's stream."""
    from coxswain import subjects
    from tests.stack.test_server_auth import as_user

    forged = "$KV.COX_ARCHIVE.s_forged"
    erase = [f"$JS.API.STREAM.{verb}.{archive.STREAM}" for verb in ("DELETE", "PURGE", "MSG.DELETE")]

    async def run() -> None:
        for user in (subjects.GATEWAY, subjects.GUARD, subjects.JUDGE, subjects.VERSIONS, subjects.RUNNER):
            conn = await as_user(stack, user)
            assert conn.nc is not None
            targets = erase if user == subjects.RUNNER else [forged, *erase]
            for subject in targets:
                await conn.nc.publish(subject, b"{}")
            await conn.settle()
            for subject in targets:
                assert conn.refused("publish", subject), (user, subject, conn.errors)
            await conn.nc.close()

    asyncio.run(run())
