"""Git, run carefully: the workspace's repository (git-aware keep) and blob reads.

The repository is the model's to change (its commands can edit ``.git/config``), so git runs
with a scrubbed environment (no system or global config, no terminal prompts, no optional
locks), hooks and fsmonitor switched off on the command line, and only plumbing that never runs
a filter or an external program: ``rev-parse``, ``ls-tree``, ``cat-file blob`` (no
``--filters``). What git hands back is checked: a blob's bytes must hash to its id.

"Committed and unchanged" is decided on bytes: the file's ``HEAD`` blob id must equal the git
hash of its current content. A file with a clean/smudge filter or line-ending conversion then
counts as changed and goes to the versions store, which is the safe side.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from coxswain import safefs
from coxswain.errors import NotFound, Refused, Unavailable, without_paths

GIT_TIMEOUT_S = 30.0
SAFE_CONFIG = ("-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "-c", "core.untrackedCache=false",
               "-c", "protocol.allow=never", "-c", "gc.auto=0", "-c", "maintenance.auto=false",
               "-c", "safe.directory=*")
"""``safe.directory=*``: as root the workspace (and its repository) belongs to the sandbox user,
and git refuses a repository of another user ("dubious ownership"). That refusal guards against
a repository's config running programs; here nothing it says can (the settings above, plumbing
only), which was already needed since the model's commands can edit ``.git/config``."""
REGULAR_MODES = frozenset({"100644", "100755"})


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    out = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": "/nonexistent", "LC_ALL": "C", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_TERMINAL_PROMPT": "0", "GIT_OPTIONAL_LOCKS": "0", "GIT_LITERAL_PATHSPECS": "1",
        "GIT_ATTR_NOSYSTEM": "1", "GIT_NO_REPLACE_OBJECTS": "1",
    }
    out.update(extra or {})
    return out


def run(args: list[str], cwd: Path, extra_env: dict[str, str] | None = None, input: bytes | None = None,
        timeout: float = GIT_TIMEOUT_S, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    try:
        proc = subprocess.run(["git", *SAFE_CONFIG, *args], cwd=cwd, env=env(extra_env), input=input,
                              capture_output=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise Unavailable("git is not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise Unavailable(f"git {args[0]} took longer than {timeout:g}s") from exc
    if check and proc.returncode != 0:
        op = next((a for a in args if not a.startswith("-") and "=" not in a), args[0])  # past "-c k=v"
        # git names files by their absolute paths: said relative to the workspace (cwd) instead
        raise GitError(op, without_paths(proc.stderr.decode(errors="replace").strip(), cwd))
    return proc


class GitError(Exception):
    def __init__(self, op: str, stderr: str) -> None:
        super().__init__(f"git {op}: {stderr[:300]}")
        self.op = op
        self.stderr = stderr


def blob_id(data: bytes, algo: str = "sha1") -> str:
    h = hashlib.new(algo)
    h.update(b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()


def read_blob(cwd: Path, oid: str, algo: str, max_bytes: int, extra_env: dict[str, str] | None = None) -> bytes:
    """The bytes of blob ``oid``, refused unless they hash to ``oid``."""
    size = run(["cat-file", "-s", oid], cwd, extra_env, check=False)
    if size.returncode != 0:
        raise NotFound("the kept version is no longer in the git repository")
    try:
        n = int(size.stdout.strip())
    except ValueError as exc:
        raise Refused("git gave a size that is not a number") from exc
    if n > max_bytes:
        raise Refused("the kept git blob is larger than allowed")
    proc = run(["cat-file", "blob", oid], cwd, extra_env, check=False)
    if proc.returncode != 0:
        raise NotFound("the kept version is no longer in the git repository")
    data = proc.stdout
    if blob_id(data, algo) != oid:
        raise Refused("the git object does not match its id (the repository was tampered with)")
    return data


@dataclass(frozen=True)
class Repo:
    """The git work tree that holds a workspace (the workspace itself or a folder above it)."""

    top: Path
    algo: str

    @classmethod
    def find(cls, workspace: Path, limit: Path) -> Repo | None:
        """The repository around ``workspace``, if its top lies within ``limit`` (the root)."""
        ceiling = str(limit.parent)
        try:
            proc = run(["rev-parse", "--show-toplevel", "--show-object-format"], workspace,
                       {"GIT_CEILING_DIRECTORIES": ceiling}, check=False, timeout=10)
        except Unavailable:
            return None
        if proc.returncode != 0:
            return None
        lines = proc.stdout.decode(errors="replace").splitlines()
        if len(lines) < 2:
            return None
        top = safefs.real_under(limit, lines[0])
        if top is None:
            return None
        algo = lines[1].strip()
        if algo not in ("sha1", "sha256"):
            return None
        return cls(top, algo)

    def committed_blob(self, path: Path, data: bytes) -> str | None:
        """The ``HEAD`` blob id of ``path`` when that blob is exactly ``data``; else None."""
        rel = os.path.relpath(path, self.top)
        if rel.startswith(".."):
            return None
        proc = run(["ls-tree", "-z", "--full-tree", "HEAD", "--", rel], self.top, check=False, timeout=10)
        if proc.returncode != 0 or not proc.stdout:
            return None
        entry = proc.stdout.split(b"\0", 1)[0].decode(errors="replace")
        meta, _, name = entry.partition("\t")
        parts = meta.split()
        if len(parts) != 3 or name != rel or parts[0] not in REGULAR_MODES or parts[1] != "blob":
            return None
        oid = parts[2]
        return oid if blob_id(data, self.algo) == oid else None

    def read(self, oid: str, max_bytes: int) -> bytes:
        return read_blob(self.top, oid, self.algo, max_bytes)
