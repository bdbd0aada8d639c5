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


async def agents_md_hash(root: Path | str | None) -> str:
    """The sha256 of the workspace's ``AGENTS.md`` as a turn starting now would read it, or ``""``
    (recorded in ``turn.start``; read off the event loop)."""
    if not root:
        return ""
    found = await asyncio.to_thread(read_agents_md, root)
    return found[1] if found else ""
