"""The ``rules`` judge: approve only commands that cannot change anything.

The command is parsed with a real shell parser (bashlex). It is approved only when every simple
command in it is a known read-only program (with its risky flags absent) and nothing writes:
no redirection to a file (``2>&1`` and ``>/dev/null`` are fine), no command or process
substitution, no compound statements, no assignments, no backgrounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import bashlex
import bashlex.errors

READ_ONLY: frozenset[str] = frozenset({
    "ls", "cat", "head", "tail", "wc", "grep", "egrep", "fgrep", "rg", "echo", "printf", "pwd", "which",
    "file", "stat", "du", "df", "sort", "uniq", "cut", "tr", "diff", "cmp", "true", "false", "date",
    "whoami", "id", "uname", "tree", "basename", "dirname", "realpath", "readlink", "md5sum", "sha1sum",
    "sha256sum", "nl", "sleep", "test", "[", "column", "comm", "fold", "expand", "rev", "seq", "jq",
    "find", "sed", "git", "python3", "python",
})
GIT_READ = frozenset({"status", "log", "diff", "show", "rev-parse", "ls-files", "blame", "branch", "describe",
                      "shortlog", "grep", "ls-tree", "cat-file", "remote", "tag"})
FIND_WRITES = frozenset({"-exec", "-execdir", "-delete", "-ok", "-okdir", "-fprint", "-fprint0", "-fprintf", "-fls"})
SAFE_TARGETS = frozenset({"/dev/null"})


@dataclass
class Verdict:
    ok: bool
    reason: str


def judge(command: str) -> Verdict:
    try:
        trees = bashlex.parse(command)
    except (bashlex.errors.ParsingError, NotImplementedError, IndexError, AttributeError) as exc:
        return Verdict(False, f"could not parse the command: {exc}")
    problems: list[str] = []
    for tree in trees:
        _walk(tree, problems)
    if problems:
        return Verdict(False, problems[0])
    return Verdict(True, "only read-only commands")


def _walk(node: Any, problems: list[str]) -> None:
    kind = node.kind
    if kind in ("list", "pipeline"):
        for part in node.parts:
            _walk(part, problems)
    elif kind == "operator":
        if node.op == "&":
            problems.append("runs something in the background")
    elif kind == "pipe":
        return
    elif kind == "command":
        _command(node, problems)
    elif kind == "compound":
        problems.append("compound statements (if, for, while, subshells) are not judged read-only")
    elif kind == "function":
        problems.append("defines a function")
    else:
        problems.append(f"unexpected shell construct: {kind}")


def _command(node: Any, problems: list[str]) -> None:
    words: list[str] = []
    for part in node.parts:
        if part.kind == "word":
            for sub in getattr(part, "parts", []) or []:
                if sub.kind in ("commandsubstitution", "processsubstitution"):
                    problems.append("uses command or process substitution")
                    return
            words.append(part.word)
        elif part.kind == "redirect":
            target = getattr(part, "output", None)
            if isinstance(target, int) or getattr(target, "word", None) in SAFE_TARGETS:
                continue
            if part.type in ("<", "<<<"):
                continue
            problems.append("redirects output to a file")
            return
        elif part.kind == "assignment":
            problems.append("sets a variable")
            return
        else:
            problems.append(f"unexpected shell construct: {part.kind}")
            return
    if not words:
        return
    prog = words[0].rsplit("/", 1)[-1]
    args = words[1:]
    if prog not in READ_ONLY:
        problems.append(f"{prog!r} is not a known read-only command")
    elif prog == "git" and (not args or args[0] not in GIT_READ):
        problems.append(f"'git {args[0] if args else ''}' may change the repository")
    elif prog == "find" and any(a in FIND_WRITES for a in args):
        problems.append("find with an action that writes or runs")
    elif prog == "sed" and any(a.startswith("-i") or a.startswith("--in-place") for a in args):
        problems.append("sed -i edits files")
    elif prog in ("python", "python3") and args not in (["--version"], ["-V"]):
        problems.append("python runs arbitrary code")
    elif prog == "git" and args[0] in ("branch", "tag", "remote") and len(args) > 1 and not args[1].startswith("-"):
        problems.append(f"'git {' '.join(args[:2])}' may change the repository")
