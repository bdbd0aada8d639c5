"""The gateway's reads: a file's versions, a version's diff, the session's Changes view."""

from __future__ import annotations

import asyncio

from coxswain import archive, eventlog, keys, safefs, textdiff
from coxswain.models import (
    ChangesRequest,
    ChangesResult,
    DiffRequest,
    DiffResult,
    ListVersionsRequest,
    ListVersionsResult,
    VersionInfo,
)

from . import changes as changes_view
from .base import Base
from .store import check_path


class Reads(Base):
    """Reads for the gateway: no token, nothing written."""

    async def list(self, req: ListVersionsRequest) -> ListVersionsResult:
        ws = self.workspace(req.workspace)
        rel = check_path(ws, req.path, self.settings.store_dir)
        recs, undone = await asyncio.to_thread(lambda: self.store(ws).records())
        out = [VersionInfo(version_id=r.version_id, path=r.path, store=r.store, size=r.size, created=r.created,
                           reason=r.reason, sid=r.sid, undone=r.version_id in undone, turn_id=r.turn_id,
                           call_id=r.call_id)
               for r in reversed(recs) if r.path == rel]
        return ListVersionsResult(path=rel, versions=out)

    async def diff(self, req: DiffRequest) -> DiffResult:
        ws = self.workspace(req.workspace)

        def work() -> DiffResult:
            st = self.store(ws)
            rec = st.find(req.version_id)
            rel = check_path(ws, rec.path, self.settings.store_dir)
            if rec.size > textdiff.MAX_DIFF_INPUT:
                old: bytes | None = b""
                oversized = True
            else:
                old, oversized = st.content(rec), False
            cur = safefs.read(ws, rel, max_bytes=textdiff.MAX_DIFF_INPUT + 1)
            if oversized:
                return DiffResult(path=rel, version_id=rec.version_id, diff="", added=0, removed=0,
                                  deleted=cur is None, oversized=True, store=rec.store)
            d = textdiff.diff(old, cur, rel)
            hunks = textdiff.hunks_json(d) if not d.oversized else []
            return DiffResult(path=rel, version_id=rec.version_id, diff=d.text, added=d.added, removed=d.removed,
                              deleted=cur is None, empty=d.empty, oversized=d.oversized, binary=d.binary,
                              hunks=hunks or [], store=rec.store)

        return await asyncio.to_thread(work)

    async def changes(self, req: ChangesRequest) -> ChangesResult:
        """The latest recorded approval preview per file, from the session's event log."""
        self.workspace(req.workspace)
        now = await self.redis.hget(keys.session(req.sid), "seq")
        if now is None:  # an archived session's log ends at its archive entry's seq
            if self._archive_kv is None:
                self._archive_kv = await archive.bucket(self.js)
            entry = await archive.read(self._archive_kv, req.sid)
            now = entry.seq if entry is not None else 0
        seq = int(now or 0)
        events = await eventlog.backlog(self.js, req.sid, 0, seq, limit=1_000_000)
        return changes_view.build(events)
