"""The Redis library's facade (cox_runner.fns): one method per registered function, each sending
as many fixed arguments as the Lua function reads (no server: the Lua source is parsed)."""

from __future__ import annotations

import asyncio
import inspect
import json
import re
from pathlib import Path
from typing import Any

from cox_runner.fns import Fns

LUA = (Path(__file__).resolve().parents[2] / "services/turn-runner/cox_runner/redis_lib.lua").read_text()


def _functions() -> dict[str, tuple[int, bool]]:
    """Each registered function: (how many ARGV slots it reads by position, reads more after them)."""
    bodies = dict(re.findall(r"local function (\w+)\(keys, args\)\n(.*?)\nend\n", LUA, re.S))
    out: dict[str, tuple[int, bool]] = {}
    for name, local in re.findall(r"redis\.register_function\('(\w+)', (\w+)\)", LUA):
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
                # a sequence is the function's variable tail: empty, only the fixed slots are sent
                kwargs[p.name] = [] if "Sequence" in str(p.annotation) else (0 if p.annotation == "int" else "x")
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
