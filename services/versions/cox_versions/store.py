"""The versions store of one workspace: content-addressed objects and an append-only index.

Layout, inside the workspace's store folder (``.coxswain/`` by default, kept out of
``git status`` by its own ``.gitignore``)::

    objects/ab/ab12...   the bytes of a kept version, named by their sha256
    index.jsonl          one JSON record per kept version, plus ``{"undone": version_id}`` marks
    shadow/              the command snapshots (:mod:`cox_versions.shadow`)

Where a version lives (``store``): ``versions`` (an object here), ``git`` (the file was committed
and unchanged: the record names the ``HEAD`` blob, read back with ``git cat-file``), or
``absent`` (the file did not exist: putting it back deletes the file).

The index and the objects sit where the model's commands can write, so they are untrusted data:

- membership: every line carries an HMAC (key held in Redis, never in the workspace) over the
  workspace path and the record, so a line that was forged, edited or copied from another
  workspace is not a record (it is skipped);
- integrity: an object's bytes must hash to its name and to the record's ``sha256``; a git blob
  must hash to its id; a mismatch refuses the read (it is never served);
- paths: a record's path is resolved beneath the workspace, refused on the denylist or inside
  the store folder, and every file is opened without following links (:mod:`coxswain.safefs`);
- bounds: index size and line length, object size.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from coxswain import safefs
from coxswain.errors import Collected, Invalid, NotFound, Refused, TooLarge
from coxswain.ids import ID_RE, id_time

from .gitrepo import Repo

HEX64 = re.compile(r"^[0-9a-f]{64}$")
OID = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
MAX_OBJECT = 64 * 1024 * 1024
MAX_INDEX_LINE = 16_384
MAX_INDEX_BYTES = 256 * 1024 * 1024
GITIGNORE = b"# coxswain's versions store: kept out of git status\n*\n"


@dataclass
class Index:
    """What the index says, every line's MAC checked."""

    records: list[Record] = field(default_factory=list)
    undone: set[str] = field(default_factory=set)
    horizons: dict[str, float] = field(default_factory=dict)
    """Per session: undo does not reach back to a write made at or before this time (an older
    write of that session was collected, so undo past it would skip a step)."""
    collected_at: float | None = None
    """When the store was last collected (a missing version born before it was collected)."""
    lines: list[tuple[bytes, str]] = field(default_factory=list)
    """Each record's and undone mark's line as read, with the version id it is about."""


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
    blob: str | None = None
    """For ``store == "git"``: the HEAD blob id."""


class Store:
    def __init__(self, workspace: Path, store_dir: str, mac_key: bytes, repo: Repo | None = None) -> None:
        self.root = workspace
        self.dir_rel = store_dir
        self.key = mac_key
        self.repo = repo

    # ------------------------------------------------------------------ membership
    def _mac(self, body: dict[str, Any]) -> str:
        canon = json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
        msg = str(self.root).encode() + b"\0" + canon.encode()
        return hmac.new(self.key, msg, hashlib.sha256).hexdigest()

    def _line(self, body: dict[str, Any]) -> str:
        return json.dumps({**body, "mac": self._mac(body)}, ensure_ascii=False, separators=(",", ":"))

    def _verified(self, d: dict[str, Any]) -> dict[str, Any] | None:
        mac = d.pop("mac", None)
        if not isinstance(mac, str) or not hmac.compare_digest(mac, self._mac(d)):
            return None
        return d

    # ------------------------------------------------------------------ writing
    def _ensure(self) -> None:
        safefs.write_if_missing(self.root, f"{self.dir_rel}/.gitignore", GITIGNORE)

    @contextlib.contextmanager
    def _locked(self, exclusive: bool) -> Iterator[int]:
        """The store folder's descriptor, under a shared or exclusive lock (replicas may share it)."""
        self._ensure()
        with safefs.open_dir(self.root, self.dir_rel, create=True) as dfd:
            fd = os.open(".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
            os.fchmod(fd, 0o644)  # readable by the sandbox user: a command's `git add -A` reads the store
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                yield dfd
            finally:
                os.close(fd)

    def put_object(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        rel = f"{self.dir_rel}/objects/{digest[:2]}/{digest}"
        existing = None
        with contextlib.suppress(Refused, Invalid):
            existing = safefs.read(self.root, rel, max_bytes=MAX_OBJECT + 1)
        if existing is None or hashlib.sha256(existing).hexdigest() != digest:
            # Missing, or there but not what its name says: (re)write it.
            if existing is not None:
                safefs.delete(self.root, rel)
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
            raise Refused("the kept object does not match its hash: the store was tampered with, "
                          "so this version is not served")
        return data

    def append(self, body: dict[str, Any]) -> None:
        with self._locked(True) as dfd:
            self._append(dfd, body)

    def _append(self, dfd: int, body: dict[str, Any]) -> None:
        """Append one MAC'd line; the caller holds the exclusive lock."""
        line = self._line(body)
        fd = os.open("index.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644, dir_fd=dfd)
        try:
            os.write(fd, (line + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def keep(self, sid: str, rel: str, data: bytes | None, reason: str, turn_id: str | None,
             call_id: str | None, version_id: str) -> Record:
        """Record ``data`` as the content ``rel`` had before a write (None: it did not exist)."""
        if data is not None and len(data) > MAX_OBJECT:
            raise TooLarge(f"{rel} is larger than the versions store keeps ({MAX_OBJECT} bytes); not written")
        store, digest, blob = "absent", None, None
        if data is not None:
            digest = hashlib.sha256(data).hexdigest()
            blob = self.repo.committed_blob(self.root / rel, data) if self.repo is not None else None
            store = "git" if blob is not None else "versions"
        rec = Record(version_id=version_id, sid=sid, path=rel, store=store, sha256=digest,
                     size=len(data) if data is not None else 0, created=time.time(), reason=reason,
                     turn_id=turn_id, call_id=call_id, blob=blob)
        # The object and its line under one lock: a collection in between would find the object
        # unreferenced and remove it, leaving a record whose content is gone.
        with self._locked(True) as dfd:
            if store == "versions":
                assert data is not None
                self.put_object(data)
            self._append(dfd, asdict(rec))
        return rec

    def mark_undone(self, version_id: str, sid: str) -> None:
        self.append({"undone": version_id, "sid": sid})

    # ------------------------------------------------------------------ reading (untrusted)
    def records(self) -> tuple[list[Record], set[str]]:
        """Every record whose MAC holds, oldest first, and the ids marked undone."""
        idx = self.read_index()
        return idx.records, idx.undone

    def read_index(self) -> Index:
        path = f"{self.dir_rel}/index.jsonl"
        with self._locked(False):
            raw = safefs.read(self.root, path, max_bytes=MAX_INDEX_BYTES)
        return self._parse(raw)

    def _parse(self, raw: bytes | None) -> Index:
        idx = Index()
        for line in (raw or b"").splitlines():
            if not line or len(line) > MAX_INDEX_LINE:
                continue
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if not isinstance(d, dict) or self._verified(d) is None:
                continue
            if "undone" in d:
                if isinstance(d["undone"], str):
                    idx.undone.add(d["undone"])
                    idx.lines.append((line, d["undone"]))
                continue
            if "horizon" in d:
                if isinstance(d["horizon"], (int, float)) and isinstance(d.get("sid"), str):
                    idx.horizons[d["sid"]] = max(float(d["horizon"]), idx.horizons.get(d["sid"], 0.0))
                continue
            if "collected_at" in d:
                if isinstance(d["collected_at"], (int, float)):
                    idx.collected_at = max(idx.collected_at or 0.0, float(d["collected_at"]))
                continue
            rec = self._valid(d)
            if rec is not None:
                idx.records.append(rec)
                idx.lines.append((line, rec.version_id))
        return idx

    def _valid(self, d: dict[str, Any]) -> Record | None:
        try:
            rec = Record(**{k: d.get(k) for k in Record.__dataclass_fields__})  # type: ignore[arg-type]
        except TypeError:
            return None
        if not isinstance(rec.version_id, str) or not ID_RE.fullmatch(rec.version_id):
            return None
        if not isinstance(rec.path, str) or rec.store not in ("versions", "absent", "git"):
            return None
        if rec.store != "absent" and not (isinstance(rec.sha256, str) and HEX64.fullmatch(rec.sha256)):
            return None
        if rec.store == "git" and not (isinstance(rec.blob, str) and OID.fullmatch(rec.blob)):
            return None
        try:
            check_path(self.root, rec.path, self.dir_rel)
        except (Refused, Invalid):
            return None
        if not isinstance(rec.size, int) or rec.size < 0 or rec.size > MAX_OBJECT:
            return None
        return rec

    def find(self, version_id: str) -> Record:
        idx = self.read_index()
        for rec in idx.records:
            if rec.version_id == version_id:
                return rec
        born = id_time(version_id)
        if idx.collected_at is not None and born is not None and born < idx.collected_at:
            raise Collected(f"version {version_id} is no longer kept: it is older than the last collection "
                            "and outside the retention policy ([versions] keep_days, keep_per_file)")
        raise NotFound("no such version")

    def content(self, rec: Record) -> bytes | None:
        """The kept bytes, verified against the record; None for ``absent``."""
        if rec.store == "absent":
            return None
        assert rec.sha256 is not None
        if rec.store == "versions":
            data = self.get_object(rec.sha256)
        else:
            if self.repo is None:
                raise NotFound("this version was kept by git, and the workspace is no longer a git work tree")
            assert rec.blob is not None
            data = self.repo.read(rec.blob, MAX_OBJECT)
        if hashlib.sha256(data).hexdigest() != rec.sha256 or len(data) != rec.size:
            raise Refused("the kept content does not match its record: the store was tampered with, "
                          "so this version is not served")
        return data


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
