"""``edit_file``'s exact-text replacement, as one pure function that guard and the runner share.

Guard computes the write's preview with it (from the file as it is when the call is checked); the
runner computes the content it writes with it (from the file as it is when the call runs). Both
see the same rules, so a preview never shows an edit the runner would refuse, or the other way.

The rules: ``old`` must occur in the file exactly once, or exactly ``count`` times when ``count``
is given (occurrences do not overlap, as :meth:`str.replace` counts them). Anything else changes
nothing and says how many occurrences there are and on which lines. A file with Windows line
endings is matched with ``\\r\\n`` when ``old`` holds plain ``\\n`` line breaks and does not match
as given.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_EDIT_BYTES = 2_000_000
"""A larger file is not edited (its preview could not be shown either: textdiff's input limit)."""
MAX_LINES_NAMED = 20
"""At most this many line numbers are named in an error."""


@dataclass(frozen=True)
class Edit:
    """The outcome of an edit: the new text, or why there is none.

    ``lines`` are the (1-based) lines of the old text where each occurrence of ``old`` starts,
    whether or not the edit applied; ``count`` is how many occurrences there are.
    """

    content: str | None
    error: str | None = None
    count: int = 0
    lines: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.content is not None

    def summary(self, path: str) -> str:
        """What the tool answers the model after the write."""
        if self.content is None:
            return f"Error: {self.error}"
        where = ", ".join(str(n) for n in self.lines[:MAX_LINES_NAMED])
        more = f" and {len(self.lines) - MAX_LINES_NAMED} more" if len(self.lines) > MAX_LINES_NAMED else ""
        noun = "occurrence" if self.count == 1 else "occurrences"
        return f"Edited {path}: replaced {self.count} {noun} (line{'s' if self.count > 1 else ''} {where}{more})."


def line_of(text: str, index: int) -> int:
    """The 1-based line that character ``index`` of ``text`` is on (lines end with ``\\n``)."""
    return text.count("\n", 0, index) + 1


def occurrences(text: str, old: str) -> list[int]:
    """Where ``old`` starts in ``text``, left to right, without overlaps."""
    out: list[int] = []
    if not old:
        return out
    i = text.find(old)
    while i >= 0:
        out.append(i)
        i = text.find(old, i + len(old))
    return out


def _named(lines: list[int]) -> str:
    shown = ", ".join(str(n) for n in lines[:MAX_LINES_NAMED])
    if len(lines) > MAX_LINES_NAMED:
        shown += f", ... ({len(lines) - MAX_LINES_NAMED} more)"
    return shown


def apply_edit(current: str, old: str, new: str, count: int | None = None, path: str = "the file") -> Edit:
    """Replace ``old`` by ``new`` in ``current``: exactly one occurrence, or exactly ``count``."""
    if not old:
        return Edit(None, "old must not be empty (to create or replace a whole file, use write_file)")
    if old == new:
        return Edit(None, "old and new are the same: nothing would change")
    if count is not None and count < 1:
        return Edit(None, "count must be at least 1")
    found = occurrences(current, old)
    if not found and "\r\n" in current and "\r" not in old and "\n" in old:
        crlf_old, crlf_new = old.replace("\n", "\r\n"), new.replace("\r\n", "\n").replace("\n", "\r\n")
        if occurrences(current, crlf_old):
            return apply_edit(current, crlf_old, crlf_new, count, path)
    lines = [line_of(current, i) for i in found]
    n = len(found)
    if n == 0:
        return Edit(None, f"old was not found in {path} (it must match exactly, including whitespace "
                          "and indentation); read the file again to see its current text", 0, [])
    want = 1 if count is None else count
    if n != want:
        if count is None:
            why = (f"old occurs {n} times in {path} (at lines {_named(lines)}); include more of the "
                   f"surrounding text so it occurs once, or give count={n} to replace every occurrence")
        else:
            why = (f"old occurs {n} time{'s' if n != 1 else ''} in {path} (at line{'s' if n != 1 else ''} "
                   f"{_named(lines)}), not {count}; nothing was changed")
        return Edit(None, why, n, lines)
    return Edit(current.replace(old, new), None, n, lines)


def edit_bytes(current: bytes | None, old: str, new: str, count: int | None = None,
               path: str = "the file") -> Edit:
    """:func:`apply_edit` on a file's bytes (None: it does not exist). The file must be UTF-8
    text no larger than :data:`MAX_EDIT_BYTES`; its other bytes are never re-encoded."""
    if current is None:
        return Edit(None, f"no file {path!r} (edit_file changes an existing file; use write_file to create one)")
    if len(current) > MAX_EDIT_BYTES:
        return Edit(None, f"{path} is larger than {MAX_EDIT_BYTES} bytes: edit_file does not edit it")
    try:
        text = current.decode("utf-8")
    except UnicodeDecodeError:
        return Edit(None, f"{path} is not UTF-8 text: edit_file cannot edit it")
    return apply_edit(text, old, new, count, path)
