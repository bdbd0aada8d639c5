"""The Redis library's facade (cox_runner.redis.fns): one method per registered function, each sending
as many fixed arguments as the Lua function reads (no server: the Lua source is parsed)."""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest

from cox_runner.redis.faults import DropReplies, parse
from cox_runner.redis.fns import Fns
from cox_runner.redis.store import HOLDER_FNS, TX_FNS

LUA = (Path(__file__).resolve().parents[2] / "services/turn-runner/cox_runner/redis/redis_lib.lua").read_text()


def _functions() -> dict[str, tuple[int, bool]]:
    """Each registered function: (how many ARGV slots it reads by position, reads more after them).
    A function registered through ``once`` reads them after the transition id was taken off the
    end (the store appends it: cox_runner.redis.store.TX_FNS), so its method sends just those."""
    bodies = dict(re.findall(r"local function (\w+)\(keys, args\)\n(.*?)\nend\n", LUA, re.S))
    out: dict[str, tuple[int, bool]] = {}
    for name, local in re.findall(r"redis\.register_function\('(\w+)', (?:once\()?(\w+)\)?\)", LUA):
        body = bodies[local]
        n = max((int(i) for i in re.findall(r"\bargs\[(\d+)\]", body)), default=0)
        for names in re.findall(r"local ([\w, ]+?)\s*=\s*unpack\(args\)", body):
            n = max(n, len(names.split(",")))
        out[name] = (n, "#args" in body)
    return out


class _Recorder:
    """Stands in for the Store and its Redis client: records what each method would send."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, list[str]]] = []
        self.redis = self

    async def call(self, fn: str, sid: str | None, args: list[Any], extra_keys: list[str] | None = None,
                   publish: bool = True) -> dict[str, Any]:
        self.sent.append((fn, [str(a) for a in args]))
        return {}

    async def fcall(self, fn: str, nkeys: int, *rest: str) -> list[str]:
        self.sent.append((fn, list(rest[nkeys:])))
        return [json.dumps({})]

    async def zadd(self, key: str, mapping: dict[str, int], nx: bool = False) -> int:
        return 1  # the principal index entry written before cox_create (not a library function)


class _Pipe:
    """The lease keeper's pipeline: a call is queued, not awaited."""

    def __init__(self, rec: _Recorder) -> None:
        self.rec = rec

    def fcall(self, fn: str, nkeys: int, *rest: str) -> None:
        self.rec.sent.append((fn, list(rest[nkeys:])))


def _methods() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for _, m in inspect.getmembers(Fns, inspect.isfunction):
        name = getattr(m, "_lua", None)
        if name is not None:
            assert name not in out, f"{name} has two methods: {out[name].__name__} and {m.__name__}"
            out[name] = m
    return out


def test_every_library_function_has_exactly_one_method() -> None:
    fns = _functions()
    assert len(fns) >= 20, "the test no longer reads the library"
    assert set(_methods()) == set(fns)


def test_each_method_sends_the_arguments_its_function_reads() -> None:
    fns = _functions()
    for name, method in _methods().items():
        rec = _Recorder()
        facade = Fns(rec)
        kwargs: dict[str, Any] = {}
        for p in inspect.signature(method).parameters.values():
            if p.kind is p.KEYWORD_ONLY:
                # a sequence is the function's variable tail: empty, only the fixed slots are sent;
                # ``buckets`` are keys (how many a call names), not arguments
                kwargs[p.name] = ([0, 1] if p.name == "buckets" else [] if "Sequence" in str(p.annotation)
                                  else (0 if p.annotation == "int" else "x"))
        args = (_Pipe(rec),) if "pipe" in inspect.signature(method).parameters else ()
        res = method(facade, *args, **kwargs)
        if inspect.isawaitable(res):
            asyncio.run(res)  # type: ignore[arg-type]
        assert [fn for fn, _ in rec.sent] == [name], name
        want, variadic = fns[name]
        assert len(rec.sent[0][1]) == want, f"{name}: the method sends {len(rec.sent[0][1])} fixed arguments, " \
                                             f"the function reads {want}"
        has_tail = any("Sequence" in str(p.annotation) for p in inspect.signature(method).parameters.values())
        assert has_tail == variadic, f"{name}: variable arguments on one side only"


def test_the_transitions_that_take_an_id_are_the_same_on_both_sides() -> None:
    """The library takes the transition id off the end of exactly the functions it registers
    through ``once``; the store appends one to exactly those (a mismatch would take a real
    argument for the id, or leave the id as one)."""
    wrapped = set(re.findall(r"redis\.register_function\('(\w+)', once\(\w+\)\)", LUA))
    assert len(wrapped) >= 10, "the test no longer reads the library"
    assert wrapped == set(TX_FNS)
    # Every transition of a turn's holder is idempotent but the two that may simply run again:
    # a renewal (PEXPIRE) and the fence, which must answer for the lease as it is now.
    assert set(HOLDER_FNS) - wrapped == {"cox_renew", "cox_fence"}
    # Every other session function that records something is too (the takeover and publishing
    # functions touch no one session's reply, see docs/design.md "Idempotent transitions").
    # The archive's drop and load are safe to run again by themselves (each checks the session is
    # as it expects: a second run changes nothing); its scan changes nothing. A workspace claim run
    # again finds its own record (and answers the same owner); a release run again finds none.
    assert set(_functions()) - wrapped == {"cox_renew", "cox_fence", "cox_claim", "cox_pub_done", "cox_dirty",
                                           "cox_pub_claim", "cox_idle", "cox_archive_drop", "cox_archive_load",
                                           "cox_ws_claim", "cox_ws_release"}


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
