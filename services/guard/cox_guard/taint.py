"""Taint: a command built from text the turn read in a tool result is a security confirm.

The rule (docs/design.md, "Policy"; a prompt injection in a file or a command's output must not become a
command nobody looked at):

1. Sources: the output of ``read_file`` and ``run_command`` in the running turn (the runner
   sends their whitespace-separated fragments). ``list_dir`` is not a source: the names in the
   folder are exactly what the model needs to build commands, and they are checked as paths.
2. Pieces of the command: its shell words (quotes removed, operators apart), each also split at
   ``=``, ``,`` and ``::`` (so ``--url=X``, ``a,b`` and ``file.py::test`` are looked at part
   by part).
3. A piece counts when it is at least 8 characters long and *significant*: it holds a character
   that does something in a URL, a path or a shell (``/ : @ $ | ; & < > ` \\ ( ) { } % ? # ~ * !``),
   or two dots (a host or file name with an extension chain), or it is 20 characters or longer
   (keys, tokens, hashes). Plain words and identifiers under 20 characters (``development``,
   ``install_requires``) are not taint: they carry no instruction by themselves.
4. A counted piece is tainted when it occurs inside a fragment of tool output, unless
   - it is in the person's own words (their messages, Leads and approval messages in this
     session; a ``script`` block stands for the model's answers, not the person's, and is not
     included), or
   - it names something that exists in the workspace (``src/app.py``, ``./tests``): such a name
     is what ``list_dir`` would show anyway.

An MCP call's arguments are checked the same way (:func:`find_in_args`): every string in them,
split at whitespace, is looked at piece by piece.

Known false positives, accepted because the person is asked rather than refused: a ref or
version read from output and used again (``origin/main`` after ``git branch -a``), a file name
a README mentions that does not exist yet.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from coxswain import safefs, shell
from coxswain.errors import CoxError

MIN_LEN = 8
LONG = 20
SIGNIFICANT = frozenset("/:@$|;&<>`\\(){}%?#~*!")
SPLIT = re.compile(r"=|,|::")
MAX_PIECES = 512


def significant(piece: str) -> bool:
    if len(piece) < MIN_LEN:
        return False
    return len(piece) >= LONG or piece.count(".") >= 2 or any(c in SIGNIFICANT for c in piece)


def pieces(command: str) -> list[str]:
    out: list[str] = []
    for word in shell.words(command):
        for piece in SPLIT.split(word):
            if significant(piece) and piece not in out:
                out.append(piece)
                if len(out) >= MAX_PIECES:
                    return out
    return out


def _exists(root: Path, piece: str) -> bool:
    try:
        rel = safefs.resolve(root, piece)
    except CoxError:
        return False
    return os.path.lexists(root / rel) if rel else True


def find_in_args(args: object, fragments: list[str], trusted: list[str], root: Path) -> str | None:
    """The first tainted piece of an MCP call's arguments (every string in them, at any depth,
    split at whitespace like a command's words), or None."""
    if not fragments:
        return None
    texts: list[str] = []

    def walk(value: object) -> None:
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, list):
            for v in value:
                walk(v)

    walk(args)
    corpus = "\n".join(fragments)
    person = "\n".join(trusted)
    seen = 0
    for text in texts:
        for word in text.split():
            for piece in SPLIT.split(word.strip("'\"`")):
                if not significant(piece):
                    continue
                seen += 1
                if seen > MAX_PIECES:
                    return None
                if piece in corpus and piece not in person and not _exists(root, piece):
                    return piece
    return None


def find(command: str, fragments: list[str], trusted: list[str], root: Path) -> str | None:
    """The first tainted piece of ``command``, or None."""
    if not fragments:
        return None
    corpus = "\n".join(fragments)
    person = "\n".join(trusted)
    for piece in pieces(command):
        if piece not in corpus or piece in person:
            continue
        if _exists(root, piece):
            continue
        return piece
    return None
