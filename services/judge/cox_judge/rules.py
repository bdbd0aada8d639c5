"""The ``rules`` judge: approve only commands that cannot change anything.

The command is parsed with a real shell parser (bashlex). It is approved only when every simple
command in it is a known read-only program (with its risky flags absent) and nothing writes:
no redirection to a file (``2>&1`` and ``>/dev/null`` are fine), no command or process
substitution, no compound statements, no assignments, no backgrounding.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from coxswain import shell

READ_ONLY: frozenset[str] = frozenset({
    "ls", "cat", "head", "tail", "wc", "grep", "egrep", "fgrep", "rg", "echo", "printf", "pwd", "which",
    "file", "stat", "du", "df", "sort", "uniq", "cut", "tr", "diff", "cmp", "true", "false", "date",
    "whoami", "id", "uname", "tree", "basename", "dirname", "realpath", "readlink", "md5sum", "sha1sum",
    "sha256sum", "nl", "sleep", "test", "[", "column", "comm", "fold", "expand", "rev", "seq", "jq",
    "find", "sed", "git", "python3", "python",
})
GIT_READ = frozenset({"status", "log", "diff", "show", "rev-parse", "ls-files", "blame", "branch", "describe",
                      "shortlog", "grep", "ls-tree", "cat-file", "remote", "tag"})
GIT_LISTING = frozenset({"-a", "--all", "-r", "--remotes", "-v", "-vv", "--verbose", "-l", "--list",
                         "--show-current", "--merged", "--no-merged", "--contains"})
"""The only flags ``git branch``/``tag``/``remote`` may carry: they list, never create or delete."""
FIND_WRITES = frozenset({"-exec", "-execdir", "-delete", "-ok", "-okdir", "-fprint", "-fprint0", "-fprintf", "-fls"})
WRITING_FLAGS: dict[str, tuple[str, ...]] = {
    "sort": ("-o", "--output", "--compress-program"),
    "tree": ("-o",),
    "rg": ("--pre",),
    "date": ("-s", "--set"),
    "file": ("-C", "--compile"),
    "git": ("--output", "--ext-diff", "--textconv", "-c", "--exec-path", "--git-dir", "--work-tree"),
}
"""Flags that make an otherwise read-only program write a file, set state or run another program."""
SED_PRINT = re.compile(r"^(?:\$|\d+)?(?:,(?:\$|\d+))?\s*[pdq=]?$")
SED_SUBST = re.compile(r"^s(?P<d>[/|#:,])(?:(?!(?P=d)).|\\.)*(?P=d)(?:(?!(?P=d)).|\\.)*(?P=d)[gpiI0-9]*$")


@dataclass
class Verdict:
    ok: bool
    reason: str


def judge(command: str) -> Verdict:
    parsed = shell.parse(command)
    if parsed.complex:
        return Verdict(False, f"{parsed.complex}: not judged read-only")
    if parsed.redirect_targets:
        return Verdict(False, f"redirects output to a file ({parsed.redirect_targets[0]})")
    problems: list[str] = []
    for words in parsed.commands:
        _command(words, problems)
        if problems:
            return Verdict(False, problems[0])
    return Verdict(True, "only read-only commands")


def _command(words: list[str], problems: list[str]) -> None:
    """Is one simple command (its words) a known read-only program without writing flags?"""
    prog = words[0].rsplit("/", 1)[-1]
    args = words[1:]
    if prog not in READ_ONLY:
        problems.append(f"{prog!r} is not a known read-only command")
        return
    bad_flag = next((a for a in args for f in WRITING_FLAGS.get(prog, ()) if a == f or a.startswith(f + "=")
                     or (len(f) == 2 and a.startswith(f) and not a.startswith("--"))), None)
    if bad_flag is not None:
        problems.append(f"{prog} {bad_flag} writes, sets state or runs another program")
    elif prog == "git" and (not args or args[0] not in GIT_READ):
        problems.append(f"'git {args[0] if args else ''}' may change the repository")
    elif prog == "git" and args[0] in ("branch", "tag", "remote") and any(a not in GIT_LISTING for a in args[1:]):
        problems.append(f"'git {' '.join(args[:2])}' may change the repository")
    elif prog == "find" and any(a in FIND_WRITES for a in args):
        problems.append("find with an action that writes or runs")
    elif prog == "sed":
        _sed(args, problems)
    elif prog == "uniq" and len([a for a in args if not a.startswith("-")]) > 1:
        problems.append("uniq with a second file name writes it")
    elif prog in ("python", "python3") and args not in (["--version"], ["-V"]):
        problems.append("python runs arbitrary code")


def _sed(args: list[str], problems: list[str]) -> None:
    """sed reads unless told to edit in place, read a script file, or run/write from its script."""
    scripts: list[str] = []
    i = 0
    positional = False
    while i < len(args):
        a = args[i]
        if a.startswith("-i") or a.startswith("--in-place") or a in ("-f", "--file") or a.startswith("--file="):
            problems.append("sed edits files in place or reads a script file")
            return
        if a in ("-e", "--expression") and i + 1 < len(args):
            scripts.append(args[i + 1])
            positional = True
            i += 2
            continue
        if a.startswith("--expression="):
            scripts.append(a.split("=", 1)[1])
            positional = True
        elif not a.startswith("-") and not positional:
            scripts.append(a)
            positional = True
        i += 1
    for script in scripts:
        for cmd in (c.strip() for c in script.split(";")):
            if cmd and not (SED_PRINT.match(cmd) or SED_SUBST.match(cmd)):
                problems.append(f"sed script {cmd!r} is not a plain print or substitution")
                return
