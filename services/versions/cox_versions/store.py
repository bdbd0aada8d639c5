"""The versions store of one workspace: content-addressed objects and an append-only index.

Layout, inside the workspace's store folder (``.coxswain/`` by default, ignored by git through
its own ``.gitignore``)::

    objects/ab/ab12...   the bytes of a kept version, named by their sha256
    index.jsonl          one JSON record per kept version, plus ``{"undone": version_id}`` marks

The index and the objects are written by processes that run the model's commands, so they are
untrusted data: every record read back is checked (path resolved beneath the root and not on
the denylist, object name a sha256, object bytes hashing to that name, sizes bounded).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coxswain import safefs
from coxswain.errors import Invalid, NotFound, Refused
from coxswain.ids import ID_RE

HEX64 = re.compile(r"^[0-9a-f]{64}$")
MAX_OBJECT = 64 * 1024 * 1024
MAX_INDEX_LINE = 16_384
MAX_INDEX_BYTES = 256 * 1024 * 1024


@dataclass
class Record:
    version_id: str
    sid: str
    path: str
    store: str
    sha256: str | None
    size: int
    created: float
    reason: str
    turn_id: str | None = None
    call_id: str | None = None

    def to_json(self) -> str:
        return json.dumps(self.__dict__, ensure_ascii=False, separators=(",", ":"))


class Store:
    def __init__(self, workspace: Path, store_dir: str) -> None:
        self.root = workspace
        self.dir_rel = store_dir

    # ------------------------------------------------------------------ writing
    def _ensure(self) -> None:
        safefs.write_if_missing(self.root, f"{self.dir_rel}/.gitignore", b"*\n")

    @contextlib.contextmanager
    def _locked(self, exclusive: bool) -> Iterator[int]:
        """The store folder's descriptor, under a shared or exclusive lock (replicas may share it)."""
        self._ensure()
        with safefs.open_dir(self.root, self.dir_rel, create=True) as dfd:
            fd = os.open(".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                yield dfd
            finally:
                os.close(fd)

    def put_object(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        rel = f"{self.dir_rel}/objects/{digest[:2]}/{digest}"
        if safefs.read(self.root, rel, max_bytes=0) is None:
            safefs.write(self.root, rel, data, mode=0o444)
        return digest

    def get_object(self, digest: str) -> bytes:
        if not HEX64.fullmatch(digest or ""):
            raise Refused("the index names an object that is not a sha256")
        data = safefs.read(self.root, f"{self.dir_rel}/objects/{digest[:2]}/{digest}", max_bytes=MAX_OBJECT + 1)
        if data is None:
            raise NotFound("the kept object is missing from the store")
        if len(data) > MAX_OBJECT:
            raise Refused("the kept object is larger than allowed")
        if hashlib.sha256(data).hexdigest() != digest:
            raise Refused("the kept object does not match its hash (the store was tampered with)")
        return data

    def append(self, line: str) -> None:
        with self._locked(True) as dfd:
            fd = os.open("index.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o644, dir_fd=dfd)
            try:
                os.write(fd, (line + "\n").encode())
                os.fsync(fd)
            finally:
                os.close(fd)

    def keep(self, sid: str, rel: str, data: bytes | None, reason: str, turn_id: str | None,
             call_id: str | None, version_id: str) -> Record:
        digest = self.put_object(data) if data is not None else None
        rec = Record(version_id=version_id, sid=sid, path=rel, store="versions" if data is not None else "absent",
                     sha256=digest, size=len(data) if data is not None else 0, created=time.time(),
                     reason=reason, turn_id=turn_id, call_id=call_id)
        self.append(rec.to_json())
        return rec

    def mark_undone(self, version_id: str) -> None:
        self.append(json.dumps({"undone": version_id}))

    # ------------------------------------------------------------------ reading (untrusted)
    def records(self) -> tuple[list[Record], set[str]]:
        """Every valid record, oldest first, and the ids marked undone. Bad lines are skipped."""
        path = f"{self.dir_rel}/index.jsonl"
        with self._locked(False):
            raw = safefs.read(self.root, path, max_bytes=MAX_INDEX_BYTES)
        if raw is None:
            return [], set()
        out: list[Record] = []
        undone: set[str] = set()
        for line in raw.splitlines():
            if not line or len(line) > MAX_INDEX_LINE:
                continue
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if not isinstance(d, dict):
                continue
            if "undone" in d:
                if isinstance(d["undone"], str):
                    undone.add(d["undone"])
                continue
            rec = self._valid(d)
            if rec is not None:
                out.append(rec)
        return out, undone

    def _valid(self, d: dict[str, Any]) -> Record | None:
        try:
            rec = Record(**{k: d.get(k) for k in Record.__dataclass_fields__})  # type: ignore[arg-type]
        except TypeError:
            return None
        if not isinstance(rec.version_id, str) or not ID_RE.fullmatch(rec.version_id):
            return None
        if not isinstance(rec.path, str) or rec.store not in ("versions", "absent", "git"):
            return None
        if rec.store == "versions" and not (isinstance(rec.sha256, str) and HEX64.fullmatch(rec.sha256)):
            return None
        try:
            check_path(self.root, rec.path, self.dir_rel)
        except (Refused, Invalid):
            return None
        if not isinstance(rec.size, int) or rec.size < 0 or rec.size > MAX_OBJECT:
            return None
        return rec

    def find(self, version_id: str) -> Record:
        recs, _ = self.records()
        for rec in recs:
            if rec.version_id == version_id:
                return rec
        raise NotFound("no such version")

    def content(self, rec: Record) -> bytes | None:
        if rec.store == "absent":
            return None
        if rec.store == "versions":
            assert rec.sha256 is not None
            return self.get_object(rec.sha256)
        raise NotFound(f"versions in store {rec.store!r} are read through git")


def check_path(root: Path, path: str, store_dir: str) -> str:
    """A path from a request or the index, resolved beneath the root; denylist and store refused."""
    rel = safefs.resolve(root, path)
    if not rel:
        raise Invalid("a file path is needed, not the workspace root")
    if safefs.denied(rel):
        raise Refused(f"{rel!r} is on the credential denylist")
    if rel == store_dir or rel.startswith(store_dir + "/"):
        raise Refused("the versions store itself is not versioned")
    return rel
