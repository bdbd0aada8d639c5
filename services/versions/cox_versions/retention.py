"""Retention: what a collection keeps of a workspace's versions store, and the collection itself.

The policy (``[versions] keep_days``, ``keep_per_file``): a version is kept while it is younger
than ``keep_days`` OR among the newest ``keep_per_file`` versions of its file. Only a version
outside both rules is collected; 0 means "no limit" for a rule, so either one at 0 keeps every
version. The newest version of a file is therefore always kept (when ``keep_per_file >= 1``).

A collection, under the store's exclusive lock (a keep appends under the same lock, and the
service also holds its per-workspace lock, so no restore, undo or command is half-way):

1. reads the index and decides what is kept;
2. writes a new index (temp + rename) with the kept records' lines as they were (their MACs
   still hold), the ``undone`` marks of kept versions, one ``horizon`` mark per session that lost
   a write while an older one is kept (undo stops there instead of skipping a step), and a
   ``collected_at`` mark (a missing version born before it is answered ``410 collected``);
   lines whose MAC fails are not records and are dropped;
3. removes every object no kept record names (objects are content-addressed: two versions with
   the same bytes share one, which goes only when neither is kept).
"""

from __future__ import annotations

import os
import stat
import time
from collections import defaultdict
from dataclasses import dataclass

from coxswain import safefs

from .store import HEX64, MAX_INDEX_BYTES, Index, Record, Store

DAY_S = 86_400.0


@dataclass(frozen=True)
class Policy:
    keep_days: float
    keep_per_file: int

    @property
    def unlimited(self) -> bool:
        return self.keep_days == 0 or self.keep_per_file == 0


@dataclass
class StoreStats:
    kept: int = 0
    removed: int = 0
    objects_removed: int = 0
    bytes_freed: int = 0


def kept_ids(records: list[Record], policy: Policy, now: float) -> set[str]:
    """The ids the policy keeps: young enough, or among the newest ``keep_per_file`` of their file."""
    if policy.unlimited:
        return {r.version_id for r in records}
    cutoff = now - policy.keep_days * DAY_S
    keep = {r.version_id for r in records if r.created >= cutoff}
    by_path: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_path[r.path].append(r)
    for recs in by_path.values():
        # Newest first; ids sort by birth, so they break a tie of equal times.
        recs.sort(key=lambda r: (r.created, r.version_id), reverse=True)
        keep.update(r.version_id for r in recs[: policy.keep_per_file])
    return keep


def collect_store(st: Store, policy: Policy, now: float | None = None) -> StoreStats:
    """Collect one workspace's versions store (see the module docstring)."""
    now = time.time() if now is None else now
    out = StoreStats()
    index_rel = f"{st.dir_rel}/index.jsonl"
    with st._locked(True) as dfd:
        raw = safefs.read(st.root, index_rel, max_bytes=MAX_INDEX_BYTES)
        idx = st._parse(raw)
        keep = kept_ids(idx.records, policy, now)
        removed = [r for r in idx.records if r.version_id not in keep]
        out.kept, out.removed = len(idx.records) - len(removed), len(removed)
        if raw is not None and (removed or _junk(raw, idx)):
            horizons = dict(idx.horizons)
            for r in removed:
                horizons[r.sid] = max(horizons.get(r.sid, 0.0), r.created)
            lines = [line for line, vid in idx.lines if vid in keep]
            for sid, h in sorted(horizons.items()):
                # Only while an older write of that session is still there for undo to skip to.
                if any(r.sid == sid and r.created <= h for r in idx.records if r.version_id in keep):
                    lines.append(st._line({"horizon": h, "sid": sid}).encode())
            collected_at = now if removed else idx.collected_at
            if collected_at is not None:
                lines.append(st._line({"collected_at": collected_at}).encode())
            safefs.write(st.root, index_rel, b"".join(ln + b"\n" for ln in lines), mode=0o644)
        referenced = {r.sha256 for r in idx.records if r.version_id in keep and r.store == "versions"}
        out.objects_removed, out.bytes_freed = _sweep_objects(dfd, referenced)
    return out


def _junk(raw: bytes, idx: Index) -> bool:
    """Lines that are not kept as they are (MAC failed, bad records, old marks): worth a rewrite."""
    marks = len(idx.horizons) + (idx.collected_at is not None)
    return sum(1 for ln in raw.splitlines() if ln) != len(idx.lines) + marks


def _sweep_objects(store_fd: int, referenced: set[str | None]) -> tuple[int, int]:
    """Remove every file under ``objects/`` no kept record names; (files, bytes) removed."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        ofd = os.open("objects", flags, dir_fd=store_fd)
    except (FileNotFoundError, NotADirectoryError, OSError):
        return 0, 0
    removed = freed = 0
    try:
        for sub in os.listdir(ofd):
            st = os.stat(sub, dir_fd=ofd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(sub, dir_fd=ofd)  # a planted file or link: not an object
                continue
            sfd = os.open(sub, flags, dir_fd=ofd)
            try:
                names = os.listdir(sfd)
                left = len(names)
                for name in names:
                    if HEX64.fullmatch(name) and name[:2] == sub and name in referenced:
                        continue
                    est = os.stat(name, dir_fd=sfd, follow_symlinks=False)
                    if stat.S_ISDIR(est.st_mode):
                        continue  # not ours to walk; left in place
                    os.unlink(name, dir_fd=sfd)
                    removed += 1
                    freed += est.st_size
                    left -= 1
            finally:
                os.close(sfd)
            if left == 0:
                os.rmdir(sub, dir_fd=ofd)
    finally:
        os.close(ofd)
    return removed, freed
