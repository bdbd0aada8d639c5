"""Command-line options read as the program reads them: GNU ``getopt_long`` and git's parse-options.

A :class:`Spec` is one program's option table: its short options (``"ab:c::"``, getopt's optstring:
``:`` takes a value, ``::`` an optional attached one) and its long options (name -> arity and the
option they are, so aliases share a key). :func:`parse` reads a command's words against it exactly
as ``getopt_long`` does (glibc ``posix/getopt.c``):

- short options cluster (``-rn``); a value is the rest of the word (``-ofile``) or the next word
  (``-o file``); an optional value is only ever attached (``-i.bak``);
- a long option takes its value after ``=`` or, if the value is required, as the next word;
- a long option is matched by its full name or by **every unambiguous prefix** of it: the exact
  name wins, else the names it begins; several that are not the same option are ambiguous;
- options and operands mix (getopt permutes) until ``--``; a lone ``-`` is an operand.

``abbrev=False`` (git's own parsers, find, jq, tree, rg): only full spellings are read; git's
parse-options does accept unique prefixes, but the judge resolves none, so an abbreviation is
never read-only (the person decides) and is named when it begins a dangerous option.

Anything :func:`parse` cannot read as a known option is a :class:`Refusal`: an unknown option, an
ambiguous prefix, a missing value, a value given to an option that takes none, and a detached value
that looks like an option (``--key --output=x``), so that an arity the table got wrong can never hide
an option from the checks that follow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

NONE, REQUIRED, OPTIONAL = 0, 1, 2
NUMBER = re.compile(r"^[-+]?\d+$")


@dataclass(frozen=True)
class Spec:
    short: str = ""
    """getopt's optstring: each letter an option, ``:`` after it a required value, ``::`` optional."""
    long: dict[str, tuple[int, str]] = field(default_factory=dict)
    """Long name -> (arity, key). Names with one key are one option (``--quiet``/``--silent``)."""
    abbrev: bool = True
    """Whether unambiguous prefixes of long names are read (GNU getopt_long) or only full names."""
    digits: bool = False
    """Whether ``-5`` (a number as an option: head, tail, grep, uniq, git log) is read."""
    bad: dict[str, str] = field(default_factory=dict)
    """Key -> why that option is never read-only (runs a program, writes a file, ...)."""

    def short_arity(self) -> dict[str, int]:
        out: dict[str, int] = {}
        s = self.short.lstrip("+-")
        i = 0
        while i < len(s):
            c = s[i]
            n = 0
            while i + 1 + n < len(s) and s[i + 1 + n] == ":":
                n += 1
            out[c] = {0: NONE, 1: REQUIRED}.get(n, OPTIONAL)
            i += 1 + n
        return out


@dataclass
class Option:
    key: str
    value: str | None
    word: str
    """How the command spelled it (for the reason shown to the person)."""


@dataclass
class Parsed:
    options: list[Option] = field(default_factory=list)
    operands: list[str] = field(default_factory=list)

    def has(self, *keys: str) -> bool:
        return any(o.key in keys for o in self.options)

    def values(self, *keys: str) -> list[str]:
        return [o.value for o in self.options if o.key in keys and o.value is not None]


@dataclass
class Refusal:
    reason: str


def resolve(spec: Spec, name: str) -> tuple[str, int] | Refusal:
    """The long option ``--name`` is, as getopt_long matches it (name without ``--`` and ``=``)."""
    if name in spec.long:
        arity, key = spec.long[name]
        return key, arity
    if not spec.abbrev:
        starts = sorted(n for n in spec.long if n.startswith(name) and spec.long[n][1] in spec.bad)
        if starts and name:
            return Refusal(f"--{name} abbreviates --{starts[0]}, which {spec.bad[spec.long[starts[0]][1]]}")
        return Refusal(f"unknown option --{name} (only full spellings are judged)")
    matches = sorted(n for n in spec.long if n.startswith(name))
    if not matches or not name:
        return Refusal(f"unknown option --{name}")
    if len({spec.long[n] for n in matches}) > 1:
        return Refusal(f"--{name} is ambiguous ({', '.join('--' + n for n in matches[:4])})")
    arity, key = spec.long[matches[0]]
    return key, arity


def parse(spec: Spec, args: list[str]) -> Parsed | Refusal:
    out = Parsed()
    shorts = spec.short_arity()
    i = 0
    while i < len(args):
        a = args[i]
        if a == "--":
            out.operands.extend(args[i + 1:])
            break
        if a.startswith("--"):
            name, eq, attached = a[2:].partition("=")
            found = resolve(spec, name)
            if isinstance(found, Refusal):
                return found
            key, arity = found
            value: str | None = None
            if eq:
                if arity == NONE:
                    return Refusal(f"{a}: --{name} takes no value")
                value = attached
            elif arity == REQUIRED:
                if i + 1 >= len(args):
                    return Refusal(f"{a} needs a value")
                i += 1
                value = args[i]
                if _looks_like_option(value):
                    return Refusal(f"the value of {a} looks like an option ({value})")
            out.options.append(Option(key, value, a))
        elif a.startswith("-") and a != "-":
            if spec.digits and NUMBER.match(a):
                out.options.append(Option("<number>", a[1:], a))
                i += 1
                continue
            j = 1
            while j < len(a):
                c = a[j]
                if c not in shorts and c in spec.bad:
                    return Refusal(f"-{c} {spec.bad[c]}")
                if c not in shorts:
                    return Refusal(f"unknown option -{c}" + (f" (in {a})" if len(a) > 2 else ""))
                arity = shorts[c]
                if arity == NONE:
                    out.options.append(Option(c, None, a))
                    j += 1
                    continue
                rest = a[j + 1:]
                if arity == REQUIRED and not rest:
                    if i + 1 >= len(args):
                        return Refusal(f"-{c} needs a value")
                    i += 1
                    rest = args[i]
                    if _looks_like_option(rest):
                        return Refusal(f"the value of -{c} looks like an option ({rest})")
                out.options.append(Option(c, rest or None, a))
                break
        else:
            out.operands.append(a)
        i += 1
    return out


def _looks_like_option(value: str) -> bool:
    return value.startswith("-") and value != "-" and not NUMBER.match(value)
