"""Line diffs of file contents, with the empty and oversized cases as flags, never as text.

:func:`diff` gives a unified diff plus numbered hunks: every line carries its number in the old
file and in the new one, so a client can show line numbers and ``+``/``-`` counts without
parsing diff text. :func:`preview` is the bounded form recorded with a write's approval.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

MAX_DIFF_INPUT = 2_000_000
"""Bytes per side above which a comparison is not computed (``oversized``)."""
MAX_PREVIEW_LINES = 1_000
MAX_PREVIEW_CHARS = 48_000
"""Bounds of a recorded preview's hunks; a larger diff is recorded as ``oversized`` with its counts."""
CONTEXT = 3


@dataclass(frozen=True)
class Line:
    op: str
    """``" "`` context, ``"+"`` added (new file), ``"-"`` removed (old file)."""
    old: int | None
    new: int | None
    text: str


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old_len: int
    new_start: int
    new_len: int
    lines: tuple[Line, ...]

    def to_json(self) -> dict[str, Any]:
        return {"old_start": self.old_start, "old_len": self.old_len, "new_start": self.new_start,
                "new_len": self.new_len,
                "lines": [{"op": ln.op, "old": ln.old, "new": ln.new, "text": ln.text} for ln in self.lines]}


@dataclass(frozen=True)
class Diff:
    text: str
    added: int
    removed: int
    empty: bool
    oversized: bool
    binary: bool = False
    hunks: tuple[Hunk, ...] = field(default_factory=tuple)


def _lines(data: bytes | None) -> list[str] | None:
    if data is None:
        return []
    if b"\x00" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace").splitlines(keepends=True)


def _hunks(a: list[str], b: list[str]) -> list[Hunk]:
    out: list[Hunk] = []
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for group in matcher.get_grouped_opcodes(CONTEXT):
        lines: list[Line] = []
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                for k in range(i2 - i1):
                    lines.append(Line(" ", i1 + k + 1, j1 + k + 1, a[i1 + k].rstrip("\r\n")))
                continue
            for k in range(i1, i2):
                lines.append(Line("-", k + 1, None, a[k].rstrip("\r\n")))
            for k in range(j1, j2):
                lines.append(Line("+", None, k + 1, b[k].rstrip("\r\n")))
        first, last = group[0], group[-1]
        old_len, new_len = last[2] - first[1], last[4] - first[3]
        # Unified-diff convention: a side of length 0 names the line before it.
        out.append(Hunk(first[1] + (1 if old_len else 0), old_len, first[3] + (1 if new_len else 0), new_len,
                        tuple(lines)))
    return out


def diff(old: bytes | None, new: bytes | None, path: str = "file", max_input: int = MAX_DIFF_INPUT) -> Diff:
    """Diff old -> new. ``None`` means the file does not exist on that side."""
    if (old is not None and len(old) > max_input) or (new is not None and len(new) > max_input):
        return Diff("", 0, 0, empty=False, oversized=True)
    a, b = _lines(old), _lines(new)
    if a is None or b is None:
        same = old == new
        return Diff("", 0, 0, empty=same, oversized=False, binary=True)
    hunks = _hunks(a, b)
    added = sum(1 for h in hunks for ln in h.lines if ln.op == "+")
    removed = sum(1 for h in hunks for ln in h.lines if ln.op == "-")
    text = []
    if hunks:
        text.append(f"--- a/{path}\n+++ b/{path}\n")
        for h in hunks:
            text.append(f"@@ -{h.old_start},{h.old_len} +{h.new_start},{h.new_len} @@\n")
            text.extend(f"{ln.op}{ln.text}\n" for ln in h.lines)
    return Diff("".join(text), added, removed, empty=not hunks, oversized=False, hunks=tuple(hunks))


def counts(old: bytes | None, new: bytes | None) -> tuple[int, int]:
    d = diff(old, new)
    return d.added, d.removed


def hunks_json(d: Diff, max_lines: int | None = None, max_chars: int | None = None) -> list[dict[str, Any]] | None:
    """The hunks as JSON, or None when they exceed the bounds (the caller flags ``oversized``)."""
    n = sum(len(h.lines) for h in d.hunks)
    chars = sum(len(ln.text) for h in d.hunks for ln in h.lines)
    if (max_lines is not None and n > max_lines) or (max_chars is not None and chars > max_chars):
        return None
    return [h.to_json() for h in d.hunks]


def preview(old: bytes | None, new: bytes | None, path: str) -> dict[str, Any]:
    """What a write is about to change, bounded for recording with its approval.

    ``created``/``deleted`` say a side is missing; ``empty``, ``oversized`` and ``binary`` are
    explicit flags. ``hunks`` is absent when oversized or binary.
    """
    d = diff(old, new, path)
    hunks = None if d.oversized or d.binary else hunks_json(d, MAX_PREVIEW_LINES, MAX_PREVIEW_CHARS)
    out: dict[str, Any] = {
        "path": path, "added": d.added, "removed": d.removed, "created": old is None and new is not None,
        "deleted": new is None and old is not None, "empty": d.empty, "binary": d.binary,
        "oversized": d.oversized or (hunks is None and not d.binary),
        "old_size": len(old) if old is not None else None, "new_size": len(new) if new is not None else None,
    }
    if hunks is not None:
        out["hunks"] = hunks
    return out
