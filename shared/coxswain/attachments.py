"""Attachments: the bytes of a file a person sent with a message, kept content-addressed.

The gateway writes an upload's bytes once, as ``<root>/<store_dir>/attachments/<sha256>`` (an
atomic rename of a finished temporary file, so a reader never sees half a blob and two uploads
of the same content share one file); the runner records the attachment in the session's
``:att`` hash and, once a message names it, in that message's ``user.msg``. The folder is
beside the workspaces, never inside one: no command of any session can read or change it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

FOLDER = "attachments"
KEPT = "kept"
"""``<folder>/kept/<sha256>``: an empty file for each blob a message named (kept for good)."""
COLLECT_GRACE_S = 600
"""How much longer than ``ttl_s`` an unnamed blob stays: room for a send that named it just
before its upload expired to mark it kept."""
TEXT_TYPES = ("application/json", "application/xml", "application/toml", "application/yaml",
              "application/x-yaml", "application/javascript", "application/x-sh")

Kind = Literal["image", "text", "file"]


def folder(root: Path | str, store_dir: str) -> Path:
    return Path(root) / store_dir / FOLDER


def blob(root: Path | str, store_dir: str, sha256: str) -> Path:
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise ValueError("not a sha256")
    return folder(root, store_dir) / sha256


def kind(media_type: str) -> Kind:
    """How the model gets it: an image part, the text itself, or a file in the workspace."""
    if media_type.startswith("image/"):
        return "image"
    if media_type.startswith("text/") or media_type in TEXT_TYPES:
        return "text"
    return "file"


def safe_name(name: str) -> str:
    """The file's base name with only harmless characters (for a path the model is told)."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    clean = re.sub(r"[^A-Za-z0-9._-]+", "_", base).strip("._") or "file"
    return clean[:120]


def keep(root: Path | str, store_dir: str, chunks: Iterable[bytes]) -> tuple[str, int]:
    """Write ``chunks`` as a blob; answer its sha256 and size (blocking: run it in a thread)."""
    d = folder(root, store_dir)
    ensure_kept(root, store_dir)  # before the first blob: only blobs from before marks get marked
    h = hashlib.sha256()
    size = 0
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".up-")
    try:
        with os.fdopen(fd, "wb") as f:
            for c in chunks:
                h.update(c)
                size += len(c)
                f.write(c)
            f.flush()
            os.fsync(f.fileno())
        sha = h.hexdigest()
        os.replace(tmp, d / sha)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return sha, size



# ---------------------------------------------------------------- what is kept, and collecting the rest
#
# A blob is *named* once a message carries it (``user.msg``): from then on the log names it, so
# it is kept for good (:func:`mark_kept`, before the send is recorded: a send that fails leaves a
# blob kept that need not be, never the reverse). A blob no message named is an upload whose
# record expires ``ttl_s`` after it was made; the blob's mtime is its latest upload (an upload of
# the same content replaces the file), so once it is older than ``ttl_s`` + the grace no record
# that could still be named refers to it, and :func:`collect` removes it.


def kept_folder(root: Path | str, store_dir: str) -> Path:
    return folder(root, store_dir) / KEPT


def ensure_kept(root: Path | str, store_dir: str) -> Path:
    """The folder of kept marks, made on first use with a mark for every blob already there
    (those were kept before marks existed: a message may name any of them)."""
    d = folder(root, store_dir)
    kept = d / KEPT
    if kept.is_dir():
        return kept
    d.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=d, prefix=".kept-"))
    for p in d.iterdir():
        if _is_blob(p.name):
            (tmp / p.name).touch()
    try:
        os.rename(tmp, kept)
    except OSError:  # another process made it first (with the same marks)
        for p in tmp.iterdir():
            with contextlib.suppress(OSError):
                p.unlink()
        with contextlib.suppress(OSError):
            tmp.rmdir()
    return kept


def mark_kept(root: Path | str, store_dir: str, sha256s: Iterable[str]) -> None:
    """Mark these blobs named by a message: :func:`collect` never removes them (blocking)."""
    kept = ensure_kept(root, store_dir)
    for sha in sha256s:
        if re.fullmatch(r"[0-9a-f]{64}", sha):
            (kept / sha).touch()


def _is_blob(name: str) -> bool:
    return re.fullmatch(r"[0-9a-f]{64}", name) is not None


def collect(root: Path | str, store_dir: str, ttl_s: float, now: float, grace_s: float = COLLECT_GRACE_S) -> list[str]:
    """Remove the blobs no message named whose latest upload is older than ``ttl_s`` + the grace,
    and upload temporaries as old (a crashed upload's); answer the digests removed (blocking).

    Safe beside uploads: a blob is first renamed aside, then looked at again; one an upload
    replaced meanwhile (fresh) or a send marked meanwhile is put back (the same bytes: the name is
    their digest), else removed. Safe beside other runners doing the same (each rename is atomic)."""
    d = folder(root, store_dir)
    if not d.is_dir():
        return []  # nothing was ever uploaded: make no folder under the root (keep() makes it)
    kept = ensure_kept(root, store_dir)
    limit = now - ttl_s - grace_s
    removed: list[str] = []
    for p in d.iterdir():
        name = p.name
        try:
            if name.startswith(".up-") and p.stat().st_mtime < limit:
                p.unlink()
                continue
            if not _is_blob(name) or (kept / name).exists() or p.stat().st_mtime >= limit:
                continue
            aside = d / f".gc-{name}-{os.getpid()}"
            os.rename(p, aside)
        except OSError:
            continue  # gone meanwhile (another runner), or a stat that raced an upload: next pass
        try:
            if aside.stat().st_mtime >= limit or (kept / name).exists():
                os.replace(aside, p)  # an upload or a send came in between: it stays
            else:
                aside.unlink()
                removed.append(name)
        except OSError:
            continue
    return removed
