"""The versions service: keep before every write, list, diff, restore, undo, command snapshots, changes.

Requests come from runners (keep, restore, undo, snapshot, after: writes, checked against the
session's fencing token) and from the gateway (list, diff, changes: reads). Workspaces must lie
under the configured root; paths are resolved beneath the workspace and checked against the
denylist; every record read back is checked (see :mod:`cox_versions.store`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Any

from nats.js.kv import KeyValue
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from coxswain import archive, eventlog, fdcopy, keys, rpc, safefs, sandbox_user, subjects, textdiff
from coxswain.config import Settings
from coxswain.errors import Collected, Conflict, CoxError, Fenced, Invalid, NotFound
from coxswain.ids import new_id
from coxswain.models import (
    MAX_SKIPPED,
    ChangesRequest,
    ChangesResult,
    CollectRequest,
    CollectResult,
    CommandChangesRequest,
    CommandChangesResult,
    DiffRequest,
    DiffResult,
    FileChange,
    FileOutcome,
    ForkFilesRequest,
    ForkFilesResult,
    KeepRequest,
    KeepResult,
    ListVersionsRequest,
    ListVersionsResult,
    RestoreRequest,
    RewindFilesRequest,
    RewindFilesResult,
    SnapshotRequest,
    SnapshotResult,
    UndoFile,
    UndoRequest,
    UndoTarget,
    VersionInfo,
    WriteOutcome,
)
from coxswain.service import Service

from . import changes as changes_view
from .gitrepo import Repo
from .retention import DAY_S, Policy, StoreStats, collect_store
from .shadow import Bound, Shadow
from .store import MAX_OBJECT, Record, Store, check_path

REPO_CACHE_S = 2.0
"""How long a workspace's git discovery is reused (a command may ``git init`` at any time)."""


class Versions(Service):
    name = subjects.VERSIONS
    uses_redis = True

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self._locks: dict[str, asyncio.Lock] = {}
        self._repos: dict[str, tuple[float, Repo | None]] = {}
        self.mac_key = b""
        self._archive_kv: KeyValue | None = None

    async def start(self) -> None:
        # Every Redis call here is idempotent (GET, HGET, SET NX): retried on a broken connection.
        # A pooled connection that a Redis restart closed (busy or idle) fails once and is
        # replaced, instead of failing a write's keep with "Connection closed by server".
        self.redis.set_retry(Retry(ExponentialBackoff(cap=0.5, base=0.05), 6))
        # The key that makes index lines members of the store: in Redis, out of the model's reach.
        await self.redis.set(keys.VERSIONS_MAC_KEY, secrets.token_hex(32), nx=True)
        self.mac_key = bytes.fromhex(await self.redis.get(keys.VERSIONS_MAC_KEY))
        self.js = self.nc.jetstream()
        await self.endpoint(rpc.VERSIONS_KEEP, self.keep)
        await self.endpoint(rpc.VERSIONS_LIST, self.list)
        await self.endpoint(rpc.VERSIONS_DIFF, self.diff)
        await self.endpoint(rpc.VERSIONS_RESTORE, self.restore)
        await self.endpoint(rpc.VERSIONS_UNDO, self.undo)
        await self.endpoint(rpc.VERSIONS_CHANGES, self.changes)
        await self.endpoint(rpc.VERSIONS_UNDO_TARGET, self.undo_target)
        await self.endpoint(rpc.VERSIONS_SNAPSHOT, self.snapshot)
        await self.endpoint(rpc.VERSIONS_AFTER, self.after)
        await self.endpoint(rpc.VERSIONS_COLLECT, self.collect)
        await self.endpoint(rpc.VERSIONS_FORK, self.fork)
        await self.endpoint(rpc.VERSIONS_REWIND, self.rewind)
        self.spawn(self._collect_every(self.settings.versions.gc_interval_s), "collector")

    async def health(self) -> dict[str, Any]:
        await self.redis.ping()
        return {}

    # ------------------------------------------------------------------ helpers
    def workspace(self, path: str) -> Path:
        real = safefs.real_under(self.settings.root, path)
        if real is None:
            raise Invalid("the workspace is not under the configured root")
        if not real.is_dir():
            raise NotFound("the workspace folder does not exist")
        return real

    def repo(self, ws: Path) -> Repo | None:
        now = time.monotonic()
        hit = self._repos.get(str(ws))
        if hit is not None and now - hit[0] < REPO_CACHE_S:
            return hit[1]
        repo = Repo.find(ws, self.settings.root)
        self._repos[str(ws)] = (now, repo)
        return repo

    def store(self, ws: Path) -> Store:
        return Store(ws, self.settings.store_dir, self.mac_key, self.repo(ws))

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

    # ------------------------------------------------------------------ command snapshots
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

    # ------------------------------------------------------------------ fork and rewind
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

    # ------------------------------------------------------------------ retention
    def policy(self) -> Policy:
        v = self.settings.versions
        return Policy(keep_days=v.keep_days, keep_per_file=v.keep_per_file)

    async def collect(self, req: CollectRequest) -> CollectResult:
        """Collect one workspace, or every workspace folder under the root, by the retention policy."""
        t0 = time.perf_counter()
        if req.workspace is not None:
            spaces = [self.workspace(req.workspace)]
        else:
            spaces = await asyncio.to_thread(self._stored_workspaces)
        total = CollectResult(workspaces=0, versions_kept=0, versions_removed=0, objects_removed=0, bytes_freed=0,
                              shadow_indexes_removed=0, shadow_objects_removed=0, ms=0.0)
        for ws in spaces:
            try:
                async with self._lock(ws):
                    st, (indexes, objects) = await asyncio.to_thread(self._collect_one, ws)
            except (CoxError, OSError) as exc:
                if req.workspace is not None:
                    raise
                # One workspace whose store folder was tampered with must not stop the others.
                total.failed.append(f"{ws.name}: {exc.detail if isinstance(exc, CoxError) else exc}")
                self.log.warning("versions.collect_failed", workspace=str(ws), error=repr(exc))
                continue
            total.workspaces += 1
            total.versions_kept += st.kept
            total.versions_removed += st.removed
            total.objects_removed += st.objects_removed
            total.bytes_freed += st.bytes_freed
            total.shadow_indexes_removed += indexes
            total.shadow_objects_removed += objects
        total.ms = round((time.perf_counter() - t0) * 1000, 2)
        self.log.info("versions.collected", **total.model_dump())
        return total

    def _collect_one(self, ws: Path) -> tuple[StoreStats, tuple[int, int]]:
        policy = self.policy()
        st = collect_store(self.store(ws), policy)
        idle = None if policy.keep_days == 0 else policy.keep_days * DAY_S
        return st, Shadow(ws, self.settings.store_dir).collect(idle)

    def _stored_workspaces(self) -> list[Path]:
        """The workspace folders under the root that have a versions store."""
        try:
            entries = list(os.scandir(self.settings.root))
        except FileNotFoundError:
            return []
        return [Path(e.path) for e in sorted(entries, key=lambda e: e.name)
                if not e.name.startswith(".") and e.is_dir(follow_symlinks=False)
                and os.path.isdir(os.path.join(e.path, self.settings.store_dir))]

    async def _collect_every(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.collect(CollectRequest())
            except Exception as exc:  # noqa: BLE001 - a failed round must not stop the next one
                self.log.warning("versions.collect_failed", error=repr(exc))

    # ------------------------------------------------------------------ reads
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


def main() -> None:
    from coxswain.service import run

    run(Versions, subjects.VERSIONS)
