"""The rules judge's option tables agree with the installed programs, prefix by prefix.

The judge resolves ``sort --comp`` to ``--compress-program`` because its table for sort holds
every long option sort has; if a table missed one, an abbreviation the judge reads as a harmless
option could be a different one to the program. This asks each installed GNU program itself (its
``getopt_long`` diagnostics, ``LC_ALL=C``) about every short letter, every one-letter long prefix
(``--s`` is unknown, ambiguous with the list of candidates, or one option) and every long option of
the table (known; takes a value exactly when the table says so), and compares with the judge.
Programs this machine lacks cannot be asked (skipped by name).
"""

from __future__ import annotations

import os
import re
import shutil
import string
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from cox_judge import options, programs

GETOPT = sorted(p for p, s in programs.GNU.items() if s.abbrev and p not in ("egrep", "fgrep"))


def _ask(prog: str, arg: str, cwd: Path) -> str:
    """What the program says about one argument: its first diagnostic line, or "" if it took it."""
    try:
        done = subprocess.run([prog, arg], cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=2, env={"LC_ALL": "C", "PATH": os.environ["PATH"], "HOME": str(cwd)})
    except subprocess.TimeoutExpired:
        return ""  # it accepted the option and is following a file (tail -f)
    for line in done.stderr.splitlines():
        if "option" in line:
            return line
    return ""


def _short(said: str) -> str:
    if "invalid option" in said:
        return "unknown"
    return "value" if "requires an argument" in said else "known"


def _long(said: str) -> tuple[str, frozenset[str]]:
    if "unrecognized option" in said:
        return "unknown", frozenset()
    if "is ambiguous" in said:
        return "ambiguous", frozenset(re.findall(r"'--([^']+)'", said.split("possibilities:", 1)[-1]))
    return ("value" if "requires an argument" in said else "known"), frozenset()


@pytest.mark.parametrize("prog", GETOPT)
def test_the_judge_reads_options_as_the_installed_program_does(prog: str, tmp_path: Path) -> None:
    if shutil.which(prog) is None:
        pytest.skip(f"{prog} is not installed here")
    spec = programs.GNU[prog]
    shorts = spec.short_arity()
    letters = string.ascii_letters + string.digits
    firsts = sorted({n[0] for n in spec.long} | set(string.ascii_lowercase))
    names = sorted(spec.long)
    with ThreadPoolExecutor(4) as pool:
        said_short = dict(zip(letters, pool.map(lambda c: _ask(prog, f"-{c}", tmp_path), letters), strict=True))
        said_first = dict(zip(firsts, pool.map(lambda c: _ask(prog, f"--{c}", tmp_path), firsts), strict=True))
        said_name = dict(zip(names, pool.map(lambda n: _ask(prog, f"--{n}", tmp_path), names), strict=True))
        said_eq = dict(zip(names, pool.map(lambda n: _ask(prog, f"--{n}=x", tmp_path), names), strict=True))
    wrong: list[str] = []
    for c in letters:
        mine = "unknown" if c not in shorts else "value" if shorts[c] == options.REQUIRED else "known"
        if _short(said_short[c]) != mine and mine != "unknown":  # a letter the table lacks is refused: safe
            wrong.append(f"-{c}: {prog} says {said_short[c]!r}, the table {mine}")
    for c in firsts:
        real, candidates = _long(said_first[c])
        found = options.resolve(spec, c)
        mine = ("ambiguous" if "ambiguous" in found.reason else "unknown") if isinstance(found, options.Refusal) \
            else ("value" if found[1] == options.REQUIRED else "known")
        if (real == "ambiguous") != (mine == "ambiguous") or (real == "unknown") != (mine == "unknown") \
                or not candidates <= set(spec.long):
            wrong.append(f"--{c}: {prog} says {said_first[c]!r}, the table {mine}")
    for n in names:
        real, _ = _long(said_name[n])
        arity = spec.long[n][0]
        if real in ("unknown", "ambiguous") or (real == "value") != (arity == options.REQUIRED):
            wrong.append(f"--{n}: {prog} says {said_name[n]!r}, the table arity {arity}")
        if ("doesn't allow an argument" in said_eq[n]) != (arity == options.NONE):
            wrong.append(f"--{n}=x: {prog} says {said_eq[n]!r}, the table arity {arity}")
    assert wrong == [], "\n".join(wrong)
