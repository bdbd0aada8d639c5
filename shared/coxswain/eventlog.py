"""The JetStream side of the event log: the stream, publishing in order, reading a session.

Events are recorded first in Redis (``seq`` assigned atomically with the state change, kept in
the session's outbox) and then published here in ``seq`` order by whoever holds the session's
publish lock. ``Nats-Msg-Id = <sid>:<seq>`` makes a republish after a crash a no-op within the
stream's duplicate window, so the log never holds a seq twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext, api

from . import events, subjects

DUPLICATE_WINDOW_S = 300.0


def stream_config() -> api.StreamConfig:
    return api.StreamConfig(
        name=subjects.EVENTS_STREAM,
        subjects=[subjects.EVENTS_WILDCARD],
        storage=api.StorageType.FILE,
        retention=api.RetentionPolicy.LIMITS,
        duplicate_window=DUPLICATE_WINDOW_S,
        deny_delete=True,
        deny_purge=True,
        allow_direct=True,
        max_msg_size=1_048_576,
    )


async def ensure_stream(js: JetStreamContext) -> None:
    """Create the events stream, or bring an existing one to this configuration."""
    cfg = stream_config()
    try:
        await js.stream_info(subjects.EVENTS_STREAM)
    except nats.js.errors.NotFoundError:
        with contextlib.suppress(nats.js.errors.BadRequestError):
            await js.add_stream(cfg)
            return
    with contextlib.suppress(nats.js.errors.BadRequestError):
        await js.update_stream(cfg)


WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code when ``Nats-Expected-Last-Subject-Sequence`` does not hold."""
CURSORS_MAX = 10_000


class OutOfOrder(Exception):
    """The stream's last event of the session is not the one before this batch: someone else
    publishes the session now (or holds the events in between); this publisher stops."""


Cursors = dict[str, tuple[int, int]]
"""sid -> (event seq, stream seq) of the session's last event in the stream, as last seen."""


async def last_in_stream(js: JetStreamContext, sid: str) -> tuple[int, int]:
    """(event seq, stream seq) of the session's last event in the stream; (0, 0) if none."""
    try:
        msg = await js.get_last_msg(subjects.EVENTS_STREAM, subjects.events(sid), direct=True)
    except nats.js.errors.NotFoundError:
        return 0, 0
    return _seq_of(msg.data.decode() if msg.data else "{}"), int(msg.seq or 0)


async def publish(js: JetStreamContext, sid: str, entries: list[str], timeout: float = 5.0,
                  cursors: Cursors | None = None) -> int:
    """Publish outbox entries (JSON strings holding ``seq``) in order; the last seq now in the stream.

    Each publish is conditional (``Nats-Expected-Last-Subject-Sequence``): it lands only right
    after the event before it. A lock can lapse while its publisher is paused or slow, and two
    publishers of one session then run at once; unconditioned, they interleaved and the stream
    held 465 before 448 (a reader skipping back never saw 448..464). Now the second one finds
    the subject moved, stops (:class:`OutOfOrder`), and the log is in seq order, gap-free.
    """
    subject = subjects.events(sid)
    cursors = {} if cursors is None else cursors
    pos = cursors.get(sid)
    for raw in entries:
        seq = _seq_of(raw)
        for attempt in (0, 1):
            if pos is None or (seq != pos[0] + 1 and seq > pos[0]):
                pos = await last_in_stream(js, sid)
            if seq <= pos[0]:
                break  # already in the stream (published by someone else, or before a crash)
            if seq != pos[0] + 1:
                cursors.pop(sid, None)
                raise OutOfOrder(f"{sid}: the stream ends at seq {pos[0]}, this batch holds {seq}")
            try:
                ack = await js.publish(subject, _recordable(raw), timeout=timeout, headers={
                    "Nats-Msg-Id": f"{sid}:{seq}", "Nats-Expected-Last-Subject-Sequence": str(pos[1])})
            except nats.js.errors.APIError as exc:
                if exc.err_code != WRONG_LAST_SEQUENCE or attempt:
                    cursors.pop(sid, None)
                    raise
                pos = None  # another publisher moved the subject: look again
                continue
            pos = (seq, int(ack.seq))
            break
    if pos is not None:
        if len(cursors) >= CURSORS_MAX:
            cursors.clear()
        cursors[sid] = pos
    return pos[0] if pos is not None else 0


def _recordable(raw: str) -> bytes:
    """The entry, or when it is larger than the stream takes an ``event.omitted`` in its place
    (same seq): a publish that can never succeed would block the session's log for good."""
    data = raw.encode("utf-8", errors="surrogatepass")
    if len(data) <= events.MAX_EVENT_BYTES:
        return data
    ev = json.loads(raw)
    keep = {k: ev[k] for k in ("seq", "ts", "sid", "turn_id") if k in ev}
    return json.dumps({**keep, "type": "event.omitted", "original_type": str(ev.get("type", "")),
                       "bytes": len(data)}).encode()


def _seq_of(raw: str) -> int:
    if not raw.startswith("{"):
        return 0
    # The Lua library writes seq first: {"seq":N,...}; parse fully only if that ever changes.
    if raw.startswith('{"seq":'):
        end = raw.find(",", 7)
        if end > 0:
            with contextlib.suppress(ValueError):
                return int(raw[7:end])
    return int(json.loads(raw).get("seq", 0))


class EventFeed:
    """One session's events after ``after``, in order, then new ones as they are published.

    An ephemeral pull consumer filtered on the session's subject; events at or below the last
    seq already given are dropped, so a republished event is never handed out twice.
    """

    def __init__(self, js: JetStreamContext, sid: str, after: int = 0) -> None:
        self.js = js
        self.sid = sid
        self.last = after
        self.caught_up = False
        self._sub: Any = None

    async def __aenter__(self) -> EventFeed:
        cfg = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.ALL,
            ack_policy=api.AckPolicy.NONE,
            inactive_threshold=10.0,
            mem_storage=True,
            max_ack_pending=-1,
        )
        self._sub = await self.js.pull_subscribe(
            subjects.events(self.sid), stream=subjects.EVENTS_STREAM, config=cfg
        )
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._sub is not None:
            sub, self._sub = self._sub, None
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            # Delete the consumer now: an idle one would live for inactive_threshold, and a
            # stream holds at most 1000, so busy readers would soon be refused (a 503 for all).
            with contextlib.suppress(Exception):
                await self.js.delete_consumer(subjects.EVENTS_STREAM, sub._consumer)

    async def next(self, timeout: float, limit: int = 256) -> list[dict[str, Any]]:
        """Events with seq above the last given, waiting up to ``timeout`` s for the first."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            remaining = deadline - loop.time()
            try:
                msgs = await self._sub.fetch(batch=limit, timeout=max(0.05, remaining))
            except (TimeoutError, nats.errors.TimeoutError):
                return []
            out = []
            for m in msgs:
                with contextlib.suppress(Exception):
                    self.caught_up = m.metadata.num_pending == 0
                ev = json.loads(m.data)
                seq = int(ev.get("seq", 0))
                if seq > self.last:
                    self.last = seq
                    out.append(ev)
            if out:
                return out
            # Only events already given came back: keep reading (old data arrives at once)
            # until caught up, then wait for new ones while time remains.
            if self.caught_up and deadline - loop.time() <= 0:
                return []


async def backlog(js: JetStreamContext, sid: str, after: int, until: int, limit: int = 1000,
                  timeout: float = 5.0) -> list[dict[str, Any]]:
    """The session's events with ``after < seq <= until``, at most ``limit``, from the stream.

    ``until`` is the session's seq as Redis has it: events are recorded there first and
    published an instant later, so the read waits (up to ``timeout``) for the stream to catch up
    instead of taking a quiet moment for the end of the log.
    """
    if until <= after or limit <= 0:
        return []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    out: list[dict[str, Any]] = []
    async with EventFeed(js, sid, after) as feed:
        while len(out) < limit and feed.last < until:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            batch = await feed.next(timeout=min(1.0, remaining), limit=min(256, limit - len(out)))
            out.extend(ev for ev in batch if int(ev["seq"]) <= until)
    return out[:limit]


class Tail:
    """A session's events after ``after``: the backlog from the stream, then live ones.

    Live events come from a plain NATS subscription to the session's subject (every JetStream
    publish is also a NATS message), so a reader holds no JetStream consumer while it waits and
    sees an event as soon as it is published. The seq makes it exact: a repeat is dropped, and a
    gap (a message lost while the connection blinked, or a full buffer) is filled from the
    stream before anything after it is handed out.
    """

    QUEUE = 10_000

    def __init__(self, nc: Any, js: JetStreamContext, sid: str, after: int,
                 seq_now: Callable[[], Awaitable[int]]) -> None:
        self.nc = nc
        self.js = js
        self.sid = sid
        self.last = after
        self.seq_now = seq_now
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(self.QUEUE)
        self._overflow = False
        self._sub: Any = None
        self._caught_up = False

    async def __aenter__(self) -> Tail:
        async def on_msg(msg: Any) -> None:
            try:
                self._queue.put_nowait(msg.data)
            except asyncio.QueueFull:
                self._overflow = True

        self._sub = await self.nc.subscribe(subjects.events(self.sid), cb=on_msg)
        await self.nc.flush()  # subscribed before the backlog is read: nothing falls between
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
            self._sub = None

    async def _fill(self, until: int, limit: int) -> list[dict[str, Any]]:
        evs = await backlog(self.js, self.sid, self.last, until, limit)
        if evs:
            self.last = int(evs[-1]["seq"])
        return evs

    async def next(self, timeout: float, limit: int = 1000) -> list[dict[str, Any]]:
        """The next events in order (at most ``limit``), waiting up to ``timeout`` s for one."""
        if not self._caught_up or self._overflow:
            self._overflow = False
            target = await self.seq_now()
            evs = await self._fill(target, limit)
            if self.last >= target:
                self._caught_up = True
            if evs:
                return evs
        try:
            raw = [await asyncio.wait_for(self._queue.get(), timeout)]
        except TimeoutError:
            return []
        while not self._queue.empty() and len(raw) < limit:
            raw.append(self._queue.get_nowait())
        out: list[dict[str, Any]] = []
        for data in raw:
            ev = json.loads(data)
            seq = int(ev.get("seq", 0))
            if seq <= self.last:
                continue
            if seq > self.last + 1:
                out.extend(await self._fill(seq - 1, limit))
                if self.last < seq - 1:
                    # The stream does not have them yet (it will): read from there next time.
                    self._caught_up = False
                    return out
            out.append(ev)
            self.last = seq
        return out
