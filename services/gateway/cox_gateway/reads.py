"""The gateway's reads of sessions: Redis first, the archive for an archived one.

The gateway never changes a session (a change is a NATS request to a turn-runner); it reads the
session hash and, for a session idle long enough to be archived (docs/operations.md, "Idle
sessions"), the archive's entry, without loading it back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from coxswain import archive, keys, session_view
from coxswain.config import Settings
from coxswain.errors import NotFound
from coxswain.models import Session


class SessionReads:
    def __init__(self, redis: Any, js: JetStreamContext, settings: Settings) -> None:
        self.redis = redis
        self.js = js
        self.settings = settings
        self._archive_kv: KeyValue | None = None

    async def archived(self, sid: str) -> archive.Entry | None:
        """The archive's entry of a session Redis does not hold: read, never loaded back (a
        change through a turn-runner does that)."""
        if self._archive_kv is None:
            self._archive_kv = await archive.bucket(self.js)  # None until a runner made it
        return await archive.read(self._archive_kv, sid)

    def seq_now(self, sid: str) -> Callable[[], Awaitable[int]]:
        """The session's latest seq as Redis has it (where events are recorded first), or as the
        archive has it for an archived session."""

        async def seq() -> int:
            now = await self.redis.hget(keys.session(sid), "seq")
            if now is None:  # archived: its log ends at the entry's seq
                entry = await self.archived(sid)
                now = entry.seq if entry is not None else await self.redis.hget(keys.session(sid), "seq")
            return int(now or 0)

        return seq

    async def owned(self, sid: str, who: str) -> dict[str, str]:
        """The session's hash when ``who`` owns it; 404 otherwise (another's reads as none)."""
        h: dict[str, str] = await self.redis.hgetall(keys.session(sid))
        if not h:
            entry = await self.archived(sid)  # an archived session reads from the archive
            # no entry: it may have been loaded back (and its entry deleted) meanwhile: look again
            h = archive.hash_of(entry) if entry is not None else await self.redis.hgetall(keys.session(sid))
        if not h or h.get("principal") != who:
            raise NotFound("no such session")
        return h

    async def view(self, sid: str, who: str) -> Session | None:
        """The session as Redis has it, or as the archive has it when it was archived."""
        sandbox, mcp = self.settings.sandbox, self.settings.mcp
        view = await session_view.load(self.redis, sid, who, sandbox, mcp)
        if view is None:
            entry = await self.archived(sid)
            if entry is not None:
                view = archive.view(entry, who, sandbox, mcp)
            else:  # it may have been loaded back (and its entry deleted) meanwhile: look again
                view = await session_view.load(self.redis, sid, who, sandbox, mcp)
        return view

    async def listed(self, who: str, limit: int) -> list[Session]:
        """The principal's newest ``limit`` sessions, newest first."""
        sids = await self.redis.zrevrange(keys.principal(who), 0, limit - 1)
        views = await asyncio.gather(*(self.view(s, who) for s in sids))
        return [v for v in views if v is not None]
