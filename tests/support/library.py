"""The Redis library on a real server, called through its typed facade (:class:`cox_runner.redis.fns.Fns`).

For the tests of the library itself (no runner around it) and for a test that writes into a
running stack's Redis behind the runner's back. A call sends what :meth:`cox_runner.redis.store.Store.call`
sends (the session's key first, the facade's other KEYS after it, every argument a string, the
transition id last for the functions registered through ``once``: ``tx``, '' by default), and
none of what it adds: no retry, no error raised, nothing published. So a test reads the head as
the library wrote it, a refusal included (``{"error": code, "detail": text}``), and the whole
reply in :attr:`Library.raw` (the outbox batch handed over with the publish lock).

The facade's methods are coroutines; here they never wait on anything (the client is
synchronous), so :meth:`Library.__call__` runs one to its end on the spot::

    lib = Library(r)
    head = lib(lib.fns.stop(sid=sid, principal="p", owner=""), tx="x_1")

A pipelined method (``renew``, ``claim``, ``dirty``, ``idle``) runs through :meth:`Library.queued`.
tests/fast/test_contract.py counts the raw calls of the library in tests/: these here, and the
few that send what no method would.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from cox_runner.redis.fns import Fns
from cox_runner.redis.store import TX_FNS
from coxswain import keys

T = TypeVar("T")


class _Client:
    """What the facade awaits on its store's Redis client, over the synchronous one."""

    def __init__(self, lib: Library) -> None:
        self.lib = lib

    async def zadd(self, key: str, mapping: dict[str, int], nx: bool = False) -> Any:
        return self.lib.r.zadd(key, mapping, nx=nx)


_created = 0


class Library:
    """The facade over ``r`` (a ``redis.Redis`` whose user may call the library)."""

    def __init__(self, r: Any) -> None:
        self.r = r
        self.redis = _Client(self)
        self.fns = Fns(self)
        self.raw: list[Any] = []
        """The last call's whole reply: its JSON head, then any outbox batch it handed over."""
        self._tx = ""

    async def call(self, fn: str, sid: str | None, args: list[Any], extra_keys: list[str] | None = None,
                   publish: bool = True, tx: str = "") -> dict[str, Any]:
        ks = ([keys.session(sid)] if sid is not None else []) + (extra_keys or [])
        argv = [a if isinstance(a, str) else ("" if a is None else str(a)) for a in args]
        if fn in TX_FNS:
            argv.append(tx or self._tx)
        self.raw = list(self.r.fcall(fn, len(ks), *ks, *argv))
        return dict(json.loads(self.raw[0]))

    async def fcall_raw(self, fn: str, ks: list[str], argv: list[str]) -> list[Any]:
        """What the facade's own publishing calls send (``Store.fcall_raw``)."""
        self.raw = list(self.r.fcall(fn, len(ks), *ks, *argv))
        return self.raw

    def create(self, prefix: str) -> str:
        """A new idle session of principal ``p`` in workspace ``/w`` on the script model, its sid
        ``<prefix><n>`` (n counts the sessions this process made)."""
        global _created
        _created += 1
        sid = f"{prefix}{_created}"
        body = json.dumps({"type": "session.created", "sid": sid, "workspace": "/w", "model": "script"})
        self(self.fns.create(sid=sid, principal="p", workspace="/w", model="script", title="", body=body, owner=""))
        return sid

    def __call__(self, call: Coroutine[Any, Any, T], tx: str = "") -> T:
        """Run one method's call (``lib(lib.fns.emit(...))``) with transition id ``tx``: its head."""
        self._tx = tx
        try:
            call.send(None)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        finally:
            self._tx = ""
        call.close()
        raise AssertionError("a facade call waited on something: this helper runs calls that never wait")

    def queued(self, method: Callable[..., None], **kwargs: Any) -> Any:
        """Run a pipelined method (``lib.queued(lib.fns.idle, buckets=[b], idle_ms=5000, limit=10)``)
        alone on a pipeline: its raw reply (an error the server answered is raised)."""
        pipe = self.r.pipeline(transaction=False)
        method(pipe, **kwargs)
        (res,) = pipe.execute()
        return res
