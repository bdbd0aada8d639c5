"""The Lua library speaks the Python contract: no server needed.

The Redis functions (``redis_lib.lua``) build keys, events and error codes as plain strings. Each
of those must be one the Python side knows: a key suffix of :mod:`coxswain.keys`, an event type
of the union in :mod:`coxswain.events`, an error code the runner's store maps to a status and
the gateway maps to HTTP. A typo on either side shows here in seconds, not as a 500 in a slow test.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from cox.chat_state import HANDLERS as CHAT
from cox_runner.redis import store
from coxswain import contract, errors, events, keys
from tests.support.luasrc import session_fields_lua

ROOT = Path(__file__).resolve().parents[2]
LUA = (ROOT / "services/turn-runner/cox_runner/redis/redis_lib.lua").read_text()
SUFFIXES = {v for k, v in vars(keys).items() if k.isupper() and isinstance(v, str) and v.startswith(":")}


def test_every_key_suffix_the_lua_library_uses_is_a_python_key() -> None:
    used = set(re.findall(r"base \.\. '(:[a-z_]+)'", LUA))
    used |= set(re.findall(r"\['(:[a-z_]+)'\] = true", LUA))  # the suffixes cox_emit's ops may touch
    assert used, "the pattern found no key suffix: the test no longer reads the library"
    assert used <= SUFFIXES, f"key suffixes Lua uses that coxswain.keys lacks: {sorted(used - SUFFIXES)}"


def test_the_bucket_keys_are_the_same_strings() -> None:
    """Lua derives a bucket's indexes from a session key, and a session key from a bucket's index
    (takeover): both must be what coxswain.keys builds, all in the session's hash tag."""
    assert f"local LEASES_PREFIX = '{keys.LEASES_PREFIX}'" in LUA
    assert f"local DIRTY_PREFIX = '{keys.DIRTY_PREFIX}'" in LUA
    sid = "s_abc"
    b = keys.bucket(sid)
    assert keys.session(sid) == "cox:s:" + keys.tag(b) + ":" + sid
    assert "local base = 'cox:s:' .. tag .. ':' .. sid" in LUA
    assert keys.leases(b) == keys.LEASES_PREFIX + keys.tag(b) and keys.dirty(b) == keys.DIRTY_PREFIX + keys.tag(b)
    assert "string.match(key, '(%b{})')" in LUA


def test_a_session_and_its_bucket_share_one_cluster_slot() -> None:
    for sid in ("s_1", "s_zz9", "s_1m8nnadqc85sqddmdkhj9"):
        b = keys.bucket(sid)
        tags = {_hash_tag(k) for k in (keys.session(sid), keys.of(sid, keys.QUEUE), keys.leases(b), keys.dirty(b))}
        assert tags == {f"b{b}"}, sid
    assert len({keys.bucket(f"s_{i}") for i in range(2000)}) == keys.buckets(), "crc32 fills every bucket"


def _hash_tag(key: str) -> str:
    """What Redis Cluster hashes: the text between the first { and the } after it."""
    start = key.index("{")
    return key[start + 1:key.index("}", start)]


def test_every_event_the_lua_library_builds_is_in_the_union() -> None:
    built = set(re.findall(r"type = '([a-z_.]+)'", LUA))
    assert "turn.start" in built, "the pattern found no event: the test no longer reads the library"
    assert built <= events.EVENT_TYPES, f"events Lua builds that the union lacks: {sorted(built - events.EVENT_TYPES)}"


def test_every_error_code_the_lua_library_answers_has_a_status_and_a_class() -> None:
    codes = set(re.findall(r"refuse\('([a-z_]+)'", LUA))
    assert "busy" in codes, "the pattern found no refusal: the test no longer reads the library"
    unmapped = {c for c in codes if store._status(c) == 500}
    assert not unmapped, f"Lua error codes the runner's store maps to 500: {sorted(unmapped)}"
    for code in codes:
        err = errors.from_wire({"error": code, "detail": "x", "status": store._status(code)})
        assert err.code == code and err.status == store._status(code), code


def test_the_consoles_contract_module_is_current() -> None:
    """static/js/contract.js is what `python -m coxswain.contract` generates from coxswain.events."""
    path = Path(__file__).resolve().parents[2] / contract.PATH
    assert path.read_text() == contract.render(), (
        f"{contract.PATH} is stale: python -m coxswain.contract > {contract.PATH}")


def test_cox_chat_and_the_console_share_the_turn_end_contract() -> None:
    assert events.TURN_ENDING <= set(CHAT), "cox chat reads every event that ends a turn"
    assert set(events.OUTCOMES) == events.GOOD_OUTCOMES | events.BAD_OUTCOMES
    assert not events.bad_outcome("completed") and events.bad_outcome("crashed") and events.bad_outcome("new")


# ---------------------------------------------------------------------------------------------
# The session hash's fields

_HASH_CMDS = {"hget", "hset", "hsetnx", "hmget", "hdel", "hincrby", "hincrbyfloat", "hexists"}
_OPS = {"hset", "hsetnx", "hdel", "hincrby", "hincrbyfloat"}
_HASH_NAMES = {"h", "info"}
"""What the Python calls a session hash it read whole (HGETALL, or an archive's copy of it)."""


def _is_session_key(node: ast.AST, names: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in names
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "session"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "keys")


def _strs(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.List | ast.Tuple):
        return [x for e in node.elts for x in _strs(e)]
    return []


def session_fields_python() -> dict[str, set[str]]:
    """Field -> where the services or the shared package name a field of the session hash: a
    hash command on ``keys.session(...)`` (or a name bound to it in that function), a ``cox_emit``
    op on the hash (suffix ''; an f-string field by its constant prefix, ending in ``*``), a read of
    a hash read whole (``h`` or ``info``: ``.get("f")``, ``["f"]``)."""
    found: dict[str, set[str]] = {}

    def add(field: str, where: str) -> None:
        found.setdefault(field, set()).add(where)

    for path in sorted([*ROOT.glob("services/*/cox_*/**/*.py"), *ROOT.glob("shared/coxswain/**/*.py")]):
        tree = ast.parse(path.read_text())
        rel = str(path.relative_to(ROOT))
        for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]:
            bound = {t.id for n in ast.walk(fn) if isinstance(n, ast.Assign) and _is_session_key(n.value, set())
                     for t in n.targets if isinstance(t, ast.Name)}
            for n in ast.walk(fn):
                if not isinstance(n, ast.Call) or not isinstance(n.func, ast.Attribute) or not n.args:
                    continue
                cmd, args = n.func.attr, n.args
                if cmd == "execute_command" and _strs(args[0]):
                    cmd, args = _strs(args[0])[0].lower(), args[1:]
                if cmd in _HASH_CMDS and args and _is_session_key(args[0], bound):
                    fields = args[1:] if cmd in ("hmget", "hdel") else args[1:2]
                    for f in fields:
                        for name in _strs(f):
                            add(name, f"{rel}:{n.lineno}")
        for n in ast.walk(tree):
            if isinstance(n, ast.Tuple) and len(n.elts) == 4 and _strs(n.elts[0]) and _strs(n.elts[0])[0] in _OPS \
                    and _strs(n.elts[1]) == [""]:
                f = n.elts[2]
                if isinstance(f, ast.JoinedStr):
                    head = f.values[0]
                    assert isinstance(head, ast.Constant) and isinstance(head.value, str), \
                        f"{rel}:{n.lineno}: an op's field without a prefix"
                    add(f"{head.value}*", f"{rel}:{n.lineno}")
                for name in _strs(f):
                    add(name, f"{rel}:{n.lineno}")
            elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get" \
                    and isinstance(n.func.value, ast.Name) and n.func.value.id in _HASH_NAMES and n.args:
                for name in _strs(n.args[0]):
                    add(name, f"{rel}:{n.lineno}")
            elif isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id in _HASH_NAMES:
                for name in _strs(n.slice):
                    add(name, f"{rel}:{n.lineno}")
    return found


def test_every_field_of_the_session_hash_is_documented_and_used() -> None:
    lua = session_fields_lua()
    py = session_fields_python()
    assert {"seq", "busy", "principal"} <= lua and {"workspace", "plan", "usage_*"} <= set(py), \
        "the patterns found no field: the test no longer reads the code"
    documented = set(keys.SESSION_FIELDS)
    assert lua <= documented, f"session-hash fields the Lua library uses that keys.SESSION_FIELDS lacks: " \
                              f"{sorted(lua - documented)}"
    missing = {f: sorted(w) for f, w in py.items() if f not in documented and not (
        f.endswith("*") and any(d.startswith(f[:-1]) for d in documented))}
    assert not missing, f"session-hash fields the Python uses that keys.SESSION_FIELDS lacks: {missing}"
    unused = documented - lua - set(py)
    assert not unused, f"keys.SESSION_FIELDS documents fields nothing reads or writes: {sorted(unused)}"
    assert all(v.strip() and "\n" not in v for v in keys.SESSION_FIELDS.values()), "one line each"


# ---------------------------------------------------------------------------------------------
# Tests call the library through its facade

RAW_CALLS = {
    "tests/support/library.py": 2,
    # the facade on a real server: what Store.call sends, and the facade's own raw publishing calls
    "tests/redis/test_idempotent_library.py": 1,
    # a call without its transition id: no method sends one (the library must refuse it)
}
"""Where the tests call the library's functions without the facade (cox_runner.redis.fns), and how often."""


def test_the_tests_call_the_library_through_its_facade() -> None:
    found: dict[str, int] = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        n = len(re.findall(r"\.fcall\(|execute_command\(\s*['\"]FCALL", path.read_text(), re.I))
        if n:
            found[str(path.relative_to(ROOT))] = n
    assert found == RAW_CALLS, (
        f"raw calls of the library in tests/ (call it through cox_runner.redis.fns, e.g. tests/support/library.py; a call that "
        f"sends what no method would may stay raw with a comment saying why, counted in RAW_CALLS): {found}")
