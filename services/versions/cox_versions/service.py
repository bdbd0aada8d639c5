"""The versions service: keep before every write, list, diff, restore, undo, changes.

Requests come from runners (keep, restore, undo: writes, checked against the session's fencing
token) and from the gateway (list, diff, changes: reads). Workspaces must lie under the
configured root; paths are resolved beneath the workspace and checked against the denylist.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from coxswain import keys, safefs, subjects, textdiff
from coxswain.config import Settings
from coxswain.errors import Fenced, Invalid, NotFound
from coxswain.ids import new_id
from coxswain.models import (
    ChangesRequest,
    DiffRequest,
    DiffResult,
    KeepRequest,
    KeepResult,
    ListVersionsRequest,
    ListVersionsResult,
    RestoreRequest,
    UndoRequest,
    VersionInfo,
    WriteOutcome,
)
from coxswain.service import Service

from .store import Record, Store, check_path


class Versions(Service):
    name = subjects.VERSIONS
    uses_redis = True

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._locks: dict[str, asyncio.Lock] = {}

    async def start(self) -> None:
        for op, model, handler in (
            ("keep", KeepRequest, self.keep), ("list", ListVersionsRequest, self.list),
            ("diff", DiffRequest, self.diff), ("restore", RestoreRequest, self.restore),
            ("undo", UndoRequest, self.undo), ("changes", ChangesRequest, self.changes),
        ):
            await self.add_endpoint(op, model, handler)

    async def health(self) -> dict[str, Any]:
        await self.redis.ping()
        return {}

    # ------------------------------------------------------------------ helpers
    def workspace(self, path: str) -> Path:
        root = self.settings.root
        real = Path(os.path.realpath(path))
        if real != root and root not in real.parents:
            raise Invalid("the workspace is not under the configured root")
        if not real.is_dir():
            raise NotFound("the workspace folder does not exist")
        return real

    def store(self, ws: Path) -> Store:
        return Store(ws, self.settings.store_dir)

    async def check_token(self, sid: str, token: int | None) -> None:
        """Writes carry the session's fencing token; a stale one is refused."""
        if token is None:
            raise Fenced("a write needs the session's fencing token")
        cur = await self.redis.get(keys.session(sid) + keys.LEASE)
        if cur is None or cur != str(token):
            raise Fenced("the fencing token is not the session's lease (stale writer)")

    def _lock(self, ws: Path) -> asyncio.Lock:
        return self._locks.setdefault(str(ws), asyncio.Lock())

    # ------------------------------------------------------------------ writes
    async def keep(self, req: KeepRequest) -> KeepResult:
        await self.check_token(req.sid, req.token)
        ws = self.workspace(req.workspace)
        rel = check_path(ws, req.path, self.settings.store_dir)
        st = self.store(ws)

        def work() -> Record:
            data = safefs.read(ws, rel)
            return st.keep(req.sid, rel, data, req.reason, req.turn_id, req.call_id, new_id("v"))

        rec = await asyncio.to_thread(work)
        return KeepResult(version_id=rec.version_id, store=rec.store, path=rel, existed=rec.store != "absent")

    async def restore(self, req: RestoreRequest) -> WriteOutcome:
        await self.check_token(req.sid, req.token)
        ws = self.workspace(req.workspace)
        async with self._lock(ws):
            return await asyncio.to_thread(self._restore, ws, req.sid, req.version_id, "restore")

    def _restore(self, ws: Path, sid: str, version_id: str, reason: str) -> WriteOutcome:
        st = self.store(ws)
        rec = st.find(version_id)
        target = st.content(rec)
        rel = check_path(ws, rec.path, self.settings.store_dir)
        current = safefs.read(ws, rel)
        kept = st.keep(sid, rel, current, reason, None, None, new_id("v"))
        if target is None:
            safefs.delete(ws, rel)
        else:
            safefs.write(ws, rel, target)
        added, removed = textdiff.counts(current, target)
        return WriteOutcome(
            path=rel, restored_from=version_id, added=added, removed=removed, deleted=target is None,
            kept=KeepResult(version_id=kept.version_id, store=kept.store, path=rel, existed=current is not None),
        )

    async def undo(self, req: UndoRequest) -> WriteOutcome:
        await self.check_token(req.sid, req.token)
        ws = self.workspace(req.workspace)
        async with self._lock(ws):
            st = self.store(ws)
            recs, undone = await asyncio.to_thread(st.records)
            for rec in reversed(recs):
                if rec.sid == req.sid and rec.reason != "undo" and rec.version_id not in undone:
                    out = await asyncio.to_thread(self._restore, ws, req.sid, rec.version_id, "undo")
                    await asyncio.to_thread(st.mark_undone, rec.version_id)
                    return out
        raise NotFound("this session has no write left to undo")

    # ------------------------------------------------------------------ reads
    async def list(self, req: ListVersionsRequest) -> ListVersionsResult:
        ws = self.workspace(req.workspace)
        rel = check_path(ws, req.path, self.settings.store_dir)
        recs, undone = await asyncio.to_thread(self.store(ws).records)
        out = [VersionInfo(version_id=r.version_id, path=r.path, store=r.store, size=r.size,
                           created=r.created, reason=r.reason, sid=r.sid, undone=r.version_id in undone)
               for r in reversed(recs) if r.path == rel]
        return ListVersionsResult(path=rel, versions=out)

    async def diff(self, req: DiffRequest) -> DiffResult:
        ws = self.workspace(req.workspace)

        def work() -> DiffResult:
            st = self.store(ws)
            rec = st.find(req.version_id)
            old = st.content(rec)
            rel = check_path(ws, rec.path, self.settings.store_dir)
            cur = safefs.read(ws, rel, max_bytes=textdiff.MAX_DIFF_INPUT + 1)
            d = textdiff.diff(old, cur, rel)
            return DiffResult(path=rel, version_id=rec.version_id, diff=d.text, added=d.added, removed=d.removed,
                              deleted=cur is None, empty=d.empty, oversized=d.oversized)

        return await asyncio.to_thread(work)

    async def changes(self, req: ChangesRequest) -> dict[str, Any]:
        """First cut: the latest kept version per file this session wrote, newest first."""
        ws = self.workspace(req.workspace)
        recs, _ = await asyncio.to_thread(self.store(ws).records)
        latest: dict[str, Record] = {}
        for r in recs:
            if r.sid == req.sid:
                latest[r.path] = r
        files = sorted(latest.values(), key=lambda r: r.created, reverse=True)
        return {"files": [{"path": r.path, "version_id": r.version_id, "created": r.created, "reason": r.reason}
                          for r in files]}


def main() -> None:
    from coxswain.service import run

    run(Versions, subjects.VERSIONS)
