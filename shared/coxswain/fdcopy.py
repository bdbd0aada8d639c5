"""Copy a folder tree by walking file descriptors, never a path a concurrent process can swap.

A fork copies a workspace while a command of the busy source session may still be running in
it, and that command may replace any folder or file with a link to somewhere else at any moment
(``shutil.copytree`` then followed the link and copied whatever it pointed at: the stack's state
folder, once). Here nothing is ever looked up by a path that could lead outside:

- the source and destination roots are descriptors (the caller opens them, e.g. with
  :func:`coxswain.safefs.open_dir`, component by component without following links);
- a folder is listed through its descriptor; each entry is opened relative to it with
  ``O_NOFOLLOW`` (``O_NONBLOCK``, so a FIFO swapped in never blocks the open, and ``O_NOCTTY``),
  and what was opened is judged by ``fstat`` of the descriptor, not by the name: a link swapped
  in fails the open (``ELOOP``) and is recreated as a link (``readlink`` relative to the folder's
  descriptor, never followed); a folder is walked through the descriptor just opened;
- only regular files' bytes are copied; FIFOs, sockets and devices are left out (not opened:
  an ``lstat`` before the open leaves them out, ``fstat`` after it catches one swapped in);
- the destination is made relative to descriptors too: ``mkdir(dir_fd=)`` then an
  ``O_DIRECTORY|O_NOFOLLOW`` open, files with ``O_CREAT|O_EXCL|O_NOFOLLOW``, so a copy made
  inside the source (a workspace that is the root the fork lies in) cannot be redirected either.

What is kept: file and folder modes without the setuid/setgid bits, access and modification
times (links' too). Extended attributes are not copied (``security.capability`` would be a
privilege), nor owners unless the caller names one. The copy is bounded in entries, bytes and
depth (:class:`Limits`); past a bound it stops with :class:`~coxswain.errors.TooLarge`. Every
error names the entry relative to the copied folder, never a host path.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field

from .errors import CoxError, TooLarge

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
KEEP_BITS = 0o1777
"""Permission bits a copy keeps: setuid and setgid dropped."""
CHUNK = 1 << 20
TRIES = 3
"""An entry whose type changes under the copy (file, link, folder) is looked at this many times,
then left out."""
SHOWN = 200


class CopyFailed(CoxError):
    """The copy stopped at an entry (its path relative to the copied folder in the detail)."""

    code = "copy_failed"
    status = 500


@dataclass(frozen=True)
class Limits:
    max_entries: int = 200_000
    """Files, folders and links together."""
    max_bytes: int = 4 << 30
    max_depth: int = 128
    """Folders held open at once (two descriptors each)."""


@dataclass
class Copied:
    files: int = 0
    dirs: int = 0
    links: int = 0
    bytes: int = 0
    left_out: list[str] = field(default_factory=list)
    """Entries not copied: FIFOs, sockets, devices, and entries that kept changing type or
    vanished under the copy (relative paths, the first 100)."""
    left_out_count: int = 0

    @property
    def entries(self) -> int:
        return self.files + self.dirs + self.links


def show(rel: str) -> str:
    """``rel`` for an error message: quoted, bounded."""
    return repr(rel if len(rel) <= SHOWN else rel[:SHOWN] + "...")


def reason(exc: OSError) -> str:
    """What went wrong, without the file names an OSError carries."""
    name = errno.errorcode.get(exc.errno or 0, "")
    text = exc.strerror or type(exc).__name__
    return f"{text} ({name})" if name else text


class _Walk:
    def __init__(self, limits: Limits, exclude: frozenset[str], skip: set[tuple[int, int]],
                 owner: tuple[int, int] | None) -> None:
        self.limits = limits
        self.exclude = exclude
        self.skip = skip
        self.owner = owner
        self.out = Copied()

    # ------------------------------------------------------------------ bounds
    def _count(self, rel: str) -> None:
        if self.out.entries + 1 > self.limits.max_entries:
            raise TooLarge(f"the folder holds more than {self.limits.max_entries} files, folders and links "
                           f"(stopped at {show(rel)}); a copy takes at most that many")

    def _left_out(self, rel: str) -> None:
        self.out.left_out_count += 1
        if len(self.out.left_out) < 100:
            self.out.left_out.append(rel)

    # ------------------------------------------------------------------ the walk
    def folder(self, sfd: int, dfd: int, rel: str, depth: int) -> None:
        if depth > self.limits.max_depth:
            raise TooLarge(f"folders are nested more than {self.limits.max_depth} deep at {show(rel)}; "
                           "a copy goes at most that deep")
        try:
            with os.scandir(sfd) as it:
                for entry in it:
                    name = entry.name
                    sub = f"{rel}/{name}" if rel else name
                    if sub in self.exclude:
                        continue
                    self.entry(sfd, dfd, name, sub, depth)
        except OSError as exc:
            raise CopyFailed(f"listing {show(rel or '.')} failed: {reason(exc)}") from exc

    def entry(self, sfd: int, dfd: int, name: str, rel: str, depth: int) -> None:
        for _ in range(TRIES):
            try:
                st = os.stat(name, dir_fd=sfd, follow_symlinks=False)
            except FileNotFoundError:
                return  # gone since the listing: nothing to copy
            except OSError as exc:
                raise CopyFailed(f"reading {show(rel)} failed: {reason(exc)}") from exc
            mode = st.st_mode
            if stat.S_ISLNK(mode):
                if self.link(sfd, dfd, name, rel, st):
                    return
            elif stat.S_ISREG(mode) or stat.S_ISDIR(mode):
                if self.opened(sfd, dfd, name, rel, depth):
                    return
            else:
                self._left_out(rel)  # a FIFO, socket or device: never opened
                return
        self._left_out(rel)  # kept changing under the copy

    def link(self, sfd: int, dfd: int, name: str, rel: str, st: os.stat_result) -> bool:
        """Recreate the link (its text, never what it points at). False: it is no link now."""
        try:
            target = os.readlink(name, dir_fd=sfd)
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                return False  # swapped back to a file or folder: look again
            raise CopyFailed(f"reading the link {show(rel)} failed: {reason(exc)}") from exc
        self._count(rel)
        try:
            os.symlink(target, name, dir_fd=dfd)
            if self.owner is not None:
                os.chown(name, *self.owner, dir_fd=dfd, follow_symlinks=False)
            os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dfd, follow_symlinks=False)
        except OSError as exc:
            raise CopyFailed(f"making the link {show(rel)} failed: {reason(exc)}") from exc
        self.out.links += 1
        return True

    def opened(self, sfd: int, dfd: int, name: str, rel: str, depth: int) -> bool:
        """Open the entry without following a link and copy what the descriptor is. False: it
        became a link (or something else) since it was looked at: look again."""
        try:
            fd = os.open(name, READ_FLAGS, dir_fd=sfd)
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENXIO, errno.ENOTDIR):
                return False  # a link (ELOOP), a socket (ENXIO) swapped in
            raise CopyFailed(f"opening {show(rel)} failed: {reason(exc)}") from exc
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode):
                self.file(fd, st, dfd, name, rel)
            elif stat.S_ISDIR(st.st_mode):
                self.subfolder(fd, st, dfd, name, rel, depth)
            else:
                return False  # a FIFO or device swapped in: the next look leaves it out
            return True
        finally:
            os.close(fd)

    def file(self, fd: int, st: os.stat_result, dfd: int, name: str, rel: str) -> None:
        self._count(rel)
        try:
            out = os.open(name, CREATE_FLAGS, 0o600, dir_fd=dfd)
        except OSError as exc:
            raise CopyFailed(f"creating the copy of {show(rel)} failed: {reason(exc)}") from exc
        try:
            self._bytes(fd, out, rel)
            if self.owner is not None:
                os.fchown(out, *self.owner)
            os.fchmod(out, stat.S_IMODE(st.st_mode) & KEEP_BITS)
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        except OSError as exc:
            raise CopyFailed(f"copying {show(rel)} failed: {reason(exc)}") from exc
        finally:
            os.close(out)
        self.out.files += 1

    def _bytes(self, src: int, dst: int, rel: str) -> None:
        budget = self.limits.max_bytes - self.out.bytes
        fast = hasattr(os, "copy_file_range")
        while True:
            want = min(CHUNK, budget + 1)
            n = 0
            if fast:
                try:
                    n = os.copy_file_range(src, dst, want)
                except OSError as exc:
                    if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM):
                        raise
                    fast = False
            if not fast:
                data = os.read(src, want)
                n = len(data)
                view = memoryview(data)
                while view:
                    view = view[os.write(dst, view):]
            if n == 0:
                return
            budget -= n
            self.out.bytes += n
            if budget < 0:
                raise TooLarge(f"the folder holds more than {self.limits.max_bytes} bytes (stopped at "
                               f"{show(rel)}); a copy takes at most that many")

    def subfolder(self, fd: int, st: os.stat_result, dfd: int, name: str, rel: str, depth: int) -> None:
        if (st.st_dev, st.st_ino) in self.skip:
            return  # the copy itself, made inside the source
        self._count(rel)
        try:
            os.mkdir(name, 0o700, dir_fd=dfd)
            nfd = os.open(name, DIR_FLAGS, dir_fd=dfd)
        except OSError as exc:
            raise CopyFailed(f"creating the folder {show(rel)} failed: {reason(exc)}") from exc
        try:
            self.out.dirs += 1
            self.folder(fd, nfd, rel, depth + 1)
            try:
                finish(nfd, st, self.owner)
            except OSError as exc:
                raise CopyFailed(f"setting the mode of {show(rel)} failed: {reason(exc)}") from exc
        finally:
            os.close(nfd)


def finish(fd: int, st: os.stat_result, owner: tuple[int, int] | None) -> None:
    """Give a copied folder the source's mode (less setuid/setgid) and times, after its content
    (writing into it changed its mtime; a read-only source folder was writable until now)."""
    if owner is not None:
        os.fchown(fd, *owner)
    os.fchmod(fd, stat.S_IMODE(st.st_mode) & KEEP_BITS)
    os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))


def copy_tree(src_fd: int, dst_fd: int, *, exclude: Iterable[str] = (), limits: Limits | None = None,
              owner: tuple[int, int] | None = None) -> Copied:
    """Copy everything beneath the folder ``src_fd`` into the (empty) folder ``dst_fd``.

    ``exclude``: relative paths (``a/b``) left out with what is beneath them. The destination
    folder itself is never copied into itself (it may lie inside the source). ``owner``: a
    ``(uid, gid)`` every copied entry gets (none: the caller's). Neither descriptor is closed.
    """
    src_st = os.fstat(src_fd)
    dst_st = os.fstat(dst_fd)
    if not stat.S_ISDIR(src_st.st_mode) or not stat.S_ISDIR(dst_st.st_mode):
        raise CopyFailed("a copy goes from a folder into a folder")
    walk = _Walk(limits or Limits(), frozenset(p.strip("/") for p in exclude),
                 {(dst_st.st_dev, dst_st.st_ino)}, owner)
    walk.folder(src_fd, dst_fd, "", 1)
    try:
        finish(dst_fd, src_st, owner)
    except OSError as exc:
        raise CopyFailed(f"setting the mode of the copy failed: {reason(exc)}") from exc
    return walk.out
