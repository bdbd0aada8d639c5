"""The ``rules`` judge: approve only commands that cannot change anything.

The command is parsed with a real shell parser (bashlex, :mod:`coxswain.shell`). It is approved
only when nothing in it writes (no redirection to a file: ``2>&1`` and ``>/dev/null`` are fine; no
command or process substitution, also not inside ``${...}`` or a here-document; no compound
statement, assignment or background job) and every simple command is a known read-only program
whose words, read the way that program reads them (:mod:`cox_judge.options`, tables in
:mod:`cox_judge.programs`), hold only options it knows and none that runs a program, writes a file
or sets state. An option the table does not know, an ambiguous or unproven abbreviation, a word the
shell expands into something the judge cannot see (``$_``, ``$X``, a glob that may name an option)
all send the command to the person. docs/design.md, "The rules judge parses options".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from coxswain import shell

from . import options, programs
from .options import Parsed, Refusal, Spec

SYSTEM_BIN = ("/usr/bin/", "/bin/", "/usr/local/bin/")
READ_ONLY: frozenset[str] = frozenset(
    set(programs.GNU) | programs.ANY_WORDS | {"find", "jq", "git", "tree", "rg", "python", "python3"})
GLOB_SAFE: frozenset[str] = frozenset(
    {p for p, s in programs.GNU.items() if not s.bad and p not in ("uniq", "date", "sed")}
    | programs.ANY_WORDS | {"jq"})
"""Programs where a shell pattern (``*``, ``?``, ``[..]``, ``{a,b}``) may expand to anything: every
option they have is harmless and they use any number of operands the same way. Elsewhere a file
named ``--output=x`` or ``-delete`` could become an option, or a second operand (``uniq a b`` writes
``b``) or a script (sed's first operand)."""
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
    for words, raw in zip(parsed.commands, parsed.raw, strict=True):
        problem = _command(words, raw)
        if problem:
            return Verdict(False, problem)
    return Verdict(True, "only read-only commands")


def _command(words: list[str], raw: list[str]) -> str | None:
    """Why one simple command (its words after quote removal, and as written) is not read-only."""
    prog = words[0]
    if "/" in prog:
        folder, _, prog = prog.rpartition("/")
        if folder + "/" not in SYSTEM_BIN:  # no ./sort, no /usr/bin/../../tmp/sort
            return f"{words[0]!r} is not a known read-only command (only the system's programs are)"
    if prog not in READ_ONLY:
        return f"{prog!r} is not a known read-only command"
    for word in raw[1:]:
        shape = _shape(word)
        if shape == "expands" and prog not in programs.ANY_WORDS:
            return f"{prog}: {word} is expanded by the shell ($_ is the last word of the command before), " \
                   "so the judge cannot see what the program gets"
        if shape == "pattern" and prog not in GLOB_SAFE:
            return f"{prog}: {word} is a pattern the shell expands; a file name could become an option or operand"
    args = words[1:]
    if prog in programs.ANY_WORDS:
        return None
    if prog == "git":
        return _git(args)
    if prog == "find":
        return _find(args)
    if prog == "jq":
        return _jq(args)
    if prog in ("python", "python3"):
        return None if args in (["--version"], ["-V"]) else "python runs arbitrary code"
    spec = programs.TREE if prog == "tree" else programs.RG if prog == "rg" else programs.GNU[prog]
    read = _read(prog, spec, args)
    if isinstance(read, str):
        return read
    if prog == "sed":
        return _sed(read)
    if prog == "uniq" and len(read.operands) > 1:
        return "uniq with a second file name writes it"
    if prog == "date" and any(not o.startswith("+") for o in read.operands):
        return "date with an operand that is not +FORMAT sets the clock"
    return None


def _read(prog: str, spec: Spec, args: list[str]) -> Parsed | str:
    """The command's options and operands as ``prog`` reads them, or why they are not read-only."""
    read = options.parse(spec, args)
    if isinstance(read, Refusal):
        return f"{prog}: {read.reason}"
    for o in read.options:
        if o.key in spec.bad:
            return f"{prog} {o.word}: {spec.bad[o.key]}"
    return read


def _shape(raw: str) -> str | None:
    """``expands`` if the shell substitutes into this word as written, ``pattern`` if it is a glob or
    brace pattern, else None. Quoted and backslash-escaped characters are literal."""
    quote = ""
    escaped = False
    pattern = False
    for i, ch in enumerate(raw):
        if escaped:
            escaped = False
        elif quote == "'":
            quote = "" if ch == "'" else quote
        elif ch == "\\":
            escaped = True
        elif ch == "$":
            return "expands"
        elif quote == '"':
            quote = "" if ch == '"' else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "*?[":
            pattern = True
        elif ch == "{" and re.search(r",|\.\.", raw[i:]):
            pattern = True
    return "pattern" if pattern else None


def _git(args: list[str]) -> str | None:
    if args == ["--version"]:
        return None
    i = 0
    while i < len(args) and args[i].startswith("-"):
        if args[i] not in programs.GIT_GLOBAL:
            return f"git {args[i]} before the subcommand is not judged read-only " \
                   "(-c, -C, --git-dir, --exec-path, -p and the like can run programs or read another repository)"
        i += 1
    if i >= len(args):
        return "'git' without a subcommand is not judged read-only"
    sub, rest = args[i], args[i + 1:]
    spec = programs.GIT.get(sub)
    if spec is None:
        return f"'git {sub}' may change the repository (or is an alias)"
    read = _read(f"git {sub}", spec, rest)
    if isinstance(read, str):
        return read
    # Operands are patterns only in list mode; git before 2.20 read ``branch -l`` as --create-reflog.
    listing = any(o.word == "--list" for o in read.options) if sub == "branch" else sub == "tag" and read.has("l")
    if sub in programs.GIT_LISTS and read.operands and not listing:
        return f"'git {sub} {read.operands[0]}' may change the repository (only listing is read-only)"
    return None


def _find(args: list[str]) -> str | None:
    i = 0
    while i < len(args) and (args[i] in programs.FIND_OPTIONS or args[i].startswith(("-D", "-O"))):
        if args[i] == "-D":
            i += 1
        i += 1
    while i < len(args) and not args[i].startswith("-") and args[i] not in ("(", "!", ")", ","):
        i += 1  # starting points
    while i < len(args):
        a = args[i]
        if a in programs.FIND_BAD:
            return f"find {a}: {programs.FIND_BAD[a]}"
        if a in programs.FIND_TESTS_0:
            i += 1
        elif a in programs.FIND_TESTS_1 or re.match(r"^-newer[aBcmt][aBcmt]$", a):
            if i + 1 >= len(args):
                return f"find {a} needs a value"
            if args[i + 1] in programs.FIND_BAD:
                return f"find {a} {args[i + 1]}: {programs.FIND_BAD[args[i + 1]]}"
            i += 2
        else:
            return f"find: {a} is not a test or action the judge knows"
    return None


def _jq(args: list[str]) -> str | None:
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            return None
        if a in programs.JQ_VALUES:
            i += 1 + programs.JQ_VALUES[a]
            continue
        if a.startswith("-L") and len(a) > 2:
            i += 1
            continue
        if a.startswith("-") and a != "-" and not (a in programs.JQ_FLAGS or (a[1:2] != "-"
                                                    and all(f"-{c}" in programs.JQ_FLAGS for c in a[1:]))):
            return f"jq: unknown option {a}"
        i += 1
    return None


def _sed(read: Parsed) -> str | None:
    """sed reads unless its script writes, runs or reads: only prints, deletes and substitutions are."""
    scripts = read.values("e")
    if not read.has("e"):
        if not read.operands:
            return None
        scripts = [read.operands[0]]
    for script in scripts:
        for cmd in (c.strip() for c in script.split(";")):
            if cmd and not (SED_PRINT.match(cmd) or SED_SUBST.match(cmd)):
                return f"sed script {cmd!r} is not a plain print or substitution"
    return None
