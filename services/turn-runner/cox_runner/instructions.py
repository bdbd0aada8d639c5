"""Project instructions: ``AGENTS.md`` at the workspace root, read for the model's instructions.

Read through :mod:`coxswain.safefs` (beneath the workspace, no link followed: a link named
``AGENTS.md`` is not read), at most :data:`MAX_BYTES` of it; a longer file is cut there (on a
character boundary) with a note saying so. The SHA-256 is of the text returned, so a caller can
tell whether what the model was given has changed.
"""

from __future__ import annotations

import asyncio
import codecs
import hashlib
import os
import stat
import time
from pathlib import Path

from coxswain import safefs
from coxswain.errors import CoxError

FILE = "AGENTS.md"
MAX_BYTES = 32 * 1024


def read_agents_md(root: Path | str, max_bytes: int = MAX_BYTES) -> tuple[str, str] | None:
    """``(text, sha256 hex of text)`` of the workspace's ``AGENTS.md``, or None when there is no
    such regular file (missing, a link, a folder) or it is empty."""
    try:
        data = safefs.read(root, FILE, max_bytes=max_bytes + 1)
    except (OSError, CoxError):
        return None
    if not data:
        return None
    if len(data) > max_bytes:
        head = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(data[:max_bytes], final=False)
        text = head + f"\n[... {FILE} is longer than {max_bytes} bytes: the rest is not shown]\n"
    else:
        text = data.decode("utf-8", errors="replace")
    return text, hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()


CACHED = 4096
"""Workspaces whose ``AGENTS.md`` is remembered (the oldest forgotten first)."""
RACY_S = 2.0
"""A file changed less than this long ago is read again every time: a write within the file
system's timestamp granularity could leave size and times as they were (git's "racy" case)."""
_cache: dict[str, tuple[tuple[int, ...], tuple[str, str]]] = {}


def _identity(root: Path | str) -> tuple[int, ...] | None:
    """What says the file is the one read before (device, inode, size, change times), or None
    when there is nothing to read: absent, a link, not a regular file, or empty."""
    try:
        st = os.lstat(os.path.join(root, FILE))
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


async def agents_md(root: Path | str | None) -> tuple[str, str] | None:
    """:func:`read_agents_md` as a turn starting now would see it, read off the event loop, and
    not read at all when the file is absent or has not changed since it was last read here (one
    ``lstat``: three reads per turn were 6% of a runner's CPU in the bench)."""
    if not root:
        return None
    key = str(root)
    identity = _identity(root)
    if identity is None:
        _cache.pop(key, None)
        return None
    hit = _cache.get(key)
    if hit is not None and hit[0] == identity:
        return hit[1]
    found = await asyncio.to_thread(read_agents_md, root)
    _cache.pop(key, None)
    if found is not None and time.time() - identity[3] / 1e9 > RACY_S:
        if len(_cache) >= CACHED:
            _cache.pop(next(iter(_cache)))
        _cache[key] = (identity, found)
    return found


async def agents_md_hash(root: Path | str | None) -> str:
    """The sha256 of the workspace's ``AGENTS.md`` as a turn starting now would read it, or ``""``
    (recorded in ``turn.start``)."""
    found = await agents_md(root)
    return found[1] if found else ""
