"""Reading the Redis library (``cox_runner/redis/redis_lib.lua``) with no Lua at hand: just enough of
the language for how the library is written, for the fast contract tests (test_fns.py,
test_contract.py). Each reader asserts when the source is not as it expects, and
test_fns.py::test_the_parser_reads_what_it_must checks it finds what it should: a contract check
that passes is never a parser that found nothing."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LUA = next((ROOT / "services/turn-runner/cox_runner").rglob("redis_lib.lua")).read_text()
"""The library's source, wherever in the runner's package it lives."""


def strip_comments(lua: str) -> str:
    """The source without its comments (a comment's apostrophe would open a string)."""
    lua = re.sub(r"--\[\[.*?\]\]", "", lua, flags=re.S)
    return re.sub(r"'(?:\\.|[^'\\\n])*'|\"(?:\\.|[^\"\\\n])*\"|--[^\n]*",
                  lambda m: "" if m.group(0).startswith("--") else m.group(0), lua)


SRC = strip_comments(LUA)
OPEN, CLOSE = "({[", ")}]"


def closing(text: str, i: int) -> int:
    """The index just past the bracket closing the one at ``text[i]`` (strings skipped)."""
    depth, quote, j = 0, "", i
    while j < len(text):
        c = text[j]
        if quote:
            if c == "\\":
                j += 1
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in OPEN:
            depth += 1
        elif c in CLOSE:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise ValueError(f"unbalanced: {text[i:i + 60]!r}")


def split_top(text: str) -> list[str]:
    """The comma-separated items of ``text`` at its top level (an argument list, a table)."""
    out: list[str] = []
    depth, quote, cur = 0, "", ""
    for c in text:
        if quote:
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in OPEN:
            depth += 1
        elif c in CLOSE:
            depth -= 1
        elif c == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
            continue
        cur += c
    if cur.strip():
        out.append(cur.strip())
    return out


def table_keys(ctor: str) -> tuple[set[str], set[str]]:
    """(the keys of a table constructor ``{ k = v, ... }``, those of them set to ``cjson.null``)."""
    ks, nulls = set(), set()
    for item in split_top(ctor.strip()[1:-1]):
        m = re.match(r"(\w+)\s*=(.*)", item, re.S)
        assert m, f"not a record table: {ctor!r}"
        ks.add(m.group(1))
        if m.group(2).strip() == "cjson.null":
            nulls.add(m.group(1))
    return ks, nulls


BODIES = dict(re.findall(r"local function (\w+)\(keys, args\)\n(.*?)\nend\n", SRC, re.S))
TAKES_KEYS = dict(re.findall(r"local function (\w+)\(keys, [^)]*\)\n(.*?)\nend\n", SRC, re.S))
"""Every local function handed the call's KEYS (the registered ones and the helpers they pass them to)."""
REGISTERED = dict(re.findall(r"redis\.register_function\('(\w+)', entry\((?:once\()?(\w+)\)?\)\)", SRC))
"""Every function the library registers -> its local function (each through ``entry``, which writes
the events it records; the transitions through ``once`` too)."""


def lua_argv(body: str) -> tuple[list[str], bool, list[str]]:
    """(the names the function reads its fixed ARGV slots into, in slot order; whether it reads a
    variable tail after them; what is wrong with how it reads them)."""
    named: dict[int, str] = {}
    for m in re.finditer(r"^[ \t]*local ([\w, ]+?)\s*=(?!=)[ \t]*", body, re.M):
        rhs, end = "", m.end()
        while True:  # a statement continues on the next line after a trailing comma or '='
            nl = body.find("\n", end)
            line = body[end:nl if nl >= 0 else None]
            rhs, end = rhs + " " + line, nl + 1
            if nl < 0 or (line.strip() and not line.rstrip().endswith(",")):
                break
        lhs = [n.strip() for n in m.group(1).split(",")]
        if rhs.strip() == "unpack(args)":
            named.update(enumerate(lhs, 1))
            continue
        for n, item in zip(lhs, split_top(rhs), strict=False):
            slots = re.findall(r"\bargs\[(\d+)\]", item)
            if len(slots) == 1:
                named[int(slots[0])] = n
    problems = []
    read = {int(i) for i in re.findall(r"\bargs\[(\d+)\]", body)}
    if read - set(named):
        problems.append(f"reads ARGV slot(s) {sorted(read - set(named))} into no named local")
    n = len(named)
    if sorted(named) != list(range(1, n + 1)):
        problems.append(f"names ARGV slots {sorted(named)}, not 1..{n}")
    for start in re.findall(r"\bfor \w+ = (\d+), #args", body):
        if int(start) != n + 1:
            problems.append(f"reads its tail from slot {start}, not right after its {n} named slots")
    return [named[i] for i in sorted(named)], "#args" in body, problems


def lua_keys(body: str) -> tuple[int | None, bool]:
    """(how many KEYS the function reads, None: as many as it is given; whether KEYS[1] is a
    session's hash, the base its other keys derive from)."""
    passed = [TAKES_KEYS[f] for f in re.findall(r"\b(\w+)\(keys\b", body) if f in TAKES_KEYS]
    if any("#keys" in b for b in [body, *passed]):
        return None, False
    read = {int(i) for b in [body, *passed] for i in re.findall(r"\bkeys\[(\d+)\]", b)}
    assert read == set(range(1, len(read) + 1)), f"KEYS read: {sorted(read)}"
    return len(read), bool(re.search(r"local base = keys\[1\]", body))


def lua_replies(fn: str) -> tuple[list[set[str]], set[str], bool] | None:
    """How the function answers: (the key set of each reply it can build but a refusal, the keys
    some reply sets to null, whether the head is an array of such records), or None when it
    answers a bare array (no JSON head)."""
    body = BODIES[REGISTERED[fn]]
    listed = re.search(r"return \{ cjson\.encode\((\w+)\) \}", body)
    if listed:
        v = listed.group(1)
        starts = [m.end() - 1 for m in re.finditer(rf"\b{v}\[#{v} \+ 1\] = \{{", body)]
        shapes = [table_keys(body[a:closing(body, a)]) for a in starts]
        return [k for k, _ in shapes], set().union(*(n for _, n in shapes)), True
    variants: list[set[str]] = []
    nulls: set[str] = set()

    def of_var(v: str, before: int | None = None) -> list[set[str]]:
        added = {m.group(1) for m in re.finditer(rf"\b{v}\.(\w+)\s*=(?!=)", body)
                 if before is None or m.start() < before}
        out = []
        for m in re.finditer(rf"\b{v}\s*=\s*\{{", body):
            ks, ns = table_keys(body[m.end() - 1:closing(body, m.end() - 1)])
            nulls.update(ns)
            out.append(ks | added)
        assert out, f"{fn}: no table is built for {v}"
        return out

    for m in re.finditer(r"\breply\(", body):
        arg = body[m.end():closing(body, m.end() - 1) - 1].strip()
        if arg.startswith("{"):
            ks, ns = table_keys(arg)
            variants.append(ks)
            nulls.update(ns)
        else:
            assert re.fullmatch(r"\w+", arg), f"{fn}: reply({arg})"
            variants.extend(of_var(arg))
    passed = re.search(r"with_pub\(base, owner, (\w+)\[1\]\)", body)
    if passed:  # the reply of another function of the library, called with this one's keys
        callee = re.search(rf"local {passed.group(1)} = (\w+)\(keys", body)
        assert callee, f"{fn}: whose reply is {passed.group(1)}?"
        other = lua_replies(next(k for k, v in REGISTERED.items() if v == callee.group(1)))
        assert other is not None
        variants.extend(other[0])
        nulls |= other[1]
    if "replayed(base" in body:  # a retry with a used client_id answers the reply kept then
        kept = re.search(r"'HSET', base \.\. ':cid', [^,]+, cjson\.encode\((\w+)\)\)", body)
        assert kept, f"{fn}: which reply does it keep for a replay?"
        variants.extend(k | {"replay"} for k in of_var(kept.group(1), before=kept.start()))
    if not variants:
        assert "cjson" not in body, f"{fn}: a JSON reply the test cannot read"
        return None
    return variants, nulls, False


def session_fields_lua() -> set[str]:
    """The fields of the session hash (``base``) the library reads or writes by name."""
    out = set()
    for m in re.finditer(r"redis\.call\('(HSET|HSETNX|HGET|HMGET|HDEL|HINCRBY|HINCRBYFLOAT|HEXISTS)', base,", SRC):
        args = split_top(SRC[m.start() + len("redis.call("):closing(SRC, m.start() + len("redis.call")) - 1])[2:]
        names = args[::2] if m.group(1) in ("HSET", "HSETNX", "HINCRBY", "HINCRBYFLOAT") else args
        out |= {a.strip("'") for a in names if re.fullmatch(r"'\w+'", a)}
    return out
