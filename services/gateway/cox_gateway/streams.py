"""Event streams (SSE) that a slow client cannot turn against the gateway.

- One NATS subscription per session, shared by its readers (``eventlog.Hub``); each reader has
  a buffer bounded in bytes (``[gateway] stream_buffer_bytes``). The fan-out never waits, and
  it costs one parse of a message and one rendering of an event (:func:`frame`) for all of the
  session's readers: 200 of them on a turn of ten 60 KB results cost the gateway 0.1 s, not 0.4 s.
- A reader that falls behind is dropped: its buffer overflowed, or one write to its socket has
  waited ``stream_stall_s``. Its connection is aborted at once (a never-reading client would
  otherwise hold its unsent bytes, and the socket, forever); a client resumes with ``after`` or
  ``Last-Event-ID``, which ``EventSource`` sends by itself. Logged (``stream.dropped``) and
  counted (``cox_event_streams_dropped_total{reason}``).
- What a stream holds at once is bounded too: events are taken and written in chunks of about
  ``CHUNK_BYTES``, the backlog is read ``BACKLOG_BATCH`` events at a time, and the socket's
  kernel send buffer is ``SOCKET_SNDBUF``.
- A principal holds at most ``max_streams_per_principal`` event streams (SSE and waiting JSON
  reads): the next one is ``429 too_many_streams``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
from nats.js import JetStreamContext
from starlette.responses import Response
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from coxswain import eventlog
from coxswain.config import GatewayConfig
from coxswain.errors import TooManyStreams

from . import metrics

TRANSPORT = "cox.transport"
"""The scope key under which :class:`HttpProtocol` puts the connection's transport."""
SOCKET_SNDBUF = 131_072
"""An event stream's kernel send buffer. Left to autotuning, Linux lets one client that never
reads hold some 2.3 MB of the gateway's writes in the kernel, so it looks fast while it soaks
up memory; with this (doubled by the kernel) it is seen to stall after some 300 KB."""
CHUNK_BYTES = 65_536
BACKLOG_BATCH = 32
HEARTBEAT_S = 15.0


JOIN_MAX = 65_536
"""A body's first write up to this size is joined to its head (a larger one is not copied for it)."""


class HeadWithBody:
    """A connection's transport that sends a response's head with the first bytes after it.

    uvicorn writes a response's status line and headers as the app starts the response and its
    body as the app sends it: two system calls and two packets, and a client that read the head
    waits again for the body (15-160 µs apart on the 2-core VM of issue #23, another process
    often running between them). Here a write that is a whole response head is held, and goes
    out with the next write, or at the event loop's next pass if none comes in this one (a
    HEAD's reply, a ``100 Continue``, a stream's head before its first event): nothing waits
    longer than that, and every write, held or not, leaves in the order it was made.
    """

    __slots__ = ("_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: bytes | None = None
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            if len(data) <= JOIN_MAX:
                self._transport.write(held + bytes(data))
            else:  # not copied: two writes, in order
                self._transport.write(held)
                self._transport.write(data)
        elif data[:5] == b"HTTP/" and bytes(data[-4:]) == b"\r\n\r\n":
            self._held = bytes(data)
            self._loop.call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:  # the rest is the transport's own (abort drops what is held)
        return getattr(self._transport, name)


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, giving each request its connection's transport, which sends
    a response's head with its body (:class:`HeadWithBody`).

    uvicorn closes a connection gracefully: the bytes already written are sent first, which for
    a client that never reads is never. Dropping a slow reader must free its socket now
    (``transport.abort()``), and an event stream bounds its socket's send buffer.
    """

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(HeadWithBody(transport))  # type: ignore[arg-type]

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope[TRANSPORT] = self.transport  # type: ignore[literal-required]


class Slots:
    """Open event streams per principal, at most ``limit`` each."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open: Counter[str] = Counter()

    @contextlib.contextmanager
    def hold(self, who: str) -> Iterator[None]:
        self.take(who)
        try:
            yield
        finally:
            self.give(who)

    def take(self, who: str) -> None:
        if self.open[who] >= self.limit:
            metrics.STREAMS_REFUSED.inc()
            raise TooManyStreams(f"this principal has {self.open[who]} event streams open, the most it may "
                                 f"(max_streams_per_principal = {self.limit}); close one, or read with "
                                 f"format=json and after")
        self.open[who] += 1

    def give(self, who: str) -> None:
        self.open[who] -= 1
        if self.open[who] <= 0:
            del self.open[who]


class Streams:
    """What this gateway's event streams share: the live subscriptions (one per session), the
    event log, the slots per principal, the limits of ``[gateway]``."""

    def __init__(self, hub: eventlog.Hub, js: JetStreamContext, settings: GatewayConfig, log: Any,
                 stopping: Callable[[], bool]) -> None:
        self.hub = hub
        self.js = js
        self.settings = settings
        self.log = log
        self.stopping = stopping
        self.slots = Slots(settings.max_streams_per_principal)

    def tail(self, sid: str, after: int, seq_now: Callable[[], Awaitable[int]], **kw: Any) -> eventlog.Tail:
        return eventlog.Tail(self.hub, self.js, sid, after, seq_now, **kw)


def frame(ev: dict[str, Any]) -> bytes:
    """The event's SSE frame. A live event is shared by every reader of its session in this
    process (:class:`eventlog.Shared`): it is rendered once, for all of them."""
    done = getattr(ev, "sse", None)
    if done is not None:
        return done  # type: ignore[no-any-return]
    # A live event's data is its JSON as the stream holds it (one line, compact, UTF-8), not parsed
    # and dumped again; an event read from the backlog is dumped compactly.
    data: bytes | None = getattr(ev, "raw", None)
    if data is None:
        data = json.dumps(ev, ensure_ascii=False, separators=(",", ":")).encode()
    out = b"id: %s\nevent: %s\ndata: %s\n\n" % (str(ev["seq"]).encode(), str(ev["type"]).encode(), data)
    if isinstance(ev, eventlog.Shared):
        ev.sse = out
    return out


class EventStream(Response):
    """``text/event-stream`` of one session after ``after``: backlog, then live events."""

    media_type = "text/event-stream"

    def __init__(self, streams: Streams, sid: str, after: int, who: str,
                 seq_now: Callable[[], Awaitable[int]], shared: bool = False) -> None:
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
        self.streams = streams
        self.seq_now = seq_now
        self.sid = sid
        self.after = after
        self.who = who
        self.shared = shared
        """The session is the caller's by a share: a later ``session.unshared`` of it ends the stream."""
        self.dropped = ""
        self._transport: Any = None

    def drop(self, reason: str, seq: int) -> None:
        if self.dropped:
            return
        self.dropped = reason
        metrics.STREAMS_DROPPED.labels(reason).inc()
        self.streams.log.info("stream.dropped", sid=self.sid, principal=self.who, reason=reason, seq=seq)
        if self._transport is not None:
            self._transport.abort()  # a write waiting on the socket returns at once (uvicorn sees it gone)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self._transport = scope.get(TRANSPORT)
        sock = self._transport.get_extra_info("socket") if self._transport is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_SNDBUF)
        try:
            async with anyio.create_task_group() as tg:
                async def stream() -> None:
                    await self._stream(send)
                    tg.cancel_scope.cancel()

                async def disconnected() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await disconnected()
        finally:
            self.streams.slots.give(self.who)

    async def _stream(self, send: Send) -> None:
        streams = self.streams
        settings = streams.settings
        metrics.STREAMS.inc()
        tail: eventlog.Tail | None = None

        def overflow(_: eventlog.Reader) -> None:
            self.drop("overflow", tail.last if tail else self.after)

        async def write(data: bytes) -> bool:
            try:
                async with asyncio.timeout(settings.stream_stall_s):
                    await send({"type": "http.response.body", "body": data, "more_body": True})
            except TimeoutError:
                self.drop("stalled", tail.last if tail else self.after)
            return not self.dropped

        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            if not await write(b"retry: 1000\n\n"):
                return
            opened = await self.seq_now() if self.shared else 0
            tail = streams.tail(self.sid, self.after, self.seq_now, max_bytes=settings.stream_buffer_bytes,
                                on_overflow=overflow)
            async with tail:
                while not streams.stopping() and not self.dropped:
                    batch = await tail.next(timeout=HEARTBEAT_S, limit=BACKLOG_BATCH, max_bytes=CHUNK_BYTES)
                    if self.dropped:
                        return
                    if not batch:
                        if not await write(b": keep-alive\n\n"):
                            return
                        continue
                    chunk: list[bytes] = []
                    size = 0
                    for ev in batch:
                        data = frame(ev)
                        chunk.append(data)
                        size += len(data)
                        if (self.shared and ev.get("type") == "session.unshared" and ev.get("principal") == self.who
                                and int(ev.get("seq") or 0) > opened):
                            # the share was taken back: this event is the stream's last (a clean end)
                            if await write(b"".join(chunk)):
                                await send({"type": "http.response.body", "body": b"", "more_body": False})
                            metrics.STREAMS_DROPPED.labels("unshared").inc()
                            streams.log.info("stream.ended", sid=self.sid, principal=self.who, reason="unshared")
                            return
                        if size >= CHUNK_BYTES:
                            if not await write(b"".join(chunk)):
                                return
                            chunk, size = [], 0
                    if chunk and not await write(b"".join(chunk)):
                        return
        finally:
            metrics.STREAMS.dec()
