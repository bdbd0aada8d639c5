"""The Redis library's facade (cox_runner.redis.fns) against the library itself (no server: the Lua
source is parsed): one method per registered function; each sends the function's ARGV under the
names and in the order the function reads them into its locals, and as many KEYS as it reads;
the keys of every reply the function builds are those of the method's typed dict (a key some
reply leaves out is ``NotRequired``, one a reply sets to null may be None). A failure names the
function and the difference."""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from collections.abc import Callable
from typing import Any, NotRequired, get_args, get_origin, get_type_hints, is_typeddict

import pytest

from cox_runner.redis.faults import DropReplies, parse
from cox_runner.redis.fns import Fns
from cox_runner.redis.store import HOLDER_FNS, TX_FNS
from coxswain import keys
from tests.support.luasrc import BODIES, LUA, REGISTERED, lua_argv, lua_keys, lua_replies, session_fields_lua

# ---------------------------------------------------------------------------------------------
# Calling the facade with no server: what each method sends


class _Recorder:
    """Stands in for the Store and its Redis client: records what each method would send."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[str], list[str]]] = []
        """(function, KEYS, ARGV) of each call (ARGV without the store's transition id)."""
        self.redis = self

    async def call(self, fn: str, sid: str | None, args: list[Any], extra_keys: list[str] | None = None,
                   publish: bool = True, tx: str = "") -> dict[str, Any]:
        ks = ([keys.session(sid)] if sid is not None else []) + (extra_keys or [])  # as Store.call
        self.sent.append((fn, ks, [str(a) for a in args]))
        return {}

    async def fcall_raw(self, fn: str, ks: list[str], argv: list[str]) -> list[str]:
        self.sent.append((fn, ks, argv))
        return [json.dumps({})]

    async def zadd(self, key: str, mapping: dict[str, int], nx: bool = False) -> int:
        return 1  # the principal index entry written before cox_create (not a library function)


class _Pipe:
    """The lease keeper's pipeline: a call is queued, not awaited."""

    def __init__(self, rec: _Recorder) -> None:
        self.rec = rec

    def fcall(self, fn: str, nkeys: int, *rest: str) -> None:
        self.rec.sent.append((fn, list(rest[:nkeys]), list(rest[nkeys:])))


def _methods() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _, m in inspect.getmembers(Fns, inspect.isfunction):
        name = getattr(m, "_lua", None)
        if name is not None:
            assert name not in out, f"{name} has two methods: {out[name].__name__} and {m.__name__}"
            out[name] = m
    return out


def sentinel(name: str, i: int, annotation: str, tail: bool) -> Any:
    """A value for parameter ``name`` that can be told apart in what is sent; a sequence (the
    function's variable tail) empty, or with one element when ``tail``."""
    if name == "buckets":
        return [0, 1]  # keys (as many as named), not arguments
    if annotation == "int":
        return 7000 + i
    if annotation.startswith("Sequence["):
        if not tail:
            return []
        width = {"Sequence[StateOp]": 4, "Sequence[tuple[str, str]]": 2}.get(annotation)
        return [tuple(f"ARG-{name}.{j}" for j in range(width))] if width else [f"ARG-{name}"]
    return f"ARG-{name}"


def facade_sends(method: Callable[..., Any], tail: bool) -> tuple[list[str], list[str], dict[str, str]]:
    """(KEYS, ARGV, ARGV value -> parameter name) of one call of ``method``."""
    rec = _Recorder()
    kwargs: dict[str, Any] = {}
    back: dict[str, str] = {}
    params = inspect.signature(method).parameters
    for i, p in enumerate(params.values()):
        if p.kind is p.KEYWORD_ONLY:
            kwargs[p.name] = v = sentinel(p.name, i, str(p.annotation), tail)
            for x in v if isinstance(v, list) else [v]:
                for y in x if isinstance(x, tuple) else [x]:
                    back[str(y)] = p.name
    args = (_Pipe(rec),) if "pipe" in params else ()
    res = method(Fns(rec), *args, **kwargs)
    if inspect.isawaitable(res):
        assert inspect.iscoroutine(res), (method.__name__, res)
        asyncio.run(res)
    assert [fn for fn, _, _ in rec.sent] == [method._lua], method.__name__  # type: ignore[attr-defined]
    _, ks, argv = rec.sent[0]
    return ks, argv, back


DERIVED = {("cox_emit", "nops"): "len(ops)", ("cox_turn_end", "nops"): "len(ops)"}
"""ARGV slots the facade computes from its arguments rather than passing one: (function, the
Lua's name) -> how."""


def test_every_library_function_has_exactly_one_method() -> None:
    assert len(REGISTERED) >= 20, "the test no longer reads the library"
    assert set(REGISTERED) <= set(BODIES), f"registered without a body the test reads: {set(REGISTERED) - set(BODIES)}"
    assert set(_methods()) == set(REGISTERED), (
        f"functions without a method: {sorted(set(REGISTERED) - set(_methods()))}; "
        f"methods without a function: {sorted(set(_methods()) - set(REGISTERED))}")


def test_each_method_sends_the_arguments_its_function_reads_by_name_and_order() -> None:
    problems: list[str] = []
    for fn, method in sorted(_methods().items()):
        names, variadic, wrong = lua_argv(BODIES[REGISTERED[fn]])
        problems += [f"{fn}: {w}" for w in wrong]
        _, argv, back = facade_sends(method, tail=False)
        derived = {lua for f, lua in DERIVED if f == fn}
        sent = [back.get(v) or (names[i] if i < len(names) and names[i] in derived else f"?{v}")
                for i, v in enumerate(argv)]
        if sent != names:
            at = next((i for i, (a, b) in enumerate(zip(sent, names, strict=False)) if a != b),
                      min(len(sent), len(names)))
            problems.append(f"{fn}: ARGV differ from slot {at + 1}: the Lua reads {names}, "
                            f"{method.__name__} sends {sent}")
        tails = [p.name for p in inspect.signature(method).parameters.values()
                 if str(p.annotation).startswith("Sequence[")]
        if bool(tails) != variadic:
            problems.append(f"{fn}: a variable tail on one side only (Lua: {variadic}, {method.__name__}: {tails})")
        if tails:  # the tail comes after the fixed slots, each sequence in the method's order
            _, argv1, back1 = facade_sends(method, tail=True)
            same = all(a == b or n in derived for a, b, n in zip(argv1, argv, names, strict=False))
            order = [back1.get(v) for v in argv1[len(argv):]]
            groups = [t for i, t in enumerate(order) if i == 0 or order[i - 1] != t]
            if not same or groups != tails:
                problems.append(f"{fn}: the tail {tails} is not sent after the fixed slots, in that order: {argv1}")
    assert not problems, "\n".join(problems)


def test_each_method_passes_the_keys_its_function_reads() -> None:
    problems: list[str] = []
    for fn, method in sorted(_methods().items()):
        want, session_first = lua_keys(BODIES[REGISTERED[fn]])
        ks, _, _ = facade_sends(method, tail=False)
        takes_buckets = "buckets" in inspect.signature(method).parameters
        if want is None:
            if not takes_buckets or len(ks) != 2:
                problems.append(f"{fn}: the Lua reads every KEY it is given; {method.__name__} should pass one a "
                                f"bucket named (it passes {ks})")
        elif len(ks) != want:
            problems.append(f"{fn}: the Lua reads {want} KEYS, {method.__name__} passes {len(ks)}: {ks}")
        if session_first and (not ks or ks[0] != keys.session("ARG-sid")):
            problems.append(f"{fn}: KEYS[1] is the session's hash in the Lua, {method.__name__} passes {ks[:1]}")
    assert not problems, "\n".join(problems)


def reply_type(method: Any) -> Any:
    """The typed dict of the method's reply: its ``lua(..., reply=)`` or its return annotation."""
    t = method._reply or get_type_hints(method)["return"]
    return t if is_typeddict(t) else None


def test_each_reply_has_the_keys_of_its_typed_dict() -> None:
    problems: list[str] = []
    for fn, method in sorted(_methods().items()):
        shape, t = lua_replies(fn), reply_type(method)
        if shape is None or t is None:
            if (shape is None) != (t is None):
                problems.append(f"{fn}: a JSON reply on one side only (Lua: {shape is not None}, "
                                f"{method.__name__}: {t})")
            continue
        variants, nulls, _ = shape
        hints = get_type_hints(t, include_extras=True)
        optional = {k for k, v in hints.items() if get_origin(v) is NotRequired}
        every, some = set.intersection(*variants), set.union(*variants)
        if some != set(hints):
            problems.append(f"{fn}: keys the Lua replies with that {t.__name__} lacks: {sorted(some - set(hints))}; "
                            f"keys of {t.__name__} no reply sets: {sorted(set(hints) - some)}")
        if every != set(hints) - optional:
            problems.append(f"{fn}: {t.__name__} should mark NotRequired exactly the keys some reply leaves out: "
                            f"{sorted(some - every)} (it marks {sorted(optional)})")
        for k in nulls & set(hints):
            inner = hints[k]
            inner = get_args(inner)[0] if get_origin(inner) is NotRequired else inner
            if inner is not Any and type(None) not in get_args(inner):
                problems.append(f"{fn}: a reply sets {k} to null; {t.__name__}.{k} is {inner}, not optional")
    assert not problems, "\n".join(problems)


def test_the_parser_reads_what_it_must() -> None:
    """The helpers above find what they should, so a check passing is not a parser finding nothing."""
    assert lua_argv(BODIES["cox_send"])[0][:3] == ["sid", "principal", "message_id"]
    assert lua_argv(BODIES["cox_fork"])[:2] == (["sid", "principal", "workspace", "model", "title", "owner",
                                                 "body"], True)
    sent = lua_replies("cox_send")
    assert sent is not None and {"message_id", "disposition", "position", "replay"} in sent[0]
    ended = lua_replies("cox_turn_end")
    assert ended is not None and len(ended[0]) == 6 and "next" in ended[1]
    claimed = lua_replies("cox_claim")
    assert claimed is not None and claimed[2] and "old_runner" in claimed[0][0]
    assert lua_replies("cox_idle") is None and lua_keys(BODIES["cox_idle"]) == (None, False)
    assert lua_keys(BODIES["cox_ws_claim"]) == (3, False) and lua_keys(BODIES["cox_emit"]) == (1, True)
    assert {"seq", "busy", "principal", "turn_started"} <= session_fields_lua()


def test_the_transitions_that_take_an_id_are_the_same_on_both_sides() -> None:
    """The library takes the transition id off the end of exactly the functions it registers
    through ``once``; the store appends one to exactly those (a mismatch would take a real
    argument for the id, or leave the id as one)."""
    wrapped = set(re.findall(r"redis\.register_function\('(\w+)', entry\(once\(\w+\)\)\)", LUA))
    assert len(wrapped) >= 10, "the test no longer reads the library"
    assert wrapped == set(TX_FNS)
    # Every transition of a turn's holder is idempotent but the two that may simply run again:
    # a renewal (PEXPIRE) and the fence, which must answer for the lease as it is now.
    assert set(HOLDER_FNS) - wrapped == {"cox_renew", "cox_fence"}
    # Every other session function that records something is too (the takeover and publishing
    # functions touch no one session's reply, see docs/design.md "Idempotent transitions").
    # The archive's drop and load are safe to run again by themselves (each checks the session is
    # as it expects: a second run changes nothing); its scan changes nothing. A workspace claim run
    # again finds its own record (and answers the same owner); a release run again finds none. The
    # run slots' call run again renews what it renewed and answers a slot it granted as granted.
    assert set(REGISTERED) - wrapped == {"cox_renew", "cox_fence", "cox_claim", "cox_pub_done", "cox_dirty",
                                           "cox_pub_claim", "cox_idle", "cox_archive_drop", "cox_archive_load",
                                           "cox_ws_claim", "cox_ws_release", "cox_run_slots"}


def test_a_fault_plan_counts_attempts_per_function_and_needs_its_switch() -> None:
    class Log:
        def __init__(self) -> None:
            self.lines: list[str] = []

        def warning(self, event: str, **kw: Any) -> None:
            self.lines.append(event)

        error = warning

    log = Log()
    off = DropReplies.from_env({"COX_FAULT_DROP_REPLY": "cox_turn_end:1"}, log)
    assert not off and not off.drop("cox_turn_end") and log.lines == ["fault.injection_ignored"]
    on = DropReplies.from_env({"COX_FAULT_DROP_REPLY": "cox_turn_end:1, cox_emit:2,cox_emit:3",
                               "COX_TEST_FAULTS": "1"}, log)
    assert log.lines[-1] == "fault.injection_on"
    assert [on.drop("cox_emit") for _ in range(4)] == [False, True, True, False]
    assert [on.drop("cox_turn_end") for _ in range(2)] == [True, False]
    assert not on.drop("cox_send") and on.dropped == 3
    for bad in ("turn_end:1", "cox_emit", "cox_emit:0", "cox_emit:x"):
        with pytest.raises(ValueError):
            parse(bad)
