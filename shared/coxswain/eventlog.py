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
from types import TracebackType
from typing import Any

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext, api

from . import subjects

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


async def publish(js: JetStreamContext, sid: str, entries: list[str], timeout: float = 5.0) -> None:
    """Publish outbox entries (JSON strings holding ``seq``) in order, deduplicated by seq."""
    subject = subjects.events(sid)
    for raw in entries:
        seq = _seq_of(raw)
        await js.publish(subject, raw.encode(), timeout=timeout, headers={"Nats-Msg-Id": f"{sid}:{seq}"})


def _seq_of(raw: str) -> int:
    # The Lua library writes seq first: {"seq":N,...}; parse fully only if that ever changes.
    if raw.startswith('{"seq":'):
        end = raw.find(",", 7)
        if end > 0:
            with contextlib.suppress(ValueError):
                return int(raw[7:end])
    return int(json.loads(raw)["seq"])


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

    async def drain(self, limit: int = 1000) -> list[dict[str, Any]]:
        """Everything already in the log after ``last`` (up to ``limit``), without waiting."""
        out: list[dict[str, Any]] = []
        self.caught_up = False
        while len(out) < limit and not self.caught_up:
            batch = await self.next(timeout=0.05, limit=min(256, limit - len(out)))
            if not batch:
                break
            out.extend(batch)
        return out
