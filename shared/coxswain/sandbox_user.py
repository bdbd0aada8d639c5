"""The unprivileged host user sandboxed processes run as when the runner is root (``[sandbox] user``).

A root runner never lets a command, a hook or an MCP stdio server keep uid 0: each one runs as
this user (:mod:`cox_runner.workspace.sandbox`). The workspace must then belong to that user, so the
runner's and the versions service's writes into a workspace (:mod:`coxswain.safefs` with an
``owner``) create files owned by it, and :func:`settle` walks a workspace before and after each
sandboxed process:

- whatever is not owned by the sandbox user is handed to it (``lchown``), except a file with
  more than one hard link (it may be the host's: a link made on the host into a workspace is
  never a reason to give the host's file away), and the versions store folder, which stays the
  runner's (and is mounted read-only in the sandbox);
- setuid and setgid bits are cleared on everything (a sandboxed process may ``chmod u+s`` its
  own files; on the host that would be a setuid binary of the sandbox user, or of the runner's
  user when the runner is not root).

The walk holds directory descriptors and never follows a link (``O_NOFOLLOW`` at each step, the
change made through an ``O_PATH`` descriptor of the inode it checked), so a process racing it
cannot point it outside the workspace.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_USER = "cox-sandbox"
MAX_DEPTH = 1024
"""A folder deeper than this is closed (mode 0, the runner's) instead of walked."""
SPECIAL = stat.S_ISUID | stat.S_ISGID


class SandboxUserMissing(LookupError):
    """The configured sandbox user does not exist on this host (or is root)."""


@dataclass(frozen=True)
class Owner:
    uid: int
    gid: int
    name: str = ""


def dropping() -> bool:
    """Whether sandboxed processes run as the sandbox user (the runner is root)."""
    return os.geteuid() == 0


def lookup(name: str) -> Owner:
    """The sandbox user's uid and primary gid; raises :class:`SandboxUserMissing` when it does not
    exist or is privileged (uid or gid 0)."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        raise SandboxUserMissing(
            f"the sandbox user {name!r} does not exist: create it (useradd --system --no-create-home "
            f"--shell /usr/sbin/nologin {name}; ./dev and the image do) or set [sandbox] user") from None
    if pw.pw_uid == 0 or pw.pw_gid == 0:
        raise SandboxUserMissing(f"the sandbox user {name!r} is privileged (uid or gid 0)")
    return Owner(pw.pw_uid, pw.pw_gid, name)


def file_owner(name: str, mode: str = "bwrap") -> Owner | None:
    """Who a workspace file written by the runner or the versions service must belong to: the
    sandbox user when this process is root and commands are confined (``[sandbox] mode``); None
    when it is not root, commands run bare, or the user is missing (then no sandboxed process can
    run either)."""
    if not dropping() or mode != "bwrap":
        return None
    try:
        return lookup(name)
    except SandboxUserMissing:
        return None


@dataclass
class Settled:
    """What one :func:`settle` walk did."""

    entries: int = 0
    chowned: int = 0
    stripped: int = 0
    linked: list[str] = field(default_factory=list)
    """Files left alone: not the sandbox user's and hard-linked elsewhere (at most 20 named)."""
    closed: list[str] = field(default_factory=list)
    """Folders deeper than MAX_DEPTH, closed instead of walked."""


def _fix(dfd: int, name: str, owner: Owner | None, st: os.stat_result, out: Settled) -> None:
    """Hand one entry to ``owner`` and clear its setuid/setgid bits, through an ``O_PATH``
    descriptor whose inode is checked again (a name swapped meanwhile is judged afresh)."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if stat.S_ISLNK(st.st_mode):  # a link only changes hands (lchown), never its target
            if owner is not None and st.st_uid != owner.uid:
                with contextlib.suppress(OSError):
                    os.chown(name, owner.uid, owner.gid, dir_fd=dfd, follow_symlinks=False)
                    out.chowned += 1
            return
        mine = owner is None or st.st_uid == owner.uid
        if not mine and not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
            if len(out.linked) < 20:
                out.linked.append(name)
            return
        proc = f"/proc/self/fd/{fd}"
        if owner is not None and (st.st_uid != owner.uid or st.st_gid != owner.gid):
            os.chown(proc, owner.uid, owner.gid)
            out.chowned += 1
            st = os.fstat(fd)
        if st.st_mode & SPECIAL:
            os.chmod(proc, stat.S_IMODE(st.st_mode) & ~SPECIAL)
            out.stripped += 1
    except OSError:
        pass
    finally:
        os.close(fd)


def _needs(st: os.stat_result, owner: Owner | None) -> bool:
    if st.st_mode & SPECIAL and not stat.S_ISLNK(st.st_mode):
        return True
    return owner is not None and (st.st_uid != owner.uid or st.st_gid != owner.gid)


def settle(root: Path | str, store_dir: str, owner: Owner | None) -> Settled:
    """Walk the workspace ``root`` (its top-level ``store_dir`` left out): every entry handed to
    ``owner`` (when given) and no setuid/setgid bit left anywhere."""
    out = Settled()
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    top = os.open(os.path.realpath(root), flags)
    st = os.fstat(top)
    if _needs(st, owner):
        proc = f"/proc/self/fd/{top}"
        with contextlib.suppress(OSError):
            if owner is not None and (st.st_uid != owner.uid or st.st_gid != owner.gid):
                os.chown(proc, owner.uid, owner.gid)
                out.chowned += 1
            if os.fstat(top).st_mode & SPECIAL:
                os.chmod(proc, stat.S_IMODE(st.st_mode) & ~SPECIAL)
                out.stripped += 1
    stack: list[tuple[int, os.DirEntry[str] | None, list[os.DirEntry[str]]]] = []
    try:
        stack.append((top, None, list(os.scandir(top))))
        while stack:
            dfd, _, entries = stack[-1]
            if not entries:
                stack.pop()
                if dfd != top:
                    os.close(dfd)
                continue
            e = entries.pop()
            if len(stack) == 1 and e.name == store_dir:
                continue
            out.entries += 1
            try:
                est = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if _needs(est, owner):
                _fix(dfd, e.name, owner, est, out)
            if not stat.S_ISDIR(est.st_mode):
                continue
            if len(stack) > MAX_DEPTH:
                _close_folder(dfd, e.name, out)
                continue
            try:
                sub = os.open(e.name, flags, dir_fd=dfd)
            except OSError:
                continue
            try:
                listing = list(os.scandir(sub))
            except OSError:
                os.close(sub)
                continue
            stack.append((sub, e, listing))
    finally:
        for dfd, _, _ in stack:
            if dfd != top:
                os.close(dfd)
        os.close(top)
    return out


def _close_folder(dfd: int, name: str, out: Settled) -> None:
    """A folder too deep to walk: the runner's, mode 0, so no other user reaches what is inside."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return
    try:
        os.chown(f"/proc/self/fd/{fd}", os.geteuid(), os.getegid())
        os.chmod(f"/proc/self/fd/{fd}", 0)
        out.closed.append(name)
    except OSError:
        pass
    finally:
        os.close(fd)
