"""Walking a workspace for ``find_files`` and ``search_text``: beneath the root, as git sees it.

Every folder is opened relative to its parent's descriptor without following links (as
:mod:`coxswain.safefs` does), so a link never leads the walk out of the workspace; links are
not followed at all. ``.gitignore`` files at any depth apply with git's semantics (the
``pathspec`` package): a deeper file's rules win over a shallower one's, ``!`` re-includes, and
nothing inside an ignored folder is visited. ``.git`` folders (at any depth), the versions store
folder and paths on the credential denylist are never visited, whatever the rules say.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from coxswain import safefs
from coxswain.errors import CoxError, Invalid

if TYPE_CHECKING:
    import pathspec

MAX_ENTRIES = 50_000
"""A walk stops after looking at this many entries (files and folders)."""
MAX_GITIGNORE_BYTES = 256_000


@dataclass
class Walk:
    """The files a walk found, and whether it stopped early."""

    files: list[str] = field(default_factory=list)
    truncated: bool = False
    seen: int = 0


class _Rules:
    """The ``.gitignore`` files in force at one folder: (folder, spec), shallowest first."""

    def __init__(self, specs: tuple[tuple[str, pathspec.GitIgnoreSpec], ...] = ()) -> None:
        self.specs = specs

    def with_file(self, folder: str, text: str) -> _Rules:
        import pathspec  # by the first walk that meets a .gitignore, not by every runner at start

        spec = pathspec.GitIgnoreSpec.from_lines(text.splitlines())
        return _Rules((*self.specs, (folder, spec))) if len(spec) else self

    def ignored(self, rel: str, is_dir: bool) -> bool:
        for folder, spec in reversed(self.specs):
            sub = rel[len(folder) + 1:] if folder else rel
            result = spec.check_file(sub + "/" if is_dir else sub)
            if result.include is not None:
                return bool(result.include)
        return False


def never(rel: str, store_dir: str) -> bool:
    """Paths no walk visits: ``.git`` at any depth, the store folder, the credential denylist."""
    parts = rel.split("/")
    return ".git" in parts or rel == store_dir or rel.startswith(store_dir + "/") or bool(safefs.denied(rel))


def _read_gitignore(dfd: int) -> str | None:
    try:
        fd = os.open(".gitignore", os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        return fh.read(MAX_GITIGNORE_BYTES).decode("utf-8", errors="replace")


def rules_above(root: Path | str, rel: str) -> _Rules:
    """The rules that decide about ``rel``: the ``.gitignore`` of every folder that holds it."""
    rules = _Rules()
    parts = [p for p in rel.split("/") if p]
    for depth in range(len(parts)):
        folder = "/".join(parts[:depth])
        try:
            with safefs.open_dir(root, folder) as dfd:
                text = _read_gitignore(dfd)
        except (OSError, CoxError):
            break
        if text is not None:
            rules = rules.with_file(folder, text)
    return rules


def ignored(root: Path | str, rel: str, is_dir: bool) -> bool:
    """Whether git would ignore ``rel`` (by the ``.gitignore`` files above it)."""
    if not rel:
        return False
    parent = rel.rsplit("/", 1)[0] if "/" in rel else ""
    # A path inside an ignored folder is ignored whatever its own rules say (git never looks in).
    if parent and ignored(root, parent, True):
        return True
    return rules_above(root, rel).ignored(rel, is_dir)


def walk(root: Path | str, start: str = "", store_dir: str = ".coxswain", *, use_ignore: bool = True,
         max_entries: int = MAX_ENTRIES) -> Walk:
    """Every regular file beneath the folder ``start`` (relative to the root), sorted by path.

    ``use_ignore=False`` skips the rules of the folders above ``start`` (a folder named on
    purpose is searched even when it is ignored); the ``.gitignore`` files inside it still apply.
    """
    out = Walk()
    try:
        base = rules_above(root, start) if use_ignore else _Rules()
        with safefs.open_dir(root, start) as top:
            for rel in _files(top, start, base, store_dir, out, max_entries):
                out.files.append(rel)
    except FileNotFoundError as exc:
        raise Invalid(f"no folder {start or '.'!r}") from exc
    except NotADirectoryError as exc:
        raise Invalid(f"{start!r} is not a folder") from exc
    return out


def _files(dfd: int, rel: str, rules: _Rules, store_dir: str, out: Walk, max_entries: int) -> Iterator[str]:
    text = _read_gitignore(dfd)
    if text is not None:
        rules = rules.with_file(rel, text)
    for entry in sorted(os.scandir(dfd), key=lambda e: e.name):
        if out.seen >= max_entries:
            out.truncated = True
            return
        out.seen += 1
        path = f"{rel}/{entry.name}" if rel else entry.name
        try:
            is_dir = entry.is_dir(follow_symlinks=False)
            is_file = entry.is_file(follow_symlinks=False)
        except OSError:
            continue
        if never(path, store_dir) or rules.ignored(path, is_dir):
            continue
        if is_file:
            yield path
        elif is_dir:
            try:
                sub = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EACCES, errno.ENOENT):
                    continue
                raise
            try:
                yield from _files(sub, path, rules, store_dir, out, max_entries)
            finally:
                os.close(sub)
            if out.truncated:
                return


def open_file(root: Path | str, rel: str) -> int | None:
    """A descriptor of the regular file ``rel`` opened beneath the root without following links,
    or None when it is not one (gone, a link, a folder)."""
    dirs, _, name = rel.rpartition("/")
    try:
        with safefs.open_dir(root, dirs) as dfd:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except (OSError, CoxError):  # gone, or a link swapped in (safefs refuses it): skip the file
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd
