"""The position a freed publish lock leaves for its next holder (``pubpos``, handed as the first
entry of a fresh lock's batch), on a real Redis with the library loaded and a real nats-server.

Several runners record into one session (a send handled by one, the turn driven by another):
each publisher used to look at the stream first (a JetStream direct get) because another process
had published last, one round trip on the path of every such batch. The hint is only a hint: a
publisher that died between its publish and its ``cox_pub_done`` leaves a stale one, and the
next holder's conditional publish must then find the subject moved and look, never skip or
duplicate an event."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cox_runner.redis.store import Store
from coxswain import eventlog, keys

from .test_outbox_publisher import busy, drained, ev, in_stream, run


def count_looks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The sids of every look at the stream (``eventlog.last_in_stream``) from here on."""
    looks: list[str] = []
    real = eventlog.last_in_stream

    async def counted(js: Any, sid: str) -> tuple[int, int]:
        looks.append(sid)
        return await real(js, sid)

    monkeypatch.setattr(eventlog, "last_in_stream", counted)
    return looks


def test_processes_taking_turns_publish_with_no_look_at_the_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    looks = count_looks(monkeypatch)

    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_turns"
        token = await busy(one, sid)  # the session's first events: an empty subject, no look either
        await drained(r, sid)
        for i in range(20):
            store = one if i % 2 else two
            await store.fns.emit(sid=sid, token=token, owner=store.owner, ops=[],
                                 events=[ev(sid, f"{store.owner} {i}.{j}") for j in range(1 + i % 3)])
            await drained(r, sid)
        last = int(await r.hget(keys.session(sid), "seq") or 0)
        assert await in_stream(js, sid, r) == list(range(1, last + 1)), "every seq once, in order"
        pos = await r.hget(keys.session(sid), "pubpos")
        assert pos is not None and pos.split(":")[0] == str(last), pos
        assert looks == [], f"publishers looked at the stream {len(looks)} times"

    run(tmp_path, go)


def test_a_stale_position_is_found_out_and_nothing_is_skipped_or_doubled(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Process one publishes a batch and dies before its ``cox_pub_done``: the position in Redis
    is the one before that batch. Process two takes the lapsed lock with that stale hint."""
    looks = count_looks(monkeypatch)

    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_stale"
        base = keys.session(sid)
        token = await busy(one, sid)
        await drained(r, sid)
        stale = await r.hget(base, "pubpos")
        assert stale is not None
        # One's next batch reaches the stream, then one dies: no cox_pub_done, its lock stays
        # until it lapses (here: taken away at once, as if it had).
        await r.set(base + keys.PUBLOCK, "o_dead", px=60_000)
        await one.fns.emit(sid=sid, token=token, owner=one.owner, ops=[], events=[ev(sid, f"lost {j}") for j in range(3)])
        head = await r.lrange(base + keys.OUTBOX, 0, -1)
        await eventlog.publish(js, sid, head)  # what the dead publisher got out
        await r.delete(base + keys.PUBLOCK)
        assert await r.hget(base, "pubpos") == stale
        looks.clear()
        # Two records more and takes the free lock, handed the stale position first.
        await two.fns.emit(sid=sid, token=token, owner=two.owner, ops=[], events=[ev(sid, "after")])
        await drained(r, sid)
        last = int(await r.hget(base, "seq") or 0)
        assert await in_stream(js, sid, r) == list(range(1, last + 1)), "every seq once, in order"
        assert looks == [sid], "the stale hint must make the publisher look once"
        assert (await r.hget(base, "pubpos") or "").split(":")[0] == str(last)

    run(tmp_path, go)


def test_the_hint_never_moves_a_process_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that knows a later position than the one Redis hands it keeps its own."""
    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_back"
        await busy(one, sid)
        await drained(r, sid)
        known = one.outbox._cursors[sid]
        one.outbox._position(sid, "@1:1")
        assert one.outbox._cursors[sid] == known
        one.outbox._position(sid, "@junk")  # a malformed hint is ignored (logged), never trusted
        assert one.outbox._cursors[sid] == known

    run(tmp_path, go)
