"""The gateway's reads of sessions: Redis first, the archive for an archived one.

The gateway never changes a session (a change is a NATS request to a turn-runner); it reads the
session hash and, for a session idle long enough to be archived (docs/operations.md, "Idle
sessions"), the archive's entry, without loading it back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from coxswain import archive, keys, session_view
from coxswain.config import Settings
from coxswain.errors import Forbidden, NotFound
from coxswain.models import Session

T = TypeVar("T")


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

    def role(self, who: str) -> str:
        return self.settings.auth.role_of(who)

    async def _hash(self, sid: str) -> dict[str, str]:
        h: dict[str, str] = await self.redis.hgetall(keys.session(sid))
        if not h:
            entry = await self.archived(sid)  # an archived session reads from the archive
            # no entry: it may have been loaded back (and its entry deleted) meanwhile: look again
            h = archive.hash_of(entry) if entry is not None else await self.redis.hgetall(keys.session(sid))
        return h

    async def owned(self, sid: str, who: str) -> dict[str, str]:
        """The session's hash when ``who`` may read it (its owner, an admin, or shared with
        them); 404 otherwise (another's reads as none)."""
        h = await self._hash(sid)
        if session_view.access_of(h, who, self.role(who) == "admin") is None:
            raise NotFound("no such session")
        return h

    async def view(self, sid: str, who: str) -> Session | None:
        """The session as Redis has it, or as the archive has it when it was archived."""
        sandbox, mcp = self.settings.sandbox, self.settings.mcp
        admin = self.role(who) == "admin"
        view = await session_view.load(self.redis, sid, who, sandbox, mcp, admin=admin)
        if view is None:
            entry = await self.archived(sid)
            if entry is not None:
                view = archive.view(entry, who, sandbox, mcp, admin=admin)
            else:  # it may have been loaded back (and its entry deleted) meanwhile: look again
                view = await session_view.load(self.redis, sid, who, sandbox, mcp, admin=admin)
        return view

    async def listed(self, who: str, limit: int) -> list[Session]:
        """The principal's newest ``limit`` sessions and those shared with it (marked by
        ``access``), newest first."""
        own, shared = await asyncio.gather(self.redis.zrevrange(keys.principal(who), 0, limit - 1, withscores=True),
                                           self.redis.zrevrange(keys.shared_with(who), 0, limit - 1, withscores=True))
        sids = [s for s, _ in sorted({**dict(shared), **dict(own)}.items(), key=lambda kv: -kv[1])][:limit]
        views = await asyncio.gather(*(self.view(s, who) for s in sids))
        return [v for v in views if v is not None]

    # ------------------------------------------------------------------ who a change acts as
    async def write(self, sid: str, who: str, call: Callable[[str], Awaitable[T]]) -> T:
        """Make a change to a session as its owner would (docs/api.md, "Roles and sharing").

        A member's own call goes straight to the runner, which checks the owner (no read
        here: the hot path). A reader, or a member the session is shared with, gets 403
        ``forbidden`` (it may see the session); an admin acts as the owner."""
        role = self.role(who)
        if role == "admin":
            return await call((await self.owned(sid, who))["principal"])
        if role == "reader":
            await self.owned(sid, who)  # 404 unless it is visible to them
            raise Forbidden("a reader cannot change a session")
        try:
            return await call(who)
        except NotFound:
            access = session_view.access_of(await self._hash(sid), who)
            if access in ("reader", "approver"):
                raise Forbidden(f"this session is shared with you as {access}: you cannot make this change") from None
            raise

    async def approve(self, sid: str, who: str, call: Callable[[str], Awaitable[T]]) -> T:
        """Answer an approval or Stop: the owner, an admin, or an ``approver`` it is shared with
        (acting as the owner); a reader gets 403."""
        role = self.role(who)
        if role == "member":
            try:
                return await call(who)  # its own session: the runner checks the owner
            except NotFound:
                h = await self._hash(sid)
                access = session_view.access_of(h, who)
                if access == "approver":
                    return await call(h["principal"])
                if access == "reader":
                    raise Forbidden("this session is shared with you as reader: you cannot answer or stop it") from None
                raise
        h = await self.owned(sid, who)  # 404 unless visible
        if role == "reader":
            raise Forbidden("a reader cannot answer approvals or stop a session")
        return await call(h["principal"])  # an admin, as the owner

    async def writable(self, sid: str, who: str) -> str:
        """Checked before a change that does work of its own first (an upload): the principal to
        act as (the owner), or 403/404 as :meth:`write` would answer."""
        h = await self.owned(sid, who)
        access = session_view.access_of(h, who, self.role(who) == "admin")
        if self.role(who) == "reader" or access in ("reader", "approver"):
            raise Forbidden(f"this session is shared with you as {access}: you cannot make this change")
        return h["principal"]

    def create(self, who: str) -> None:
        """A reader makes no session (nor a run)."""
        if self.role(who) == "reader":
            raise Forbidden("a reader cannot create sessions or runs")
