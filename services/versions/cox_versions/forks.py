"""Fork and rewind: a workspace copied with the session's later writes put back, or the
session's files put back in place to a turn's end (docs/design.md, "Fork and rewind")."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path

from coxswain import fdcopy, safefs
from coxswain.errors import Collected, Conflict, Invalid
from coxswain.models import (
    ForkFilesRequest,
    ForkFilesResult,
    RewindFilesRequest,
    RewindFilesResult,
)

from .store import MAX_OBJECT, Record, check_path
from .writes import Writes


class Forks(Writes):
    """Fork (a copy, read-only on the source) and rewind (a write, fenced)."""

    def _since(self, ws: Path, sid: str, known: list[str], later: list[str]) -> dict[str, Record]:
        """Per file the session changed after its writes ``known``: the version kept by its first
        such write, i.e. its content at that point (``absent``: it did not exist).

        The index is in the order versions were kept (each before its write), so the session's
        records after the last one in ``known`` are its later writes, those the log has not
        recorded yet (a running turn's) included. ``later``: the versions the log recorded after
        that point; one missing from the index was collected, and the point cannot be rebuilt."""
        idx = self.store(ws).read_index()
        mine = [r for r in idx.records if r.sid == sid]
        have = {r.version_id for r in mine}
        gone = [v for v in later if v not in have]
        if gone:
            raise Collected(f"{len(gone)} version(s) kept after that turn are no longer kept (retention: "
                            "[versions] keep_days, keep_per_file), so its files cannot be rebuilt")
        known_set = set(known)
        cut = max((i for i, r in enumerate(mine) if r.version_id in known_set), default=-1)
        first: dict[str, Record] = {}
        for r in mine[cut + 1:]:
            first.setdefault(r.path, r)
        return first

    async def fork(self, req: ForkFilesRequest) -> ForkFilesResult:
        """Copy a workspace (its store folder left out) into a new folder, with the session's
        writes after the fork point put back. Reads the source only: no fencing token."""
        ws = self.workspace(req.workspace)
        target = safefs.real_under(self.settings.root, Path(req.target).parent)
        name = Path(req.target).name
        if target is None or name in ("", ".", ".."):
            raise Invalid("the fork's folder must be under the configured root")
        dst = target / name
        await asyncio.to_thread(self._fork_dir, target, name)
        try:
            async with self._lock(ws):
                return await asyncio.to_thread(self._fork, ws, target, name, req)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, dst, True)  # a failed fork leaves nothing behind
            raise

    def _rel(self, p: Path) -> str:
        """``p`` (a real path under the root) relative to the root's real path."""
        r = os.path.relpath(p, os.path.realpath(self.settings.root))
        return "" if r == "." else r

    def _fork_dir(self, target: Path, name: str) -> None:
        """Make the fork's folder, exclusively, beneath the root without following a link."""
        with safefs.open_dir(self.settings.root, self._rel(target)) as parent_fd:
            try:
                os.mkdir(name, 0o700, dir_fd=parent_fd)
            except FileExistsError as exc:
                raise Conflict(f"{name} exists already") from exc

    def _fork(self, ws: Path, target: Path, name: str, req: ForkFilesRequest) -> ForkFilesResult:
        store_dir = self.settings.store_dir
        # Copy first, then read the index: a write racing the copy has kept its version by then.
        # Both ends are descriptors opened beneath the root without following links, and the
        # walk never follows one either (coxswain.fdcopy): a command still running in the
        # source cannot point the copy (or the fork's folder) anywhere else.
        v = self.settings.versions
        limits = fdcopy.Limits(max_entries=v.fork_max_files, max_bytes=v.fork_max_mb << 20)
        with safefs.open_dir(self.settings.root, self._rel(ws)) as src_fd, \
                safefs.open_dir(self.settings.root, self._rel(target)) as parent_fd:
            dst_fd = os.open(name, fdcopy.DIR_FLAGS, dir_fd=parent_fd)
            try:
                copied = fdcopy.copy_tree(src_fd, dst_fd, exclude=[os.path.normpath(store_dir)], limits=limits)
            finally:
                os.close(dst_fd)
        dst = target / name
        st = self.store(ws)
        since = self._since(ws, req.sid, req.known, req.later)
        contents = {rel: st.content(rec) for rel, rec in since.items()}  # all checked before any write
        for path, data in sorted(contents.items()):
            path = check_path(dst, path, store_dir)
            if data is None:
                with contextlib.suppress(Invalid):
                    safefs.delete(dst, path)
            else:
                safefs.write(dst, path, data)
        if copied.left_out_count:
            self.log.info("fork.left_out", count=copied.left_out_count, first=copied.left_out[:10])
        return ForkFilesResult(copied=copied.files, restored_files=sorted(contents))

    async def rewind(self, req: RewindFilesRequest) -> RewindFilesResult:
        """Put back every file the session changed after the rewind point, each kept first
        (reason ``rewind``, one ``call_id``: undo puts them all back together)."""
        await self.check_token(req.sid, req.token)
        ws = self.workspace(req.workspace)
        async with self._lock(ws):
            return await asyncio.to_thread(self._rewind, ws, req)

    def _rewind(self, ws: Path, req: RewindFilesRequest) -> RewindFilesResult:
        st = self.store(ws)
        since = self._since(ws, req.sid, req.known, req.later)
        todo = []
        for rel, rec in sorted(since.items()):
            target = st.content(rec)  # every version checked before anything is written
            if target != safefs.read(ws, check_path(ws, rel, self.settings.store_dir), max_bytes=MAX_OBJECT + 1):
                todo.append(rec.version_id)
        return RewindFilesResult(files=[self._restore(ws, req.sid, v, "rewind", req.rewind_id) for v in todo])
