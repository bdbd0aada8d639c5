"""The JetStream side of the event log: the stream, publishing in order, reading a session.

Events are recorded first in Redis (``seq`` assigned atomically with the state change, kept in
the session's outbox) and then published here in ``seq`` order by whoever holds the session's
publish lock. Each publish is conditional on the session's last message in the stream, so the
log never holds a seq twice or out of order.

**One message holds one or more events**: consecutive events of one session, their JSON joined
by newlines (JSON text holds no raw newline), at most :data:`events.MAX_EVENT_BYTES`, and never
two events a webhook can ask for (:data:`notify.NOTIFY_EVENTS`: ``turn.end``, ``approval.pending``,
``limit.warning``), so a webhook's delivery id (the message's stream seq) still names one event
(:func:`webhook_event` finds it). A turn's end and the next queued turn's start, which one atomic
call records, are one message. A message is a JetStream round trip and a store write (with
``sync_interval: always`` an fsync) whatever its size: a tool call's three events in one
message cost 0.2 ms of the publisher's CPU and 0.23-0.33 ms of nats-server's, against 0.57-0.60
and 0.65-0.73 ms as three (bench/ANALYSIS.md). Every reader here splits a message back into its
events (:func:`events_in`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import Any, TypeVar

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext, api

from . import bus, events, notify, subjects

DUPLICATE_WINDOW_S = 300.0


def stream_config(replicas: int = 1) -> api.StreamConfig:
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
        num_replicas=replicas,
    )

T = TypeVar("T")


class StreamMisconfigured(Exception):
    """The events stream cannot have the configured replica count (e.g. more replicas than the
    cluster has JetStream nodes): the server's refusal, with what was asked."""


async def ensure_stream(js: JetStreamContext, replicas: int = 1, patience_s: float = 30.0) -> api.StreamInfo:
    """Create the events stream, or bring an existing one to this configuration.

    An existing stream with another replica count is updated to ``replicas`` (JetStream moves or
    adds the copies); if the server refuses, :class:`StreamMisconfigured` says why rather than
    running on a stream that is not replicated the way ``[nats] stream_replicas`` says. While
    JetStream answers "unavailable" or not at all (a cluster electing its leaders, a loaded
    machine) it is asked again for up to ``patience_s``.
    """
    return await patiently(lambda: _ensure_stream(js, replicas), patience_s)


async def patiently(call: Callable[[], Awaitable[T]], patience_s: float = 30.0) -> T:
    """``call()``, asked again every 0.5 s while JetStream answers "unavailable" or not at all
    (a cluster electing its leaders, a loaded machine), for up to ``patience_s``: what a
    service's start-up asks of JetStream (the events stream, the archive bucket)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience_s
    while True:
        try:
            return await call()
        except (nats.js.errors.ServiceUnavailableError, nats.errors.TimeoutError, nats.errors.NoRespondersError):
            if loop.time() > deadline:
                raise
            await asyncio.sleep(0.5)


async def _ensure_stream(js: JetStreamContext, replicas: int) -> api.StreamInfo:
    cfg = stream_config(replicas)
    refused: Exception | None = None
    try:
        await js.stream_info(subjects.EVENTS_STREAM)
    except nats.js.errors.NotFoundError:
        try:
            return await js.add_stream(cfg)
        except (nats.js.errors.BadRequestError, nats.js.errors.ServerError) as exc:  # raced, or refused
            refused = exc
    try:
        await js.update_stream(cfg)
    except (nats.js.errors.BadRequestError, nats.js.errors.ServerError) as exc:
        refused = exc
    except nats.js.errors.NotFoundError as exc:  # add_stream refused and there is still no stream
        raise StreamMisconfigured(f"cannot create stream {subjects.EVENTS_STREAM} with {replicas} "
                                  f"replica(s): {refused!r}") from exc
    info = await js.stream_info(subjects.EVENTS_STREAM)
    have = info.config.num_replicas or 1
    if have != replicas:
        raise StreamMisconfigured(f"stream {subjects.EVENTS_STREAM} has {have} replica(s), [nats] "
                                  f"stream_replicas asks for {replicas}: {refused!r}")
    return info


WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code when ``Nats-Expected-Last-Subject-Sequence`` does not hold."""
CURSORS_MAX = 10_000
CONSUMER_RETRY_S = 15.0
"""How long a reader retries creating its consumer while JetStream answers 503 or times out (a
leader election). When the node lost was the cluster's metadata leader, consumers can only be
created once a new one is elected: 6 s was seen on a loaded 2-core machine (5 s was too short)."""


class OutOfOrder(Exception):
    """The stream's last event of the session is not the one before this batch: someone else
    publishes the session now (or holds the events in between); this publisher stops."""


Cursors = dict[str, tuple[int, int]]
"""sid -> (event seq, stream seq) of the session's last event in the stream, as last seen (the
stream seq of the message that holds it)."""


async def last_in_stream(js: JetStreamContext, sid: str) -> tuple[int, int]:
    """(event seq, stream seq) of the session's last event in the stream; (0, 0) if none."""
    try:
        msg = await js.get_last_msg(subjects.EVENTS_STREAM, subjects.events(sid), direct=True)
    except nats.js.errors.NotFoundError:
        return 0, 0
    return seq_of(last_event(msg.data or b"{}").decode()), int(msg.seq or 0)


async def publish(js: JetStreamContext, sid: str, entries: list[str], timeout: float = 5.0,
                  cursors: Cursors | None = None, sent: Callable[[int, int, int], None] | None = None) -> int:
    """Publish outbox entries (JSON strings holding ``seq``) in order; the last seq now in the stream.

    Consecutive entries go out as one message (:func:`_message`). Each publish is conditional
    (``Nats-Expected-Last-Subject-Sequence``): it lands only right after the message before it.
    A lock can lapse while its publisher is paused or slow, and two publishers of one session
    then run at once; unconditioned, they interleaved and the stream held 465 before 448 (a
    reader skipping back never saw 448..464). Now the second one finds the subject moved, stops
    (:class:`OutOfOrder`), and the log is in seq order, gap-free.

    ``sent(first, last, stream_seq)`` is told of each message the stream acknowledged.
    """
    subject = subjects.events(sid)
    cursors = {} if cursors is None else cursors
    pos = cursors.get(sid)
    i, retried = 0, False
    while i < len(entries):
        seq = seq_of(entries[i])
        if pos is None and seq == 1:
            pos = (0, 0)  # a session's first event: its subject is empty (else the publish fails: look)
        elif pos is None or (seq != pos[0] + 1 and seq > pos[0]):
            pos = await last_in_stream(js, sid)
        if seq <= pos[0]:
            i += 1  # already in the stream (published by someone else, or before a crash)
            continue
        if seq != pos[0] + 1:
            cursors.pop(sid, None)
            raise OutOfOrder(f"{sid}: the stream ends at seq {pos[0]}, this batch holds {seq}")
        end, last, data = _message(entries, i, seq)
        msg_id = f"{sid}:{seq}" if last == seq else f"{sid}:{seq}-{last}"
        try:
            stream_seq = await bus.js_publish(js, subject, data, timeout, {
                "Nats-Msg-Id": msg_id, "Nats-Expected-Last-Subject-Sequence": str(pos[1])})
        except nats.js.errors.APIError as exc:
            if exc.err_code != WRONG_LAST_SEQUENCE or retried:
                cursors.pop(sid, None)
                raise
            # Another publisher moved the subject (or the position this one had was a stale
            # hint): look at the stream.
            retried, pos = True, await last_in_stream(js, sid)
            continue
        retried, pos, i = False, (last, stream_seq), end
        if sent is not None:
            sent(seq, last, pos[1])
    if pos is not None:
        if len(cursors) >= CURSORS_MAX:
            cursors.clear()
        cursors[sid] = pos
    return pos[0] if pos is not None else 0


def _message(entries: list[str], i: int, seq: int) -> tuple[int, int, bytes]:
    """One message from ``entries[i]`` on: (the index after it, its last seq, its bytes).

    It takes the entries that follow with consecutive seqs while they fit in
    :data:`events.MAX_EVENT_BYTES`, and ends before a second event a webhook can ask for."""
    parts = [_recordable(entries[i])]
    hooked = _webhook_candidate(entries[i])
    size, last, j = len(parts[0]), seq, i + 1
    while j < len(entries):
        nxt = entries[j]
        if seq_of(nxt) != last + 1:
            break
        if _webhook_candidate(nxt):
            if hooked:
                break
            hooked = True
        data = _recordable(nxt)
        if size + 1 + len(data) > events.MAX_EVENT_BYTES:
            break
        parts.append(data)
        size += 1 + len(data)
        last += 1
        j += 1
    return j, last, b"\n".join(parts)


_WEBHOOK = "(?:" + "|".join(re.escape(t) for t in notify.NOTIFY_EVENTS) + ")"
_CANDIDATE = re.compile(r'"type"\s*:\s*"' + _WEBHOOK + '"')
_CANDIDATE_B = re.compile(rb'"type"\s*:\s*"' + _WEBHOOK.encode() + b'"')


def _webhook_candidate(raw: str) -> bool:
    """Might this event be one a webhook can ask for? (A nested ``"type"`` that matches counts:
    it costs a message, never a wrong delivery: each message holds at most one candidate.)"""
    return _CANDIDATE.search(raw) is not None


def webhook_event(data: bytes) -> bytes:
    """The event of a message that its stream seq names for a webhook: its one event that may be
    a webhook's (:func:`_message` never puts two in a message; the notifier still reads its
    ``type``, so a nested look-alike is no delivery), else its last. A message written when such
    an event always ended its message reads the same."""
    m = _CANDIDATE_B.search(data)
    if m is None:
        return last_event(data)
    start = data.rfind(b"\n", 0, m.start()) + 1
    end = data.find(b"\n", m.end())
    return data[start:] if end < 0 else data[start:end]


def last_event(data: bytes) -> bytes:
    """The last event of a message, as recorded: the session's last seq in it."""
    return data.rsplit(b"\n", 1)[-1]


def events_in(data: bytes) -> list[dict[str, Any]]:
    """The events one message of the stream holds, in order (one per line)."""
    return [json.loads(line) for line in data.split(b"\n") if line]


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


def seq_of(raw: str) -> int:
    """The seq of an outbox entry (0 for what is not one)."""
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

    def __init__(self, js: JetStreamContext, sid: str, after: int = 0, start: int | None = None) -> None:
        self.js = js
        self.sid = sid
        self.last = after
        self.start = start
        """A stream seq to deliver from (the session's messages before it are skipped by the
        server, not read and dropped here); None: from the subject's first message."""
        self.caught_up = False
        self._sub: Any = None

    async def __aenter__(self) -> EventFeed:
        cfg = api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.ALL if self.start is None else api.DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.start,
            ack_policy=api.AckPolicy.NONE,
            inactive_threshold=10.0,
            mem_storage=True,
            max_ack_pending=-1,
        )
        # On a NATS cluster creating a consumer is a round through the meta leader and the
        # stream's leader; while either is being elected (a node lost, or a loaded machine
        # missing heartbeats) JetStream answers 503 for a moment. Ride over that, bounded.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CONSUMER_RETRY_S
        while True:
            try:
                self._sub = await self.js.pull_subscribe(
                    subjects.events(self.sid), stream=subjects.EVENTS_STREAM, config=cfg
                )
                return self
            except (nats.js.errors.ServiceUnavailableError, nats.errors.TimeoutError):
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.2)

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
        """Events with seq above the last given, waiting up to ``timeout`` s for the first (those of
        at most ``limit`` messages)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        unanswered_until = loop.time() + CONSUMER_RETRY_S
        while True:
            remaining = deadline - loop.time()
            try:
                msgs = await self._sub.fetch(batch=limit, timeout=max(0.05, remaining))
            except (TimeoutError, nats.errors.TimeoutError):
                return []
            except nats.js.errors.ServiceUnavailableError:
                # "no responders" to the pull request: on a cluster the consumer just created
                # lives on another node and its interest has not reached this one yet (or its
                # node is being replaced). A moment later it answers; bounded.
                if loop.time() > unanswered_until:
                    raise
                await asyncio.sleep(0.05)
                continue
            out = []
            for m in msgs:
                with contextlib.suppress(Exception):
                    self.caught_up = m.metadata.num_pending == 0
                for ev in events_in(m.data):
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
                  timeout: float = 5.0, start: int | None = None) -> list[dict[str, Any]]:
    """The session's events with ``after < seq <= until``, at most ``limit``, from the stream
    (from stream seq ``start`` on, when the caller knows where they begin: :class:`EventFeed`).

    ``until`` is the session's seq as Redis has it: events are recorded there first and
    published an instant later, so the read waits (up to ``timeout``) for the stream to catch up
    instead of taking a quiet moment for the end of the log.
    """
    if until <= after or limit <= 0:
        return []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    out: list[dict[str, Any]] = []
    async with EventFeed(js, sid, after, start=start) as feed:
        while len(out) < limit and feed.last < until:
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            batch = await feed.next(timeout=min(1.0, remaining), limit=min(256, limit - len(out)))
            out.extend(ev for ev in batch if int(ev["seq"]) <= until)
    return out[:limit]


TAIL_MESSAGES = 8
"""At most this many direct gets for :func:`tail`; the rest of a longer tail (another runner's
turns meanwhile) is read with a consumer that starts where they ended."""
TAIL_GET_S = 1.0
"""Bound on one direct get of :func:`tail` (the caller reads the whole log after a failure)."""


async def tail(js: JetStreamContext, sid: str, start: int, after: int, until: int,
               max_messages: int = TAIL_MESSAGES) -> list[dict[str, Any]] | None:
    """The session's events with ``after < seq <= until``, read message by message from stream
    seq ``start`` on (direct gets, no consumer: a few round trips for a short tail), and past
    ``max_messages`` messages by a consumer delivering from where those ended.

    ``start`` is only a hint (where the session's messages were when ``after`` was current); the
    events must follow on from ``after`` without a gap, or None is answered and the caller reads
    the log from its start: a message holding ``after + 1`` that lies before ``start``, a stream
    recreated meanwhile, or events not in the stream yet.
    """
    if until <= after:
        return []
    subject = subjects.events(sid)
    out: list[dict[str, Any]] = []
    last, pos = after, max(1, start)
    for _ in range(max_messages):
        try:
            msg = await asyncio.wait_for(
                js.get_msg(subjects.EVENTS_STREAM, seq=pos, subject=subject, direct=True, next=True), TAIL_GET_S)
        except nats.js.errors.NotFoundError:
            return None
        for ev in events_in(msg.data or b""):
            seq = int(ev.get("seq", 0))
            if seq <= last:
                continue
            if seq != last + 1:
                return None
            last = seq
            if seq <= until:
                out.append(ev)
        if last >= until:
            return out
        pos = int(msg.seq or 0) + 1
        if pos <= 1:
            return None
    rest = await backlog(js, sid, last, until, limit=until - last, timeout=TAIL_GET_S * 2, start=pos)
    if [int(e.get("seq", 0)) for e in rest] != list(range(last + 1, until + 1)):
        return None
    return out + rest


class Shared(dict[str, Any]):
    """An event of a live message, parsed once and shared by every reader of its session in the
    process: read it, never change it. ``raw`` is its JSON as the stream holds it (one line of
    the message); ``sse`` is a slot for what a reader renders of it once for all of them (the
    gateway's SSE frame, made of ``raw``)."""

    __slots__ = ("raw", "sse")
    raw: bytes
    sse: bytes


class Message:
    """One live message of a session, as every reader of it is offered it: its bytes, and its
    events parsed by the first reader that asks (:class:`Shared`). With 200 readers of one
    session, parsing it for each was most of the gateway's CPU (a 60 KB tool result, 200 times)."""

    __slots__ = ("_events", "data")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._events: list[Shared] | None = None

    def events(self) -> list[Shared]:
        if self._events is None:
            out = []
            lines = [line for line in self.data.split(b"\n") if line]
            for line, parsed in zip(lines, events_in(self.data), strict=True):
                ev = Shared(parsed)
                ev.raw = line
                out.append(ev)
            self._events = out
        return self._events


class Reader:
    """One reader's share of a session's live events: a buffer bounded in bytes.

    :class:`Hub` hands every message to every reader with :meth:`offer`, which never waits: a
    reader whose buffer would pass ``max_bytes`` is marked ``overflowed`` (its buffer emptied,
    ``on_overflow`` called) and takes nothing more until :meth:`reset`. One event larger than the
    bound is taken when the buffer is empty. The buffered messages are shared by every reader of
    the session (:class:`Message`), so readers that fall behind together cost one copy, and one
    parse.
    """

    def __init__(self, max_bytes: int, on_overflow: Callable[[Reader], None] | None = None) -> None:
        self.max_bytes = max_bytes
        self.on_overflow = on_overflow
        self.overflowed = False
        self._buf: collections.deque[Message] = collections.deque()
        self._bytes = 0
        self._wake = asyncio.Event()

    def offer(self, msg: Message) -> None:
        if self.overflowed:
            return
        if self._buf and self._bytes + len(msg.data) > self.max_bytes:
            self.overflowed = True
            self._buf.clear()
            self._bytes = 0
            self._wake.set()
            if self.on_overflow is not None:
                self.on_overflow(self)
            return
        self._buf.append(msg)
        self._bytes += len(msg.data)
        self._wake.set()

    def reset(self) -> None:
        """Take events again after an overflow (the caller reads what it missed from the stream)."""
        self.overflowed = False

    async def take(self, timeout: float, limit: int, max_bytes: int | None = None) -> list[Message]:
        """Up to ``limit`` buffered messages (and about ``max_bytes``), waiting up to ``timeout``
        s for the first."""
        if not self._buf and not self.overflowed:
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
        out: list[Message] = []
        size = 0
        while self._buf and len(out) < limit and (max_bytes is None or size < max_bytes):
            msg = self._buf.popleft()
            self._bytes -= len(msg.data)
            size += len(msg.data)
            out.append(msg)
        return out


class _Channel:
    def __init__(self) -> None:
        self.readers: set[Reader] = set()
        self.sub: Any = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def deliver(self, msg: Any) -> None:
        shared = Message(msg.data)
        for r in tuple(self.readers):
            r.offer(shared)


class Hub:
    """One plain NATS subscription per session, shared by all of its readers in this process.

    A reader joins with :meth:`reader`; the first one subscribes, the last one to leave
    unsubscribes. Each message is offered to every reader's bounded buffer (:class:`Reader`)
    without waiting, so a reader that does not keep up never slows the others, the NATS
    connection (a slow consumer is dropped by the server) or the process's memory.
    """

    def __init__(self, nc: Any) -> None:
        self.nc = nc
        self._channels: dict[str, _Channel] = {}

    @property
    def subscriptions(self) -> int:
        return len(self._channels)

    @contextlib.asynccontextmanager
    async def reader(self, sid: str, max_bytes: int,
                     on_overflow: Callable[[Reader], None] | None = None) -> AsyncIterator[Reader]:
        reader = Reader(max_bytes, on_overflow)
        ch = self._channels.get(sid)
        first = ch is None
        if ch is None:
            ch = self._channels[sid] = _Channel()
        ch.readers.add(reader)  # before the subscription exists: nothing it delivers is missed
        try:
            if first:
                try:
                    ch.sub = await self.nc.subscribe(subjects.events(sid), cb=ch.deliver)
                    # Subscribed before the backlog is read: nothing falls between. Shielded: nats-py
                    # answers a PONG by setting the oldest ping's future, and one cancelled with
                    # its reader (a client that went away) raises there and ends the connection's
                    # read loop: every later request of the process timed out.
                    await asyncio.shield(self.nc.flush())
                except BaseException as exc:
                    ch.ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError("cancelled"))
                    if self._channels.get(sid) is ch:
                        del self._channels[sid]  # the next reader tries again
                    raise
                ch.ready.set_result(None)
            else:
                await asyncio.shield(ch.ready)
            yield reader
        finally:
            ch.readers.discard(reader)
            if not ch.readers and self._channels.get(sid) is ch:
                del self._channels[sid]
                if ch.sub is not None:
                    with contextlib.suppress(Exception):
                        await ch.sub.unsubscribe()


class Tail:
    """A session's events after ``after``: the backlog from the stream, then live ones.

    Live events come from the session's plain NATS subscription (every JetStream publish is also
    a NATS message), shared through a :class:`Hub`, so a reader holds no JetStream consumer
    while it waits and sees an event as soon as it is published. The seq makes it exact: a
    repeat is dropped, and a gap (a message lost while the connection blinked, an overflowed
    buffer, or nothing heard for ``timeout``) is filled from the stream before anything after it
    is handed out.
    """

    def __init__(self, hub: Hub, js: JetStreamContext, sid: str, after: int,
                 seq_now: Callable[[], Awaitable[int]], max_bytes: int = 8 * 1_048_576,
                 on_overflow: Callable[[Reader], None] | None = None) -> None:
        self.hub = hub
        self.js = js
        self.sid = sid
        self.last = after
        self.seq_now = seq_now
        self.max_bytes = max_bytes
        self.on_overflow = on_overflow
        self.reader: Reader | None = None
        self._cm: Any = None
        self._caught_up = False
        self._spill: list[dict[str, Any]] = []
        """Events of live messages beyond the last call's ``limit``, in order: given next."""

    async def __aenter__(self) -> Tail:
        self._cm = self.hub.reader(self.sid, self.max_bytes, self.on_overflow)
        self.reader = await self._cm.__aenter__()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        cm, self._cm = self._cm, None
        if cm is not None:
            await cm.__aexit__(exc_type, exc, tb)

    async def _fill(self, until: int, limit: int) -> list[dict[str, Any]]:
        evs = await backlog(self.js, self.sid, self.last, until, limit)
        if evs:
            self.last = int(evs[-1]["seq"])
        return evs

    async def _catch_up(self, limit: int) -> list[dict[str, Any]]:
        """What the stream holds up to the session's seq now (after an overflow, take again first)."""
        assert self.reader is not None
        self.reader.reset()
        target = await self.seq_now()
        evs = await self._fill(target, limit) if target > self.last else []
        self._caught_up = self.last >= target
        return evs

    async def next(self, timeout: float, limit: int = 1000, max_bytes: int | None = None) -> list[dict[str, Any]]:
        """The next events in order (at most ``limit``), waiting up to ``timeout`` s for one.

        ``max_bytes`` bounds what is taken of the live buffer at once (what a reader holds parsed
        while its client is slow); the backlog is bounded by ``limit`` alone."""
        assert self.reader is not None, "use Tail as an async context manager"
        if self._spill:
            spill, self._spill = self._spill, []
            out = await self._accept(spill, limit)
            if out:
                return out
        if not self._caught_up or self.reader.overflowed:
            evs = await self._catch_up(limit)
            if evs:
                return evs
        raw = await self.reader.take(timeout, limit, max_bytes)
        if not raw:
            # Quiet for a while (or overflowed): a message lost while the connection blinked
            # would leave the reader behind until the next event; the session's seq says.
            return await self._catch_up(limit)
        return await self._accept([e for msg in raw for e in msg.events()], limit)

    async def _accept(self, evs: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
        """The events of live messages that follow the last given (at most ``limit``; a gap before
        one is filled from the stream first). What a message held beyond ``limit`` is kept for the
        next call: one message holds up to a publish batch (hundreds of events of a group of
        reads), and reading those from the stream again would read the session's log from its
        start (a consumer on its subject) for every ``limit`` of them."""
        out: list[dict[str, Any]] = []
        for k, ev in enumerate(evs):
            seq = int(ev.get("seq", 0))
            if seq <= self.last:
                continue
            if len(out) >= limit:
                self._spill = evs[k:]
                break
            if seq > self.last + 1:
                out.extend(await self._fill(seq - 1, limit - len(out)))
                if self.last < seq - 1:
                    # The stream does not have them yet (it will): read from there next time.
                    self._caught_up = False
                    return out
            out.append(ev)
            self.last = seq
        return out
