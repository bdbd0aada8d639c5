"""Several events to one JetStream message (``eventlog.publish``), against a real nats-server.

A message holds consecutive events of one session (JSON lines), never more than the stream
takes, and never two events a webhook can ask for (its delivery id is the message's stream seq,
and the notifier finds it by :func:`eventlog.webhook_event`). Every reader splits messages back into events: each seq once, in order,
with publishers that race (a lapsed publish lock), start from a stale cursor, or skip ahead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import nats
import pytest
import uvloop

from cox.servers import NatsServer
from coxswain import bus, eventlog, events, notify, subjects

SID = "s_messages"


def entry(seq: int, type_: str = "tool.result", compact: bool = False, **extra: Any) -> str:
    """An outbox entry as the Lua library writes it: seq and ts first, then the body (pydantic's
    compact JSON, or ``json.dumps``'s spaced one)."""
    body = json.dumps({"type": type_, "sid": SID, "turn_id": "t_1", **extra},
                      separators=(",", ":") if compact else None)
    return f'{{"seq":{seq},"ts":{1000 + seq},{body[1:]}'


def run(tmp: Path, go: Callable[[Any, Any], Awaitable[None]], linked: bool = False) -> None:
    """``go(nc, js)`` against a fresh nats-server; ``linked``: the connection has a
    :class:`coxswain.bus.Link`, as a service's has (publishes' acks come through it)."""
    async def main(url: str) -> None:
        nc = await nats.connect(url)
        if linked:
            bus.link(nc, bus.Link())
        try:
            js = nc.jetstream()
            await eventlog.ensure_stream(js)
            await go(nc, js)
        finally:
            await nc.close()

    with NatsServer(tmp / "nats") as ns:
        uvloop.run(main(ns.admin_url))


async def stored(js: Any, sid: str = SID) -> list[bytes]:
    """The raw messages of the session's subject, in stream order."""
    out: list[bytes] = []
    info = await js.stream_info(subjects.EVENTS_STREAM)
    for seq in range(1, int(info.state.last_seq) + 1):
        msg = await js.get_msg(subjects.EVENTS_STREAM, seq)
        if msg.subject == subjects.events(sid):
            out.append(msg.data)
    return out


def seqs_of(evs: list[dict[str, Any]]) -> list[int]:
    return [int(e["seq"]) for e in evs]


def test_consecutive_events_share_a_message_with_at_most_one_webhook_event(tmp_path: Path) -> None:
    async def go(nc: Any, js: Any) -> None:
        batch = [entry(1, "user.msg"), entry(2, "turn.start"), entry(3, "tool.call"), entry(4, "approval.pending"),
                 entry(5, "approval.answered"), entry(6, "limit.warning"), entry(7, "turn.end"),
                 entry(8, "queue.added")]
        assert await eventlog.publish(js, SID, batch) == 8
        msgs = await stored(js)
        # A turn's end and what follows it (the next queued turn's start) are one publish; a
        # second webhook event begins a message of its own.
        assert [seqs_of(eventlog.events_in(m)) for m in msgs] == [[1, 2, 3, 4, 5], [6], [7, 8]]
        for m, want in zip(msgs, ["approval.pending", "limit.warning", "turn.end"], strict=True):
            types = [e["type"] for e in eventlog.events_in(m)]
            assert len(set(types) & set(notify.NOTIFY_EVENTS)) == 1, types
            assert json.loads(eventlog.webhook_event(m))["type"] == want, "the notifier finds it mid-message"
        assert await eventlog.last_in_stream(js, SID) == (8, 3)  # the last event, its message's stream seq
        got = await eventlog.backlog(js, SID, 0, 8)
        assert seqs_of(got) == list(range(1, 9)) and got[3]["type"] == "approval.pending"
        assert seqs_of(await eventlog.backlog(js, SID, 2, 5)) == [3, 4, 5], "a read from inside a message"

    run(tmp_path, go)


@pytest.mark.parametrize("linked", [False, True], ids=["nats-py", "link"])
def test_a_racing_publisher_with_a_stale_cursor_adds_nothing_twice_and_nothing_out_of_order(tmp_path: Path,
                                                                                          linked: bool) -> None:
    async def go(nc: Any, js: Any) -> None:
        first: eventlog.Cursors = {}
        stale: eventlog.Cursors = {}
        assert await eventlog.publish(js, SID, [entry(s) for s in (1, 2)], cursors=stale) == 2
        assert await eventlog.publish(js, SID, [entry(s) for s in (1, 2, 3, 4, 5)], cursors=first) == 5
        # The lock lapsed under the second publisher: it still believes the stream ends at 2 and
        # holds 3..7. Its conditional publish of 3..7 is refused; it looks again and adds 6, 7 only.
        assert await eventlog.publish(js, SID, [entry(s) for s in range(3, 8)], cursors=stale) == 7
        # A publisher whose batch starts past the stream's end stops without writing.
        with pytest.raises(eventlog.OutOfOrder):
            await eventlog.publish(js, SID, [entry(10), entry(11)], cursors={})
        # One that overlaps a message in its middle adds only what follows it.
        assert await eventlog.publish(js, SID, [entry(s) for s in (6, 7, 8, 9)], cursors={}) == 9
        evs = [e for m in await stored(js) for e in eventlog.events_in(m)]
        assert seqs_of(evs) == list(range(1, 10)), "each seq once, in order"
        feed = await eventlog.backlog(js, SID, 0, 9)
        assert seqs_of(feed) == list(range(1, 10))

    run(tmp_path, go, linked)


def test_a_message_never_passes_the_stream_limit_and_an_oversized_event_is_omitted_alone(tmp_path: Path) -> None:
    third = events.MAX_EVENT_BYTES // 3
    async def go(nc: Any, js: Any) -> None:
        batch = [entry(1, output="a" * third), entry(2, output="b" * third), entry(3, output="c" * third),
                 entry(4, output="d" * (events.MAX_EVENT_BYTES + 10)), entry(5, output="e")]
        assert await eventlog.publish(js, SID, batch) == 5
        msgs = await stored(js)
        assert all(len(m) <= events.MAX_EVENT_BYTES for m in msgs), [len(m) for m in msgs]
        evs = [e for m in msgs for e in eventlog.events_in(m)]
        assert seqs_of(evs) == [1, 2, 3, 4, 5]
        assert [e["type"] for e in evs][3] == "event.omitted" and evs[3]["original_type"] == "tool.result"
        assert evs[2]["output"] == "c" * third and evs[4]["output"] == "e"

    run(tmp_path, go)


def test_live_readers_split_messages_and_an_overflow_is_filled_from_the_stream(tmp_path: Path) -> None:
    async def go(nc: Any, js: Any) -> None:
        hub = eventlog.Hub(nc)
        last = 0

        async def seq_now() -> int:
            return last

        # A buffer of 400 bytes: one message of 3 events fits, a second one does not.
        async with eventlog.Tail(hub, js, SID, 0, seq_now, max_bytes=400) as tail:
            assert await tail.next(timeout=0.2) == []
            last = 4
            await eventlog.publish(js, SID, [entry(s) for s in range(1, 5)])
            got: list[dict[str, Any]] = []
            while len(got) < 4:
                got += await tail.next(timeout=5)
            assert seqs_of(got) == [1, 2, 3, 4], "a live message of four events, split"
            last = 9
            await eventlog.publish(js, SID, [entry(s) for s in range(5, 8)])
            await eventlog.publish(js, SID, [entry(8), entry(9)])
            assert tail.reader is not None
            for _ in range(50):
                if tail.reader.overflowed:
                    break
                await asyncio.sleep(0.05)
            assert tail.reader.overflowed, "the second message passed the reader's bound"
            more: list[dict[str, Any]] = []
            while len(more) < 5:
                more += await tail.next(timeout=5)
            assert seqs_of(more) == [5, 6, 7, 8, 9], "read again from the stream, split, once each"

    run(tmp_path, go)


def test_a_reader_asking_for_fewer_events_than_a_message_holds_gets_that_many_and_the_rest_next(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``GET /events?format=json&wait=..&limit=N`` answers at most N events (docs/api.md), and a
    live message may hold more: the rest is given from the message, not read again from the
    stream. A message holds up to a publish batch (a group of reads: hundreds of events) and an
    SSE stream takes 32 at a time; each read again was a consumer over the session's subject from
    its first message (the gateway spent 2.4 ms of CPU a tool call on a 500-read response)."""
    reads: list[tuple[int, int]] = []
    real = eventlog.backlog

    async def counted(js: Any, sid: str, after: int, until: int, *a: Any, **kw: Any) -> list[dict[str, Any]]:
        reads.append((after, until))
        return await real(js, sid, after, until, *a, **kw)

    monkeypatch.setattr(eventlog, "backlog", counted)

    async def go(nc: Any, js: Any) -> None:
        hub = eventlog.Hub(nc)
        last = 0

        async def seq_now() -> int:
            return last

        async with eventlog.Tail(hub, js, SID, 0, seq_now) as tail:
            assert await tail.next(timeout=0.2) == []
            last = 5
            await eventlog.publish(js, SID, [entry(s) for s in range(1, 6)])
            first = await tail.next(timeout=5, limit=2)
            assert seqs_of(first) == [1, 2]
            assert seqs_of(await tail.next(timeout=5, limit=2)) == [3, 4]
            assert seqs_of(await tail.next(timeout=5, limit=2)) == [5]
        assert reads == [], f"read from the stream again: {reads}"

    run(tmp_path, go)


def test_readers_of_one_session_share_each_live_message_parsed_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every reader of a session in a process is offered the same message; parsing it for each
    one was most of the gateway's CPU while 200 SSE readers that never read held one session
    (a 60 KB tool result parsed 200 times, then each event rendered 200 times): another session's
    small turn waited 3 s on a loaded machine. One parse a message, the events shared (read-only)."""
    parses: list[int] = []
    real = eventlog.events_in

    def counted(data: bytes) -> list[dict[str, Any]]:
        parses.append(len(data))
        return real(data)

    monkeypatch.setattr(eventlog, "events_in", counted)

    async def go(nc: Any, js: Any) -> None:
        hub = eventlog.Hub(nc)
        last = 0

        async def seq_now() -> int:
            return last

        async with contextlib.AsyncExitStack() as stack:
            tails = [await stack.enter_async_context(eventlog.Tail(hub, js, SID, 0, seq_now)) for _ in range(20)]
            for t in tails:
                assert await t.next(timeout=0.05) == []
            last = 3
            await eventlog.publish(js, SID, [entry(s, output="x" * 1000) for s in range(1, 4)])
            got = [await t.next(timeout=5) for t in tails]
        assert all(seqs_of(g) == [1, 2, 3] for g in got), [seqs_of(g) for g in got]
        assert len(parses) == 1, f"the message was parsed {len(parses)} times for 20 readers"
        assert all(a is b for g in got[1:] for a, b in zip(got[0], g, strict=True)), "each event is one object"

    run(tmp_path, go)


def test_in_any_mix_of_types_no_message_holds_two_webhook_events() -> None:
    rng = random.Random(23)
    types = [*notify.NOTIFY_EVENTS, "tool.call", "policy.decision", "tool.result", "usage", "assistant.msg"]
    for _ in range(300):
        n = rng.randrange(1, 30)
        batch = [entry(s, rng.choice(types), compact=rng.random() < 0.5) for s in range(1, n + 1)]
        i, seen = 0, []
        while i < n:
            end, last, data = eventlog._message(batch, i, i + 1)
            evs = eventlog.events_in(data)
            assert seqs_of(evs) == list(range(i + 1, last + 1)) and end == last
            hooked = [e for e in evs if e["type"] in notify.NOTIFY_EVENTS]
            assert len(hooked) <= 1, [e["type"] for e in evs]
            found = json.loads(eventlog.webhook_event(data))
            assert found == (hooked[0] if hooked else evs[-1])
            if end < n:  # small events: a message ends early only before a second webhook event
                assert hooked and json.loads(batch[end])["type"] in notify.NOTIFY_EVENTS
            seen += evs
            i = end
        assert seqs_of(seen) == list(range(1, n + 1))


def test_a_webhook_type_nested_in_an_output_costs_a_message_never_a_delivery() -> None:
    """A call's arguments that read like a webhook event (``{"type": "turn.end"}`` nested in the
    event) are taken for one by the splitter's look: the real ``turn.end`` after them starts a
    message of its own, so each message still holds one candidate, and the notifier reads the
    look-alike's own type (no delivery)."""
    fake = entry(2, "tool.call", args={"type": "turn.end", "sid": "s_other"})
    batch = [entry(1, "tool.call"), fake, entry(3, "assistant.msg"), entry(4, "turn.end"), entry(5, "user.msg")]
    end, last, data = eventlog._message(batch, 0, 1)
    assert (end, last) == (3, 3), "the nested look-alike joined; the real turn.end did not"
    assert json.loads(eventlog.webhook_event(data))["type"] == "tool.call", "not a delivery"
    end, last, data = eventlog._message(batch, 3, 4)
    assert (end, last) == (5, 5)
    assert json.loads(eventlog.webhook_event(data)) == json.loads(batch[3])


# ------------------------------------------------------------------ tail: from a stream seq on


def test_tail_reads_from_a_stream_seq_and_refuses_any_gap(tmp_path: Path) -> None:
    """``eventlog.tail`` (a kept transcript's new events): direct gets from a stream seq, then a
    consumer from where they ended; the events after ``after`` exactly, or None: never a tail
    with a gap, whatever the hint."""
    other = "s_other"

    async def go(nc: Any, js: Any) -> None:
        cursors: eventlog.Cursors = {}
        # 30 events of SID, one message each (webhook events end messages), another session's between
        for seq in range(1, 31):
            await eventlog.publish(js, SID, [entry(seq, "turn.end")], cursors=cursors)
            await eventlog.publish(js, other, [entry(seq, "turn.end")], cursors=cursors)
        info = await js.stream_info(subjects.EVENTS_STREAM)
        by_seq: dict[int, int] = {}  # SID's event seq -> its message's stream seq
        for s in range(1, int(info.state.last_seq) + 1):
            msg = await js.get_msg(subjects.EVENTS_STREAM, s)
            if msg.subject == subjects.events(SID):
                by_seq[json.loads(msg.data)["seq"]] = s

        def seqs(evs: list[dict[str, Any]] | None) -> list[int] | None:
            return None if evs is None else [int(e["seq"]) for e in evs]

        # the message holding `after` as the hint, or any earlier one: exact
        assert seqs(await eventlog.tail(js, SID, by_seq[10], 10, 13)) == [11, 12, 13]
        assert seqs(await eventlog.tail(js, SID, by_seq[2], 10, 13)) == [11, 12, 13]
        assert seqs(await eventlog.tail(js, SID, 1, 10, 10)) == []
        # longer than the direct gets: the consumer goes on from where they ended
        assert seqs(await eventlog.tail(js, SID, by_seq[1], 1, 30)) == list(range(2, 31))
        assert seqs(await eventlog.tail(js, SID, by_seq[1], 1, 30, max_messages=2)) == list(range(2, 31))
        # a hint past the message holding after + 1: the gap is seen, None
        assert await eventlog.tail(js, SID, by_seq[12], 10, 13) is None
        assert await eventlog.tail(js, SID, by_seq[12], 10, 20, max_messages=0) is None
        # a hint past the stream's end (a stream made again), or events not in the stream yet
        assert await eventlog.tail(js, SID, int(info.state.last_seq) + 100, 10, 13) is None
        assert await eventlog.tail(js, SID, by_seq[28], 28, 35, max_messages=1) is None

    run(tmp_path, go)
