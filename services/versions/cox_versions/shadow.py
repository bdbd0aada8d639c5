"""Command snapshots: a shadow git repository that sees the workspace, as Cline's checkpoints do.

Before a command runs, ``git add -A`` into a shadow index and ``write-tree`` give a tree id that
names every file's content at that moment (git's stat cache makes this cheap after the first
time: only files whose size or mtime changed are hashed again). After the command the same two
steps give a second tree, and ``diff-tree`` between the two lists what the command created,
changed or deleted. The content a changed file had before is then in the shadow's object
database, from where the versions service copies it into its own store.

Layout, inside the store folder: ``shadow/`` is a git directory (``HEAD``, ``objects/``,
``refs/``, ``config``) whose work tree is the workspace; ``shadow/index-<sid>`` is each session's
index, so sessions in one workspace do not disturb each other's stat cache, and
``shadow/refs/cox/<sid>`` names the tree of that session's latest snapshot.

Collection (:meth:`Shadow.collect`): every snapshot leaves the blobs of the files it saw, so the
shadow grows with every command. A session's index always names exactly the objects of its
latest snapshot (``git add`` changes it, then ``write-tree`` writes that tree and the ref), and a
running command's "before" tree is that ref until its ``after``; so ``git prune`` keeps every
object reachable from the refs and drops the rest. An index idle longer than the retention
(``[versions] keep_days``), or one without a ref (written before refs were kept), is dropped
with its ref: that session's next snapshot hashes the workspace again, as the first one did.
A collection takes ``shadow/cox.lock`` exclusively; a snapshot and the ``after`` of a command
hold it shared (:meth:`Shadow.hold`), so no prune runs between a snapshot and the reads of it.

The shadow is written by a process the model's commands can reach, so its ``config`` is written
again before every use (a planted ``core.fsmonitor`` or filter driver never runs), git runs with
the scrubbed environment of :mod:`cox_versions.gitrepo`, and every blob read back is verified
against its id. The store folder and the credential denylist are excluded by pathspec (which a
workspace ``.gitignore`` cannot override); the workspace's own ``.gitignore`` files are honoured,
so ignored trees such as ``node_modules/`` cost nothing (and are not versioned). Git never adds a
``.git`` folder; a nested repository is seen as one entry (its files are not versioned).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from coxswain import safefs
from coxswain.errors import CoxError, Invalid, Unavailable

from . import gitrepo

SNAPSHOT_TIMEOUT_S = 60.0
CONFIG = b"""[core]
\trepositoryformatversion = 0
\tbare = false
\tfilemode = true
\tsymlinks = true
\tautocrlf = false
\tfsmonitor = false
\thooksPath = /dev/null
\tuntrackedCache = false
\tbigFileThreshold = 16m
[gc]
\tauto = 0
[advice]
\taddEmbeddedRepo = false
"""
TREE_RE = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")
HASH_ONLY = ["-c", "core.bigFileThreshold=2g"]
"""For the commands that only hash (``ls-files -m`` comparing content, ``update-index
--info-only``): past ``bigFileThreshold`` git hashes a file in a streaming loop about ten times
slower (a 300 MB file: 9 s instead of 0.9 s)."""
MAX_STORED_FILE = 64 * 1024 * 1024
"""A file larger than this is never copied into the shadow (the versions store keeps nothing
larger either): it is indexed by its id only (``update-index --info-only``), so a later change
of it is seen, but its content cannot be put back."""


@dataclass(frozen=True)
class Bound:
    """What one snapshot copies into the shadow whole (``[sandbox] workspace_files`` and
    ``workspace_mb``; 0 = no bound): past it, files are indexed by id only."""

    files: int = 0
    bytes: int = 0
    file_limit: int = 0
    """``[sandbox] file_mb`` in bytes: a file of exactly this size was stopped by RLIMIT_FSIZE."""


@dataclass
class Taken:
    """What a snapshot did with the files that changed since the last one."""

    seen: int = 0
    """Files created, changed or deleted since the session's last snapshot."""
    stored: int = 0
    by_id: set[str] = field(default_factory=set)
    """Paths indexed by their id only (their content is not in the shadow)."""
    too_large: list[str] = field(default_factory=list)
    """Of those, the files over :data:`MAX_STORED_FILE`."""
    limit: str | None = None
    """``workspace_files`` or ``workspace_mb`` when the bound was reached."""
    added_bytes: int = 0
    at_file_limit: list[str] = field(default_factory=list)
    """Files exactly ``file_mb`` large: the kernel refused to let them grow (RLIMIT_FSIZE)."""


@dataclass(frozen=True)
class Change:
    path: str
    status: str
    """``A`` created, ``M`` modified, ``D`` deleted, ``T`` type changed (file <-> link)."""
    old_mode: str
    old_oid: str
    new_mode: str


def excludes(store_dir: str) -> list[str]:
    """Pathspecs that keep the store folder and every denylisted name out of the snapshot."""
    out = [f":(exclude,top){store_dir}"]
    for pat in safefs.CREDENTIAL_DENYLIST:
        if "/" in pat:
            out += [f":(exclude,top,glob){pat}", f":(exclude,top,glob){pat}/**"]
        else:
            out += [f":(exclude,top,glob)**/{pat}", f":(exclude,top,glob)**/{pat}/**"]
    return out


class Shadow:
    def __init__(self, workspace: Path, store_dir: str) -> None:
        self.ws = workspace
        self.store_dir = store_dir
        self.rel = f"{store_dir}/shadow"
        self.git_dir = workspace / self.rel

    def _prepare(self) -> None:
        """Create the git directory (never through a link) and write its config afresh."""
        for sub in ("objects", "refs/heads", "info"):
            with safefs.open_dir(self.ws, f"{self.rel}/{sub}", create=True):
                pass
        for name, content in (("HEAD", b"ref: refs/heads/main\n"), ("config", CONFIG), ("info/exclude", b"")):
            rel = f"{self.rel}/{name}"
            try:
                same = safefs.read(self.ws, rel, max_bytes=len(content) + 1) == content
            except CoxError:  # a link or a folder planted there
                same = False
            if not same:
                safefs.delete(self.ws, rel)  # removes a planted link itself, never its target
                safefs.write(self.ws, rel, content)

    @contextlib.contextmanager
    def hold(self, exclusive: bool = False) -> Iterator[None]:
        """The shadow's lock: shared while snapshotting or reading a snapshot, exclusive to collect."""
        with safefs.open_dir(self.ws, self.rel, create=True) as dfd:
            fd = os.open("cox.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
            os.fchmod(fd, 0o644)  # readable by the sandbox user: a command's `git add -A` reads the store
            try:
                fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
                yield
            finally:
                os.close(fd)

    def _env(self, sid: str) -> dict[str, str]:
        safefs.check_text_path(sid)
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", sid):
            raise Invalid("bad session id for a shadow index")
        return {"GIT_DIR": str(self.git_dir), "GIT_WORK_TREE": str(self.ws),
                "GIT_INDEX_FILE": str(self.git_dir / f"index-{sid}"), "GIT_LITERAL_PATHSPECS": "0"}

    def snapshot(self, sid: str, bound: Bound | None = None) -> tuple[str, float]:
        """The tree id of the workspace now, and how long it took (ms)."""
        tree, ms, _ = self.snapshot_bounded(sid, bound)
        return tree, ms

    def snapshot_bounded(self, sid: str, bound: Bound | None = None) -> tuple[str, float, Taken]:
        """The tree id of the workspace now, how long it took (ms), and what was copied.

        Only what changed since the session's last snapshot is looked at (``ls-files -o -m``,
        git's stat cache): of it, files over :data:`MAX_STORED_FILE`, and past ``bound`` the
        rest, are indexed by id only (hashed, never copied), so neither a huge file nor a
        hundred thousand small ones make the shadow grow or the snapshot slow."""
        t0 = time.perf_counter()
        self._prepare()
        env = self._env(sid)
        taken = Taken()
        try:
            raw = gitrepo.run([*HASH_ONLY, "ls-files", "-z", "-o", "-m", "--exclude-standard", "--", ".",
                               *excludes(self.store_dir)], self.ws, env, timeout=SNAPSHOT_TIMEOUT_S).stdout
            whole, by_id = self._sort(raw, bound or Bound(), taken)
            literal = {**env, "GIT_LITERAL_PATHSPECS": "1"}
            if whole:
                gitrepo.run(["add", "-A", "--ignore-errors", "--pathspec-from-file=-", "--pathspec-file-nul"],
                            self.ws, literal, input=b"\0".join(whole), timeout=SNAPSHOT_TIMEOUT_S, check=False)
            if by_id:
                gitrepo.run([*HASH_ONLY, "update-index", "--add", "--remove", "--info-only", "-z", "--stdin"], self.ws,
                            literal, input=b"\0".join(by_id) + b"\0", timeout=SNAPSHOT_TIMEOUT_S, check=False)
            tree = gitrepo.run(["write-tree", "--missing-ok"], self.ws, env,
                               timeout=SNAPSHOT_TIMEOUT_S).stdout.decode().strip()
        except gitrepo.GitError as exc:
            raise Unavailable(f"the snapshot failed: {exc}") from exc
        if not TREE_RE.fullmatch(tree):
            raise Unavailable("the snapshot gave no tree id")
        # What keeps this tree's objects (and so the index's) through a collection.
        safefs.write(self.ws, f"{self.rel}/refs/cox/{sid}", tree.encode() + b"\n")
        return tree, (time.perf_counter() - t0) * 1000, taken

    def _sort(self, raw: bytes, bound: Bound, taken: Taken) -> tuple[list[bytes], list[bytes]]:
        """Split the changed paths into those copied whole and those indexed by id only."""
        whole: list[bytes] = []
        by_id: list[bytes] = []
        seen: set[bytes] = set()
        files = 0
        for p in raw.split(b"\0"):
            if not p or p in seen:
                continue
            seen.add(p)
            taken.seen += 1
            try:
                st = os.lstat(os.path.join(os.fsencode(self.ws), p))
            except OSError:  # deleted: leaves the index, costs nothing
                whole.append(p)
                continue
            regular = stat.S_ISREG(st.st_mode)
            size = st.st_size if regular else 0
            files += 1
            taken.added_bytes += size
            if regular and bound.file_limit and size == bound.file_limit and len(taken.at_file_limit) < 10:
                taken.at_file_limit.append(os.fsdecode(p))
            if taken.limit is None and bound.files and files > bound.files:
                taken.limit = "workspace_files"
            if taken.limit is None and bound.bytes and taken.added_bytes > bound.bytes:
                taken.limit = "workspace_mb"
            if regular and (size > MAX_STORED_FILE or taken.limit is not None):
                by_id.append(p)
                name = os.fsdecode(p).rstrip("/")
                taken.by_id.add(name)
                if size > MAX_STORED_FILE and len(taken.too_large) < 50:
                    taken.too_large.append(name)
            else:
                whole.append(p)
                taken.stored += 1
        return whole, by_id

    def changes(self, sid: str, before: str, bound: Bound | None = None) -> tuple[str, list[Change], Taken]:
        """A new snapshot, what changed since the tree ``before``, and what the snapshot copied."""
        if not TREE_RE.fullmatch(before):
            raise Invalid("not a snapshot id")
        after, _, taken = self.snapshot_bounded(sid, bound)
        if after == before:
            return after, [], taken
        env = self._env(sid)
        try:
            raw = gitrepo.run(["diff-tree", "-r", "-z", "--no-renames", "--no-ext-diff", "--no-textconv",
                               before, after], self.ws, env).stdout
        except gitrepo.GitError as exc:
            raise Invalid(f"the snapshot {before[:12]} is not in the shadow repository") from exc
        return after, parse_raw(raw), taken

    def read(self, oid: str, max_bytes: int) -> bytes:
        algo = "sha256" if len(oid) == 64 else "sha1"
        return gitrepo.read_blob(self.ws, oid, algo, max_bytes, {"GIT_DIR": str(self.git_dir)})

    def collect(self, idle_s: float | None, now: float | None = None) -> tuple[int, int]:
        """Drop idle (or ref-less) session indexes, then prune unreachable objects; (indexes, objects) removed."""
        now = time.time() if now is None else now
        if not (self.git_dir / "objects").is_dir():
            return 0, 0
        with self.hold(exclusive=True):
            self._prepare()
            dropped = 0
            with safefs.open_dir(self.ws, self.rel) as dfd:
                for name in os.listdir(dfd):
                    if not name.startswith("index-"):
                        continue
                    sid = name[len("index-"):]
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                    ref = self.git_dir / "refs" / "cox" / sid
                    # Last used: the ref is written by every snapshot; git rewrites the index
                    # only when something in the workspace changed.
                    used = max(st.st_mtime, ref.lstat().st_mtime if ref.is_file() else 0.0)
                    idle = idle_s is not None and now - used > idle_s
                    if idle or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", sid) or not ref.is_file():
                        os.unlink(name, dir_fd=dfd)
                        with contextlib.suppress(OSError, Invalid):
                            safefs.delete(self.ws, f"{self.rel}/refs/cox/{sid}")
                        dropped += 1
            with contextlib.suppress(Invalid):
                for e in safefs.listdir(self.ws, f"{self.rel}/refs/cox", limit=1_000_000):
                    if not (self.git_dir / f"index-{e.name}").exists():
                        safefs.delete(self.ws, f"{self.rel}/refs/cox/{e.name}")  # its index is gone
            before = self._loose()
            env = {"GIT_DIR": str(self.git_dir), "GIT_INDEX_FILE": str(self.git_dir / "index-none")}
            try:
                gitrepo.run(["prune", "--expire=now"], self.ws, env, timeout=SNAPSHOT_TIMEOUT_S)
            except gitrepo.GitError as exc:
                raise Unavailable(f"the shadow's prune failed: {exc}") from exc
            return dropped, max(0, before - self._loose())

    def _loose(self) -> int:
        n = 0
        with contextlib.suppress(OSError):
            for sub in os.scandir(self.git_dir / "objects"):
                if len(sub.name) == 2 and sub.is_dir(follow_symlinks=False):
                    n += sum(1 for _ in os.scandir(sub.path))
        return n

    def forget(self, sid: str) -> None:
        with contextlib.suppress(OSError, Invalid):
            os.unlink(self._env(sid)["GIT_INDEX_FILE"])


def parse_raw(raw: bytes) -> list[Change]:
    """``diff-tree -z`` raw output: ``:oldmode newmode oldoid newoid status\\0path\\0`` ..."""
    out: list[Change] = []
    fields = raw.split(b"\0")
    i = 0
    while i + 1 < len(fields):
        meta = fields[i].decode(errors="replace")
        if not meta.startswith(":"):
            i += 1
            continue
        parts = meta[1:].split()
        path = fields[i + 1].decode("utf-8", errors="surrogateescape")
        i += 2
        if len(parts) != 5:
            continue
        out.append(Change(path=path, status=parts[4][:1], old_mode=parts[0], old_oid=parts[2], new_mode=parts[1]))
    return out
