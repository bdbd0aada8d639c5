"""Command snapshots: the workspace's state before a command, and after it the previous content
of every file it changed kept (reason ``command``), within the sandbox's bounds."""

from __future__ import annotations

import asyncio
from pathlib import Path

from coxswain import safefs, textdiff
from coxswain.errors import CoxError
from coxswain.ids import new_id
from coxswain.models import (
    MAX_SKIPPED,
    CommandChangesRequest,
    CommandChangesResult,
    FileChange,
    SnapshotRequest,
    SnapshotResult,
)

from .base import Base
from .shadow import Bound, Shadow
from .store import MAX_OBJECT, check_path


class Commands(Base):
    """A command's snapshot before it runs; what it changed kept after."""

    async def snapshot(self, req: SnapshotRequest) -> SnapshotResult:
        await self.check_token(req.sid, req.token)
        ws = self.workspace(req.workspace)
        shadow = Shadow(ws, self.settings.store_dir)

        def work() -> tuple[str, float]:
            with shadow.hold():
                return shadow.snapshot(req.sid)

        try:
            tree, ms = await asyncio.to_thread(work)
        except CoxError as exc:
            self.log.warning("snapshot.skipped", workspace=str(ws), error=exc.detail)
            return SnapshotResult(snapshot=None, skipped=exc.detail)
        return SnapshotResult(snapshot=tree, ms=round(ms, 2))

    async def after(self, req: CommandChangesRequest) -> CommandChangesResult:
        """Keep the previous content of every file the command changed (reason ``command``)."""
        await self.check_token(req.sid, req.token)
        ws = self.workspace(req.workspace)
        async with self._lock(ws):
            return await asyncio.to_thread(self._after, ws, req)

    def _after(self, ws: Path, req: CommandChangesRequest) -> CommandChangesResult:
        shadow = Shadow(ws, self.settings.store_dir)
        with shadow.hold():  # no prune between the snapshot and the reads of the "before" blobs
            return self._after_held(ws, shadow, req)

    def _after_held(self, ws: Path, shadow: Shadow, req: CommandChangesRequest) -> CommandChangesResult:
        sb = self.settings.sandbox
        bound = Bound(files=sb.workspace_files, bytes=sb.workspace_mb * 1024 * 1024,
                      file_limit=sb.file_mb * 1024 * 1024)
        _, changed, taken = shadow.changes(req.sid, req.snapshot, bound)
        st = self.store(ws)
        out: list[FileChange] = []
        skipped: list[str] = []
        limit = taken.limit
        not_kept = 0
        kept_bytes = 0
        too_large = set(taken.too_large)

        def skip(line: str) -> None:
            nonlocal not_kept
            not_kept += 1
            if len(skipped) < MAX_SKIPPED - 1:
                skipped.append(line)

        for c in changed:
            if c.status == "A" and c.path in taken.by_id:  # created past the bound: nothing to keep
                skip(f"{c.path}: over 64 MB, not versioned" if c.path in too_large
                     else f"{c.path}: past [sandbox] {taken.limit}, not versioned")
                continue
            if sb.workspace_files and len(out) >= sb.workspace_files:
                limit = limit or "workspace_files"
                skip(f"{c.path}: past [sandbox] workspace_files, not versioned")
                continue
            if sb.workspace_mb and kept_bytes > sb.workspace_mb * 1024 * 1024:
                limit = limit or "workspace_mb"
                skip(f"{c.path}: past [sandbox] workspace_mb, not versioned")
                continue
            try:
                rel = check_path(ws, c.path, self.settings.store_dir)
            except CoxError as exc:
                skip(f"{c.path}: {exc.detail}")
                continue
            old_regular = c.old_mode in ("100644", "100755")
            if c.status != "A" and not old_regular:
                skip(f"{rel}: was a link or a nested repository, not a file")
                continue
            try:
                old = shadow.read(c.old_oid, MAX_OBJECT) if c.status != "A" else None
                try:
                    cur = safefs.read(ws, rel, max_bytes=textdiff.MAX_DIFF_INPUT + 1)
                except CoxError:
                    cur = None  # now a link or a folder: compared as gone
                rec = st.keep(req.sid, rel, old, "command", req.turn_id, req.call_id, new_id("v"))
            except CoxError as exc:
                skip(f"{rel}: {exc.detail}")
                continue
            kept_bytes += len(old or b"")
            added, removed = textdiff.counts(old, cur)
            out.append(FileChange(path=rel, version_id=rec.version_id, store=rec.store, added=added,
                                  removed=removed, created=old is None, deleted=cur is None))
        if not_kept > len(skipped):
            skipped.append(f"... and {not_kept - len(skipped)} more not versioned")
        note = ""
        if limit is not None:
            value = sb.workspace_files if limit == "workspace_files" else sb.workspace_mb
            unit = "files" if limit == "workspace_files" else "MB"
            note = (f"[versions: the command changed {len(changed)} files ({taken.added_bytes // (1024 * 1024)} MB "
                    f"written); past [sandbox] {limit} = {value} {unit}, {not_kept} of them were not versioned "
                    "(undo cannot put them back)]")
        return CommandChangesResult(changes=out, skipped=skipped, limit=limit, not_kept=not_kept, note=note,
                                    at_file_limit=taken.at_file_limit)
