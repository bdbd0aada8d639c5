"""The runner's outbox publisher (:class:`cox_runner.redis.outbox.Outbox`) on a real Redis with the
library loaded and a real nats-server: batches handed on to a running publisher go out without a
``cox_pub_done`` between, and the stream still holds every seq once, in order, with another
process recording into the same session all along; a batch handed on to a process whose
publisher is gone is published by the sweeper once the lock lapses, after the events before it."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import redis.asyncio as aredis
import structlog
import uvloop

from cox.servers import NatsServer, RedisServer
from cox_runner.redis.store import LIBRARY, Store
from coxswain import eventlog, keys, subjects


def run(tmp: Path, go: Callable[[Store, Store, Any, Any], Awaitable[None]]) -> None:
    async def main(nats_url: str, redis_url: str) -> None:
        nc = await nats.connect(nats_url)
        r = aredis.from_url(redis_url, decode_responses=True)
        js = nc.jetstream()
        log = structlog.get_logger("test")
        one, two = Store(r, js, "o_one", log), Store(r, js, "o_two", log)
        try:
            await eventlog.ensure_stream(js)
            await r.function_load(LIBRARY, replace=True)
            await go(one, two, r, js)
            await one.outbox.close()
            await two.outbox.close()
        finally:
            await one.aclose()  # (uvloop's close waits on a connection left open)
            await two.aclose()
            await r.aclose()
            await nc.close()

    with NatsServer(tmp / "nats") as ns:
        rs = RedisServer(tmp / "redis")
        rs.start()
        try:
            uvloop.run(main(ns.admin_url, rs.admin_url))
        finally:
            rs.close()


async def busy(store: Store, sid: str) -> str:
    """A session of ``sid`` with a turn running; its lease token."""
    body = json.dumps({"type": "session.created", "sid": sid, "workspace": "/w", "model": "script"})
    await store.fns.create(sid=sid, principal="p", workspace="/w", model="script", title="", body=body,
                            owner=store.owner)
    sent = await store.fns.send(sid=sid, principal="p", message_id="m_1", text="go", mode="", client_id="",
                                runner="r_1", lease_ms=60_000, turn_id="t_1", owner=store.owner, models="",
                                agents_md="")
    return str(sent["token"])


def ev(sid: str, text: str) -> str:
    return json.dumps({"type": "agent.message", "sid": sid, "turn_id": "t_1", "text": text})


async def drained(r: Any, sid: str, timeout: float = 10.0) -> None:
    base = keys.session(sid)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while await r.llen(base + keys.OUTBOX) or await r.exists(base + keys.PUBLOCK):
        assert loop.time() < deadline, "the outbox was not drained"
        await asyncio.sleep(0.01)


async def in_stream(js: Any, sid: str, r: Any) -> list[int]:
    last = int(await r.hget(keys.session(sid), "seq") or 0)
    return [int(e["seq"]) for e in await eventlog.backlog(js, sid, 0, last, timeout=5.0)]


def test_batches_handed_on_go_out_in_order_with_fewer_trims(tmp_path: Path) -> None:
    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_handon"
        token = await busy(one, sid)
        trims = 0
        pub_done = one.fns.pub_done

        async def counted(**kw: Any) -> list[str]:
            nonlocal trims
            trims += 1
            return await pub_done(**kw)

        one.fns.pub_done = counted  # type: ignore[method-assign]
        rng = random.Random(7)

        async def turn() -> None:  # the runner's turn: events one after the other, as fast as it goes
            for i in range(300):
                await one.fns.emit(sid=sid, token=token, owner=one.owner, ops=[],
                                   events=[ev(sid, f"one {i}.{j}") for j in range(rng.randint(1, 3))])
                if i % 7 == 0:
                    await asyncio.sleep(0)

        async def other() -> None:  # another process records into the session meanwhile (a Lead's events)
            for i in range(60):
                await two.fns.emit(sid=sid, token=token, owner=two.owner, ops=[], events=[ev(sid, f"two {i}")])
                await asyncio.sleep(rng.random() / 500)

        await asyncio.gather(turn(), other())
        await drained(r, sid)
        last = int(await r.hget(keys.session(sid), "seq") or 0)
        assert await in_stream(js, sid, r) == list(range(1, last + 1)), "every seq once, in order"
        assert await r.get(keys.session(sid) + keys.PUBHW) is None, "the mark went with the lock"
        assert one.outbox.handed_on > 0, "no batch was ever handed on to the running publisher"
        batches = one.outbox.handed_on + trims
        assert trims < batches, (trims, batches)

    run(tmp_path, go)


def test_a_batch_handed_on_whose_reply_is_read_before_the_one_it_follows_waits_for_it(tmp_path: Path) -> None:
    """Two calls of this process on two connections: the first takes the freed lock and is handed
    the head, the second is handed what follows; the second's reply is read first, while the
    publisher that freed the lock has not yet returned. It must not publish the second's batch
    before the first's (the stream would refuse it: a gap) but take the outbox from its head."""
    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_crossed"
        token = await busy(one, sid)
        await drained(r, sid)
        real_pub_done, real_start = one.fns.pub_done, one.outbox.start
        armed = True
        injected = asyncio.Event()

        async def pub_done(**kw: Any) -> list[str]:
            nonlocal armed
            res = await real_pub_done(**kw)
            if not res and armed:  # the lock is free; the publisher has not resumed yet
                armed = False
                read_later: list[list[str]] = []
                one.outbox.start = lambda _sid, batch: read_later.append(batch)  # type: ignore[method-assign,assignment]
                await one.fns.emit(sid=sid, token=token, owner=one.owner, ops=[], events=[ev(sid, "head")])
                one.outbox.start = real_start  # type: ignore[method-assign]
                assert read_later, "the first call took the freed lock"
                await one.fns.emit(sid=sid, token=token, owner=one.owner, ops=[], events=[ev(sid, "follows")])
                assert one.outbox._next.get(sid), "the second was handed what follows, to the running publisher"
                real_start(sid, read_later[0])  # the first call's reply, read now
                injected.set()
            return res

        one.fns.pub_done = pub_done  # type: ignore[method-assign]
        await one.fns.emit(sid=sid, token=token, owner=one.owner, ops=[], events=[ev(sid, "before")])
        # The outbox looks drained for a moment inside the stand-in (the lock freed, before its
        # first call takes it again): CI's parallel lane once looked then, and read the session's
        # seq before the stand-in's second event. Wait for the stand-in's last call first.
        await asyncio.wait_for(injected.wait(), 10.0)
        await drained(r, sid, timeout=2.0)  # the lock (5 s) never had to lapse
        assert not armed
        last = int(await r.hget(keys.session(sid), "seq") or 0)
        assert await in_stream(js, sid, r) == list(range(1, last + 1))

    run(tmp_path, go)


class _SlowJetStream:
    """JetStream whose publishes take ``delay`` longer: the publisher holds its batch a while."""

    def __init__(self, js: Any, delay: float) -> None:
        self.js, self.delay = js, delay

    async def publish(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(self.delay)
        return await self.js.publish(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.js, name)


def test_batches_handed_on_whose_replies_are_read_in_the_other_order_go_out_in_seq_order(tmp_path: Path) -> None:
    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_reversed"
        token = await busy(one, sid)
        await drained(r, sid)
        one.outbox.js = _SlowJetStream(js, 0.05)  # type: ignore[assignment]
        real_go_on = one.outbox.go_on
        held: list[list[str]] = []

        def go_on(sid_: str, batch: list[str]) -> None:  # the two replies read in the other order
            held.append(batch)
            if len(held) == 2:
                real_go_on(sid_, held[1])
                real_go_on(sid_, held[0])

        one.outbox.go_on = go_on  # type: ignore[method-assign,assignment]
        before = one.outbox.handed_on
        for text in ("head", "next", "after"):
            await one.fns.emit(sid=sid, token=token, owner=one.owner, ops=[], events=[ev(sid, text)])
        assert len(held) == 2, "both later calls were handed on to the publisher busy with the first"
        await drained(r, sid, timeout=2.0)  # the lock (5 s) never had to lapse
        last = int(await r.hget(keys.session(sid), "seq") or 0)
        assert await in_stream(js, sid, r) == list(range(1, last + 1))
        assert one.outbox.handed_on > before

    run(tmp_path, go)


def test_a_publisher_finishing_goes_on_with_the_next_tenure_after_another_process_published(tmp_path: Path) -> None:
    """The lock freed, another process takes it, publishes and frees it; then a call here takes
    it again while this process's publisher has not yet returned: it publishes the new batch,
    though its own last seq is behind the stream's."""
    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_tenures"
        token = await busy(one, sid)
        await drained(r, sid)
        real_pub_done = one.fns.pub_done
        armed = True
        handed = asyncio.Event()

        async def pub_done(**kw: Any) -> list[str]:
            nonlocal armed
            res = await real_pub_done(**kw)
            if not res and armed:
                armed = False
                await two.fns.emit(sid=sid, token=token, owner=two.owner, ops=[], events=[ev(sid, "two")])
                await drained(r, sid, timeout=2.0)
                await one.fns.emit(sid=sid, token=token, owner=one.owner, ops=[], events=[ev(sid, "one again")])
                assert one.outbox._fresh.get(sid), "handed to the publisher still finishing"
                handed.set()
            return res

        one.fns.pub_done = pub_done  # type: ignore[method-assign]
        await one.fns.emit(sid=sid, token=token, owner=one.owner, ops=[], events=[ev(sid, "one")])
        # The outbox looks drained for a moment inside the stand-in (the lock freed, before the
        # other process's call): wait for the stand-in's last call before looking.
        await asyncio.wait_for(handed.wait(), 10.0)
        await drained(r, sid, timeout=2.0)
        assert not armed
        last = int(await r.hget(keys.session(sid), "seq") or 0)
        assert await in_stream(js, sid, r) == list(range(1, last + 1))

    run(tmp_path, go)


def test_a_batch_handed_on_to_a_process_whose_publisher_is_gone_waits_for_the_sweeper(tmp_path: Path) -> None:
    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_orphan"
        token = await busy(one, sid)
        await drained(r, sid)
        handed_on = one.outbox.handed_on
        base = keys.session(sid)
        # This process took the lock with a batch and its publish failed (NATS gone for a
        # moment): the lock is left to lapse, and events recorded here meanwhile are handed on
        # to no one.
        js_ok = one.outbox.js
        one.outbox.js = _Unreachable()  # type: ignore[assignment]
        await one.fns.emit(sid=sid, token=token, owner=one.owner, ops=[], events=[ev(sid, "lost batch")])
        while one.outbox._publishers:
            await asyncio.sleep(0.001)
        one.outbox.js = js_ok
        assert await r.get(base + keys.PUBLOCK) == one.owner
        for i in range(3):
            await one.fns.emit(sid=sid, token=token, owner=one.owner, ops=[], events=[ev(sid, f"after {i}")])
        assert one.outbox.handed_on == handed_on and not one.outbox._publishers, "nothing runs here for it"
        seq = int(await r.hget(base, "seq") or 0)
        assert (await in_stream_upto(js, sid)) < seq - 3, "nothing after the lost batch reached the stream"
        await r.pexpire(base + keys.PUBLOCK, 50)  # it lapses
        await asyncio.sleep(0.1)
        assert await two.sweep(min_age_ms=0) == 1
        await drained(r, sid)
        assert await in_stream(js, sid, r) == list(range(1, seq + 1))

    run(tmp_path, go)


class _Unreachable:
    """A JetStream context whose every call fails as one to a server that is gone."""

    def __getattr__(self, name: str) -> Any:
        async def fail(*args: Any, **kwargs: Any) -> Any:
            raise nats.errors.ConnectionClosedError

        return fail


async def in_stream_upto(js: Any, sid: str) -> int:
    last, _ = await eventlog.last_in_stream(js, sid)
    return int(last)


def test_a_flush_through_a_seq_returns_once_that_seq_is_published_not_when_the_outbox_is_empty(tmp_path: Path) -> None:
    """A turn that starts from a kept transcript needs the log only up to its own start: the
    messages queued behind it (each send's ``queue.added``, recorded while its publisher is busy)
    must not hold it. Before, the flush waited for the publisher to run out of work: 12 ms a
    drive's first turn with five sends queued behind it."""
    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_through"
        token = await busy(one, sid)
        await drained(r, sid)
        one.outbox.js = _SlowJetStream(js, 0.1)  # type: ignore[assignment]
        await one.fns.emit(sid=sid, token=token, owner=one.owner, ops=[], events=[ev(sid, "mine")])
        mine = int(await r.hget(keys.session(sid), "seq") or 0)
        await asyncio.sleep(0.02)  # the publisher took it (its publish takes 0.1 s)
        for text in ("queued 1", "queued 2", "queued 3"):  # handed on behind it: the next publish
            await one.fns.emit(sid=sid, token=token, owner=one.owner, ops=[], events=[ev(sid, text)])
        last = int(await r.hget(keys.session(sid), "seq") or 0)
        assert last > mine
        assert await one.outbox.flush(sid, timeout=5.0, through=mine)
        have = [int(e["seq"]) for e in await eventlog.backlog(js, sid, 0, mine, timeout=5.0)]
        assert have == list(range(1, mine + 1)), "everything up to the seq asked for is in the stream"
        assert sid in one.outbox._publishers, "returned while the publisher still had the rest"
        assert int(await r.llen(keys.session(sid) + keys.OUTBOX)) > 0 or sid in one.outbox._next
        assert await one.outbox.flush(sid, timeout=5.0), "a flush through everything waits for the rest"
        assert sid not in one.outbox._publishers
        assert await in_stream(js, sid, r) == list(range(1, last + 1))
        # Where each event lies in the stream, for a reader of the tail (LogReader._extend): the
        # message this process published holding it.
        for seq in (mine, last):
            at = one.outbox.holding(sid, seq)
            assert at is not None
            msg = await js.get_msg(subjects.EVENTS_STREAM, seq=at)
            assert seq in [int(e["seq"]) for e in eventlog.events_in(msg.data)]
        assert one.outbox.holding(sid, last + 1) is None, "not published yet: not known"
        # Published by another process (this one knows no position past it): the outbox is read.
        await two.fns.emit(sid=sid, token=token, owner=two.owner, ops=[], events=[ev(sid, "two")])
        assert await one.outbox.flush(sid, timeout=5.0, through=last + 1)
        assert await in_stream(js, sid, r) == list(range(1, last + 2))

    run(tmp_path, go)


def test_what_this_process_recorded_lately_is_at_hand_as_the_log_holds_it(tmp_path: Path) -> None:
    """A turn starting from a kept transcript folds the events since from what this process's
    calls recorded (no wait for their publish, no read of the stream): exactly the stream's
    events, and nothing when one of them was recorded elsewhere or is too large to keep."""
    async def go(one: Store, two: Store, r: Any, js: Any) -> None:
        sid = "s_recent"
        token = await busy(one, sid)
        await drained(r, sid)
        before = int(await r.hget(keys.session(sid), "seq") or 0)
        one.outbox.js = _SlowJetStream(js, 0.2)  # type: ignore[assignment]
        for text in ("a", "b", "c"):
            await one.fns.emit(sid=sid, token=token, owner=one.owner, ops=[], events=[ev(sid, text)])
        last = int(await r.hget(keys.session(sid), "seq") or 0)
        got = one.outbox.recorded(sid, before, last)
        assert got is not None and [e["text"] for e in got] == ["a", "b", "c"], "at hand before it is published"
        assert one.outbox.recorded(sid, last, last) == []
        assert one.outbox.recorded(sid, before, last + 1) is None, "not recorded yet: not at hand"
        await drained(r, sid)
        assert got == await eventlog.backlog(js, sid, before, last, timeout=5.0), "the log's own events"
        await two.fns.emit(sid=sid, token=token, owner=two.owner, ops=[], events=[ev(sid, "elsewhere")])
        await one.fns.emit(sid=sid, token=token, owner=one.owner, ops=[], events=[ev(sid, "here")])
        now = int(await r.hget(keys.session(sid), "seq") or 0)
        assert one.outbox.recorded(sid, last, now) is None, "one of them was recorded by another process"
        await one.fns.emit(sid=sid, token=token, owner=one.owner, ops=[], events=[ev(sid, "x" * 9000)])
        assert one.outbox.recorded(sid, now, now + 1) is None, "too large to keep"
        await drained(r, sid)

    run(tmp_path, go)
