"""File access pinned to a workspace root, safe against links swapped in after a check.

Paths in every request are untrusted. :func:`resolve` answers "where does this really point" (all
links resolved) and refuses anything outside the root. The I/O functions then open the resolved
path *beneath* the root: each component is opened relative to its parent's descriptor with
``O_NOFOLLOW``, so a link swapped in between the check and the open fails (``ELOOP``/``ENOTDIR``)
instead of escaping. Writes go to a temporary file in the same directory and are renamed into
place, so a reader sees the old content or the new, never half of one.

A write into a workspace by a root process gives an ``owner`` (:func:`coxswain.sandbox_user.file_owner`):
the new file and every folder the write creates are ``fchown``-ed to the sandbox user, so the
commands that run as that user can change them.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import functools
import os
import re
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from .errors import Invalid, Refused
from .sandbox_user import Owner

MAX_PATH = 4096
MAX_DEPTH = 64

CREDENTIAL_DENYLIST: tuple[str, ...] = (
    ".ssh", ".aws", ".gnupg", ".docker", ".kube", ".azure", ".config/gcloud",
    ".netrc", ".pgpass", ".npmrc", ".pypirc", ".git-credentials",
    "*.pem", "*.key", "*.p12", "*.pfx", "id_rsa*", "id_ed25519*", "id_ecdsa*", "id_dsa*",
    ".env", ".env.*", "*.env",
)
"""Never read, written or versioned, whatever the settings (docs/design.md, Policy: refused outright)."""


@functools.lru_cache(maxsize=16)
def _compiled(patterns: tuple[str, ...]) -> tuple[tuple[str, ...], re.Pattern[str] | None]:
    """``patterns``' paths (a ``/`` in them), and one expression for the names: any part matches."""
    names = [p for p in patterns if "/" not in p]
    rx = re.compile("|".join(f"(?:{fnmatch.translate(p)})" for p in names)) if names else None
    return tuple(p for p in patterns if "/" in p), rx


def _matches(rel: str, patterns: tuple[str, ...]) -> str | None:
    """The first of ``patterns`` that ``rel`` falls under: a path pattern (with ``/``) matches it
    or a folder above it, a name pattern any of its parts (``fnmatch``, case-sensitive)."""
    paths, rx = _compiled(patterns)
    # The usual answer (no entry) from one expression over the parts; which entry, the loop below.
    parts = PurePosixPath(rel).parts if rel.startswith("/") else [p for p in rel.split("/") if p and p != "."]
    if not any(rel == p or rel.startswith(p + "/") for p in paths) and (
            rx is None or not any(rx.match(part) for part in parts)):
        return None
    for pat in patterns:
        if "/" in pat:
            if rel == pat or rel.startswith(pat + "/"):
                return pat
            continue
        for part in parts:
            if fnmatch.fnmatchcase(part, pat):
                return pat
    return None


def denied(rel: str) -> str | None:
    """The denylist entry ``rel`` falls under, if any."""
    return _matches(rel, CREDENTIAL_DENYLIST)


def check_text_path(path: str) -> str:
    if not isinstance(path, str) or not path:
        raise Invalid("path must be a non-empty string")
    if "\x00" in path or len(path) > MAX_PATH:
        raise Invalid("path holds NUL or is too long")
    return path


def realpath(path: Path | str) -> str:
    """``os.path.realpath(path)``, resolved by the kernel where the path exists: opened with
    ``O_PATH`` (nothing is read, a FIFO does not block) and its descriptor's link in
    ``/proc/self/fd`` read back, three system calls where Python's walk makes one ``lstat`` per
    component (6.6 against 27 µs for a path nine folders deep; every read decision resolves
    four). Whatever the kernel cannot answer as a plain absolute path (a path that does not
    exist yet, a dangling link, a loop, no ``/proc``, a deleted folder) gets Python's own walk,
    so the answer is always ``os.path.realpath``'s."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except (OSError, ValueError):
        return os.path.realpath(path)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return os.path.realpath(path)
    finally:
        os.close(fd)
    if not real.startswith("/") or real.endswith(" (deleted)"):
        return os.path.realpath(path)
    return real


def resolve(root: Path | str, path: str) -> str:
    """``path`` (relative to ``root``, or absolute) as a normalised path relative to the real root.

    Every link is resolved; a result outside the root is refused. ``""`` is the root itself.
    """
    check_text_path(path)
    try:
        real_root = realpath(root)
        joined = path if os.path.isabs(path) else os.path.join(real_root, path)
        real = realpath(joined)
    except OSError as exc:  # a link swapped for a folder mid-walk (readlink: EINVAL), a loop...
        raise Refused(f"{path!r} changed while it was resolved") from exc
    if real != real_root and not real.startswith(real_root + os.sep):
        raise Refused(f"{path!r} is outside the workspace")
    # Both are real paths (absolute, normalised): what follows the root is the relative path.
    rel = real[len(real_root) + 1:] if real != real_root else ""
    if rel.count("/") + 1 > MAX_DEPTH:
        raise Invalid("path is too deep")
    return rel


def _components(rel: str) -> list[str]:
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise Refused("'..' is not allowed in a resolved path")
    return parts


@contextlib.contextmanager
def _dir_fd(root: Path | str, parts: list[str], create: bool = False, owner: Owner | None = None) -> Iterator[int]:
    """A descriptor of ``root/parts...`` opened component by component without following links."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(realpath(root), flags)
    try:
        for part in parts:
            try:
                nfd = os.open(part, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                made = False
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
                    made = True
                nfd = os.open(part, flags, dir_fd=fd)
                if made and owner is not None:
                    os.fchown(nfd, owner.uid, owner.gid)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Refused(f"{part!r} is a link or not a folder (changed since it was checked?)") from exc
                raise
            os.close(fd)
            fd = nfd
        yield fd
    finally:
        os.close(fd)


def open_dir(root: Path | str, rel: str, create: bool = False) -> contextlib.AbstractContextManager[int]:
    """A descriptor of the folder ``rel`` beneath ``root``, opened without following links."""
    return _dir_fd(root, _components(rel), create=create)


def _split(rel: str) -> tuple[list[str], str]:
    parts = _components(rel)
    if not parts:
        raise Invalid("a file path is needed, not the workspace root")
    return parts[:-1], parts[-1]


def read(root: Path | str, rel: str, max_bytes: int | None = None) -> bytes | None:
    """The file's bytes, or None when it does not exist. Links anywhere in the path are refused."""
    dirs, name = _split(rel)
    try:
        with _dir_fd(root, dirs) as dfd:
            try:
                # O_NONBLOCK: a FIFO (no writer) or device is refused below instead of hanging the open
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY,
                             dir_fd=dfd)
            except OSError as exc:
                if exc.errno == errno.ELOOP:
                    raise Refused(f"{rel!r} is a link") from exc
                if exc.errno == errno.EISDIR:
                    raise Invalid(f"{rel!r} is a folder") from exc
                raise
            # Checked on the raw fd: open() of a folder succeeds and fdopen() would then raise
            # IsADirectoryError, an internal error to every caller instead of this refusal.
            try:
                st = os.fstat(fd)
                if stat.S_ISDIR(st.st_mode):
                    raise Invalid(f"{rel!r} is a folder")
                if not stat.S_ISREG(st.st_mode):
                    raise Invalid(f"{rel!r} is not a regular file")
            except BaseException:
                os.close(fd)
                raise
            with os.fdopen(fd, "rb") as fh:
                return fh.read() if max_bytes is None else fh.read(max_bytes)
    except FileNotFoundError:
        return None
    except NotADirectoryError as exc:
        raise Invalid(f"a parent of {rel!r} is not a folder") from exc


def write(root: Path | str, rel: str, data: bytes, mode: int | None = None, owner: Owner | None = None) -> bool:
    """Atomically replace ``rel`` with ``data`` (temp + fsync + rename). True if it existed."""
    dirs, name = _split(rel)
    with _dir_fd(root, dirs, create=True, owner=owner) as dfd:
        existed, tmp = _stage(dfd, rel, name, data, mode, owner)
        try:
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=dfd)
            raise
        return existed


def _stage(dfd: int, rel: str, name: str, data: bytes, mode: int | None,
           owner: Owner | None = None) -> tuple[bool, str]:
    """Write ``data`` to a new temporary file next to ``name`` (fsynced); (existed, temp name)."""
    existed = False
    try:
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            raise Refused(f"{rel!r} is a link")
        if stat.S_ISDIR(st.st_mode):
            raise Invalid(f"{rel!r} is a folder")
        existed = True
        mode = stat.S_IMODE(st.st_mode) & ~(stat.S_ISUID | stat.S_ISGID) if mode is None else mode
    except FileNotFoundError:
        pass
    tmp = f".{name}.cox-{uuid.uuid4().hex[:12]}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 mode if mode is not None else 0o644, dir_fd=dfd)
    try:
        with os.fdopen(fd, "wb") as fh:
            if owner is not None:
                os.fchown(fh.fileno(), owner.uid, owner.gid)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dfd)
        raise
    return existed, tmp


# A fenced write in three steps (the runner's write_file; see cox_runner.loop._write):
# stage() the content in a temporary file, record the intent in Redis under the lease's token,
# then commit() the rename. Whoever takes the session over settles a recorded intent with
# abort(): it renames the temporary file away, so a paused writer's commit() can no longer land
# (rename is atomic: exactly one of the two renames of the same name succeeds).

ABORTED = ".aborted"


def stage(root: Path | str, rel: str, data: bytes, owner: Owner | None = None) -> str:
    """Write ``data`` to a temporary file in ``rel``'s folder; its name (for commit/abort)."""
    dirs, name = _split(rel)
    with _dir_fd(root, dirs, create=True, owner=owner) as dfd:
        return _stage(dfd, rel, name, data, None, owner)[1]


def commit(root: Path | str, rel: str, tmp: str) -> None:
    """Rename the staged ``tmp`` onto ``rel``. FileNotFoundError if it was aborted meanwhile."""
    dirs, name = _split(rel)
    _check_tmp(name, tmp)
    with _dir_fd(root, dirs) as dfd:
        os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)


def abort(root: Path | str, rel: str, tmp: str) -> bool:
    """Settle a staged write nobody will finish: True if it had not landed (it never will now),
    False if it had (its ``commit`` ran). Safe to call again: an earlier abort is remembered by
    the ``.aborted`` name until :func:`discard` removes it."""
    dirs, name = _split(rel)
    _check_tmp(name, tmp)
    try:
        with _dir_fd(root, dirs) as dfd:
            try:
                os.rename(tmp, tmp + ABORTED, src_dir_fd=dfd, dst_dir_fd=dfd)
                return True
            except FileNotFoundError:
                try:
                    os.stat(tmp + ABORTED, dir_fd=dfd, follow_symlinks=False)
                    return True
                except FileNotFoundError:
                    return False
    except FileNotFoundError:
        return True  # the folder is gone: nothing was staged there that could still land


def discard(root: Path | str, rel: str, tmp: str) -> None:
    """Remove a staged (or aborted) temporary file; missing is fine."""
    dirs, name = _split(rel)
    _check_tmp(name, tmp)
    with contextlib.suppress(FileNotFoundError), _dir_fd(root, dirs) as dfd:
        for n in (tmp, tmp + ABORTED):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(n, dir_fd=dfd)


def _check_tmp(name: str, tmp: str) -> None:
    if "/" in tmp or not (tmp.startswith(f".{name}.cox-") and tmp.endswith(".tmp")):
        raise Invalid("not a staged temporary file of this path")


def delete(root: Path | str, rel: str) -> bool:
    """Remove the file ``rel``; True if it existed."""
    dirs, name = _split(rel)
    try:
        with _dir_fd(root, dirs) as dfd:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                raise Invalid(f"{rel!r} is a folder")
            os.unlink(name, dir_fd=dfd)
            return True
    except FileNotFoundError:
        return False


@dataclass(frozen=True)
class Entry:
    name: str
    kind: str  # file | dir | link | other
    size: int


def listdir(root: Path | str, rel: str, limit: int = 1000) -> list[Entry]:
    """Entries of the folder ``rel`` (sorted), without following links."""
    out: list[Entry] = []
    try:
        with _dir_fd(root, _components(rel)) as dfd:
            names = sorted(os.listdir(dfd))
            for name in names[:limit]:
                try:
                    st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                kind = ("dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode)
                        else "link" if stat.S_ISLNK(st.st_mode) else "other")
                out.append(Entry(name, kind, st.st_size if kind == "file" else 0))
    except FileNotFoundError as exc:
        raise Invalid(f"no folder {rel or '.'!r}") from exc
    except NotADirectoryError as exc:
        raise Invalid(f"{rel!r} is not a folder") from exc
    return out


def real_under(root: Path | str, path: Path | str) -> Path | None:
    """The real path of ``path`` (every link resolved) if it is ``root``'s real path or lies
    beneath it; None otherwise. The one check behind "a workspace must be under the root"."""
    real_root, real = realpath(root), realpath(path)
    inside = real_root if real_root.endswith("/") else real_root + "/"
    return Path(real) if real == real_root or real.startswith(inside) else None


def write_if_missing(root: Path | str, rel: str, data: bytes) -> bool:
    """Create ``rel`` with ``data`` unless it exists. True if it was created."""
    dirs, name = _split(rel)
    with _dir_fd(root, dirs, create=True) as dfd:
        try:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        return True
