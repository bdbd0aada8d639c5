"""Line diffs of file contents, with the empty and oversized cases as flags, never as text."""

from __future__ import annotations

import difflib
from dataclasses import dataclass

MAX_DIFF_INPUT = 2_000_000
"""Bytes per side above which a comparison is not computed (``oversized``)."""


@dataclass(frozen=True)
class Diff:
    text: str
    added: int
    removed: int
    empty: bool
    oversized: bool
    binary: bool = False


def _lines(data: bytes | None) -> list[str] | None:
    if data is None:
        return []
    if b"\x00" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace").splitlines(keepends=True)


def diff(old: bytes | None, new: bytes | None, path: str = "file", max_input: int = MAX_DIFF_INPUT) -> Diff:
    """Unified diff old -> new. ``None`` means the file does not exist on that side."""
    if (old is not None and len(old) > max_input) or (new is not None and len(new) > max_input):
        return Diff("", 0, 0, empty=False, oversized=True)
    a, b = _lines(old), _lines(new)
    if a is None or b is None:
        same = old == new
        return Diff("", 0, 0, empty=same, oversized=False, binary=True)
    added = removed = 0
    out: list[str] = []
    for line in difflib.unified_diff(a, b, fromfile=f"a/{path}", tofile=f"b/{path}", n=3):
        out.append(line if line.endswith("\n") else line + "\n")
        if line.startswith("+") and not line.startswith("+++"):
            added += 1
        elif line.startswith("-") and not line.startswith("---"):
            removed += 1
    return Diff("".join(out), added, removed, empty=not out, oversized=False)


def counts(old: bytes | None, new: bytes | None) -> tuple[int, int]:
    d = diff(old, new)
    return d.added, d.removed
