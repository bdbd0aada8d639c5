"""redis-py's and nats-py's ``asyncio.wait_for`` with Python 3.12's semantics on Python 3.11.

redis-py writes every command under ``asyncio.wait_for(write, socket_timeout)`` (its connect
handshake and health checks too). On Python 3.11, ``wait_for`` returns the write's result when
a cancellation arrives as the write completes (CPython gh-86296; 3.12 rebuilt ``wait_for`` on
``asyncio.timeout``): the cancelled task goes on as if nothing had happened. Stop, steer and a
lost lease end work by cancelling a task, so a swallowed cancellation is a steered turn that
streams on for a minute (seen in CI) or a drive that outlives its lease. With the client the
services build, 192 of 300 cancellations landing mid-command were swallowed
(tests/redis/test_cancellation.py), and 97 of 300 landing in a NATS request (``nc.request``
waits for its reply under ``wait_for``); with this, none.

:func:`install` points those libraries' modules (:data:`PATCHED`) at a view of :mod:`asyncio` whose
``wait_for`` is ``asyncio.timeout`` around the awaitable; nothing else changes. Called on
import of :mod:`coxswain.service`, which builds every Redis client of the services.

:class:`WaitingPool` is the pool those clients use: redis-py's blocking pool, with a fast path
when no task waits for a connection.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable
from typing import Any, TypeVar

import redis.asyncio as aioredis

T = TypeVar("T")


async def wait_for(aw: Awaitable[T], timeout: float | None) -> T:
    """``asyncio.wait_for`` as Python 3.12 has it: a cancellation is never traded for a result."""
    async with asyncio.timeout(timeout):
        return await aw


class _Asyncio:
    """:mod:`asyncio`, but for :func:`wait_for`."""

    cox_fixed = True

    def __getattr__(self, name: str) -> Any:
        # Kept on the instance once looked up: these modules read ``asyncio.<name>`` on every
        # command, and a class-level __getattr__ call each time cost more than the lookup.
        value = getattr(asyncio, name)
        setattr(self, name, value)
        return value

    wait_for = staticmethod(wait_for)


PATCHED = ("redis.asyncio.connection", "nats.aio.client", "nats.aio.subscription", "nats.js.client", "nats.js.kv")
"""The modules that call ``asyncio.wait_for`` on a path a cancelled task takes (a command's
write; a request's reply, a subscription's next message, a JetStream call)."""


class WaitingPool(aioredis.BlockingConnectionPool):
    """redis-py's ``BlockingConnectionPool`` (at most ``max_connections``; a command past that waits
    for a free connection, up to ``timeout``) with a fast path when nobody waits.

    Every command takes a connection and gives it back. The blocking pool does both under an
    ``asyncio.Condition`` with a timer, through a deprecation wrapper and the SDK's observability
    hooks (awaited even when no meter is set), and the give-back under the base pool's lock with an
    event dispatch: 9-12% of a turn-runner's CPU starting runs. With no task waiting for a
    connection (and no maintenance handoff under way) taking one is a pop and giving it back an
    append, both without an await, so atomic on the loop; otherwise the pool's own path runs, so
    the bound, the wait and its order are the pool's. Not dispatched on the fast give-back:
    ``AfterConnectionReleasedEvent``, which only re-authentication with a streaming credential
    provider listens to (coxswain authenticates with a password)."""

    def _uncontended(self) -> bool:
        # asyncio.Condition keeps its waiters in ``_waiters``: without it, assume there are some
        return not getattr(self, "_in_maintenance", True) and not getattr(self._condition, "_waiters", True)

    async def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> Any:
        if self._uncontended() and self.can_get_connection():
            connection = self.get_available_connection()  # type: ignore[no-untyped-call]
            try:
                await self.ensure_connection(connection)
            except BaseException:
                await self.release(connection)
                raise
            return connection
        return await super().get_connection()  # type: ignore[no-untyped-call]  # (no arguments: deprecated)

    async def release(self, connection: Any) -> None:
        if self._uncontended() and not self._lock.locked() and connection in self._in_use_connections \
                and not connection.should_reconnect():
            self._in_use_connections.remove(connection)
            self._available_connections.append(connection)
            return
        await super().release(connection)


def install() -> None:
    if sys.version_info >= (3, 12):
        return
    import importlib

    for name in PATCHED:
        module = importlib.import_module(name)
        if not getattr(module.asyncio, "cox_fixed", False):
            module.asyncio = _Asyncio()  # type: ignore[attr-defined]
