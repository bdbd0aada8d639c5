"""A file's previous content kept before the runner writes it; restore and undo (runner writes,
checked against the session's fencing token), and what undo would put back (a read)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from coxswain import safefs, sandbox_user, textdiff
from coxswain.errors import NotFound
from coxswain.ids import new_id
from coxswain.models import (
    FileOutcome,
    KeepRequest,
    KeepResult,
    RestoreRequest,
    UndoFile,
    UndoRequest,
    UndoTarget,
    WriteOutcome,
)

from .base import Base
from .store import MAX_OBJECT, Record, check_path


class Writes(Base):
    """Keep before a write; restore and undo (under the workspace's lock)."""

    async def keep(self, req: KeepRequest) -> KeepResult:
        await self.check_token(req.sid, req.token)
        ws = self.workspace(req.workspace)
        rel = check_path(ws, req.path, self.settings.store_dir)

        def work() -> Record:
            st = self.store(ws)
            if req.again and req.call_id:
                recs, _ = st.records()
                for r in reversed(recs):
                    if r.sid == req.sid and r.call_id == req.call_id and r.path == rel and r.reason == req.reason:
                        return r
            data = safefs.read(ws, rel, max_bytes=MAX_OBJECT + 1)
            return st.keep(req.sid, rel, data, req.reason, req.turn_id, req.call_id, new_id("v"))

        rec = await asyncio.to_thread(work)
        return KeepResult(version_id=rec.version_id, store=rec.store, path=rel, existed=rec.store != "absent")

    async def restore(self, req: RestoreRequest) -> WriteOutcome:
        await self.check_token(req.sid, req.token)
        ws = self.workspace(req.workspace)
        async with self._lock(ws):
            out = await asyncio.to_thread(self._restore, ws, req.sid, req.version_id, "restore")
        return WriteOutcome(**out.model_dump(), files=[out])

    def _restore(self, ws: Path, sid: str, version_id: str, reason: str, call_id: str | None = None) -> FileOutcome:
        st = self.store(ws)
        rec = st.find(version_id)
        target = st.content(rec)
        rel = check_path(ws, rec.path, self.settings.store_dir)
        current = safefs.read(ws, rel, max_bytes=MAX_OBJECT + 1)
        kept = st.keep(sid, rel, current, reason, None, call_id, new_id("v"))
        if target is None:
            safefs.delete(ws, rel)
        else:  # as root, the sandbox user's (the commands run as it and must be able to change it)
            safefs.write(ws, rel, target, owner=sandbox_user.file_owner(self.settings.sandbox.user,
                                                                       self.settings.sandbox.mode))
        added, removed = textdiff.counts(current, target)
        return FileOutcome(
            path=rel, restored_from=version_id, added=added, removed=removed, deleted=target is None,
            kept=KeepResult(version_id=kept.version_id, store=kept.store, path=rel, existed=current is not None),
        )

    async def undo(self, req: UndoRequest) -> WriteOutcome:
        """Put back the session's latest write; for a command, every file that command changed."""
        await self.check_token(req.sid, req.token)
        ws = self.workspace(req.workspace)
        async with self._lock(ws):
            return await asyncio.to_thread(self._undo, ws, req.sid)

    def _undo_group(self, ws: Path, sid: str) -> list[Record]:
        """The versions undo puts back: the session's latest write; for a command, all of its."""
        idx = self.store(ws).read_index()
        horizon = idx.horizons.get(sid)
        mine = [r for r in idx.records if r.sid == sid and r.reason != "undo" and r.version_id not in idx.undone
                and (horizon is None or r.created > horizon)]
        if not mine:
            if horizon is not None:
                raise NotFound("this session has no write left to undo: its older writes were collected by the "
                               "retention policy ([versions] keep_days, keep_per_file)")
            raise NotFound("this session has no write left to undo")
        last = mine[-1]
        group = [last]
        if last.reason in ("command", "rewind") and last.call_id:  # every file it changed, together
            group = [r for r in mine if r.reason == last.reason and r.call_id == last.call_id]
        return group

    async def undo_target(self, req: UndoRequest) -> UndoTarget:
        """What undo would put back now (a read: nothing is written), so a client can say so first."""
        ws = self.workspace(req.workspace)
        try:
            group = await asyncio.to_thread(self._undo_group, ws, req.sid)
        except NotFound:
            return UndoTarget(files=[])
        return UndoTarget(files=[UndoFile(path=r.path, version_id=r.version_id, reason=r.reason, created=r.created,
                                          existed=r.store != "absent", turn_id=r.turn_id, call_id=r.call_id)
                                 for r in reversed(group)])

    def _undo(self, ws: Path, sid: str) -> WriteOutcome:
        st = self.store(ws)
        group = self._undo_group(ws, sid)
        files: list[FileOutcome] = []
        for rec in reversed(group):
            files.append(self._restore(ws, sid, rec.version_id, "undo"))
            st.mark_undone(rec.version_id, sid)
        first = files[0]
        return WriteOutcome(**first.model_dump(), files=files)
