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
    d.mkdir(parents=True, exist_ok=True)
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

