"""The Lua library speaks the Python contract: no server needed.

The Redis functions (``redis_lib.lua``) build keys, events and error codes as plain strings. Each
of those must be one the Python side knows: a key suffix of :mod:`coxswain.keys`, an event type
of the union in :mod:`coxswain.events`, an error code the runner's store maps to a status and
the gateway maps to HTTP. A typo on either side shows here in seconds, not as a 500 in a slow test.
"""

from __future__ import annotations

import re
from pathlib import Path

from cox.chat_state import HANDLERS as CHAT
from cox_runner.redis import store
from coxswain import contract, errors, events, keys

LUA = (Path(__file__).resolve().parents[2] / "services/turn-runner/cox_runner/redis/redis_lib.lua").read_text()
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
