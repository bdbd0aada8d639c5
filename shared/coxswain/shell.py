"""A shell command line as guard and the judge read it, with real parsers (bashlex, shlex).

:func:`parse` splits a line into its simple commands, the files it redirects output into, and
why it is more than simple commands joined by ``|``, ``&&``, ``||`` and ``;`` (substitutions,
compound statements, functions, assignments, background jobs); guard uses it for standing
prefixes and protected redirections, the rules judge for read-only verdicts.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any

import bashlex
import bashlex.errors

INPUT_REDIRECTS = frozenset({"<", "<<", "<<-", "<<<"})
SAFE_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
SUBSTITUTIONS = frozenset({"commandsubstitution", "processsubstitution"})
NESTED_SUBSTITUTION = ("$(", "`", "<(", ">(")
"""bashlex leaves a parameter expansion's text unparsed: ``${X:-$(cmd)}`` still runs ``cmd``."""


@dataclass
class Parsed:
    """The simple commands of a command line, or why it is not a plain list of them."""

    commands: list[list[str]] = field(default_factory=list)
    redirect_targets: list[str] = field(default_factory=list)
    """Files the command line writes through ``>``/``>>`` (``/dev/null`` and fd dups excluded)."""
    raw: list[list[str]] = field(default_factory=list)
    """Each command's words as written (quotes, ``$``, globs kept), parallel to ``commands``."""
    complex: str | None = None
    """Set when the line holds something beyond simple commands joined by ``|``, ``&&``, ``||``,
    ``;``: substitutions, compound statements, functions, assignments, backgrounding."""


def parse(command: str) -> Parsed:
    out = Parsed()
    try:
        trees = bashlex.parse(command)
    except (bashlex.errors.ParsingError, NotImplementedError, IndexError, AttributeError, TypeError) as exc:
        out.complex = f"could not parse the command: {exc}"
        return out
    for tree in trees:
        _walk(tree, out, command)
    return out


def _walk(node: Any, out: Parsed, source: str) -> None:
    kind = node.kind
    if kind in ("list", "pipeline"):
        for part in node.parts:
            _walk(part, out, source)
    elif kind == "operator":
        if node.op == "&":
            out.complex = out.complex or "runs something in the background"
    elif kind == "pipe":
        return
    elif kind == "command":
        _command(node, out, source)
    elif kind == "compound":
        out.complex = out.complex or "compound statements (if, for, while, subshells)"
    elif kind == "function":
        out.complex = out.complex or "defines a function"
    else:
        out.complex = out.complex or f"shell construct {kind}"


def _substitutes(node: Any) -> bool:
    """Does this word (or redirection target) run a command when the shell expands it?"""
    kind = getattr(node, "kind", "")
    if kind in SUBSTITUTIONS:
        return True
    if kind == "parameter" and any(t in str(getattr(node, "value", "")) for t in NESTED_SUBSTITUTION):
        return True
    return any(_substitutes(p) for p in getattr(node, "parts", None) or [])


def _command(node: Any, out: Parsed, source: str) -> None:
    words: list[str] = []
    raw: list[str] = []
    for part in node.parts:
        if part.kind == "word":
            if _substitutes(part):
                out.complex = out.complex or "command or process substitution"
            words.append(part.word)
            raw.append(source[part.pos[0]:part.pos[1]])
        elif part.kind == "redirect":
            target = getattr(part, "output", None)
            if _substitutes(target):
                out.complex = out.complex or "command or process substitution"
            heredoc = str(getattr(getattr(part, "heredoc", None), "value", ""))
            if any(t in heredoc for t in NESTED_SUBSTITUTION[:2]):
                out.complex = out.complex or "a here-document with a command substitution"
            word = getattr(target, "word", None)
            if isinstance(word, str) and word.startswith(("/dev/tcp/", "/dev/udp/")):
                out.complex = out.complex or "a redirection that opens a network connection"
            if part.type in INPUT_REDIRECTS or isinstance(target, int):
                continue
            if isinstance(word, str) and word not in SAFE_TARGETS:
                out.redirect_targets.append(word)
        elif part.kind == "assignment":
            out.complex = out.complex or "sets a variable"
        else:
            out.complex = out.complex or f"shell construct {part.kind}"
    if words:
        out.commands.append(words)
        out.raw.append(raw)


def words(command: str) -> list[str]:
    """The command's words as the shell would split them (quotes removed, operators apart)."""
    try:
        lex = shlex.shlex(command, posix=True, punctuation_chars=True)
        lex.whitespace_split = True
        return list(lex)
    except ValueError:
        return command.split()


def covered(command: str | Parsed, prefixes: list[str]) -> str | None:
    """The standing prefix that covers ``command`` (a line, or one already parsed), or None.

    A prefix covers a command only when the line is plain simple commands (no substitution,
    no redirection to a file, no background job) and *every* one of them starts with a standing
    prefix's words: ``git status; rm -rf x`` is not covered by ``git status``.
    """
    wanted = [p for p in (q.split() for q in prefixes) if p]
    if not wanted:
        return None
    parsed = parse(command) if isinstance(command, str) else command
    if parsed.complex or parsed.redirect_targets or not parsed.commands:
        return None
    first: str | None = None
    for cmd in parsed.commands:
        match = next((p for p in wanted if cmd[:len(p)] == p), None)
        if match is None:
            return None
        first = first or " ".join(match)
    return first
