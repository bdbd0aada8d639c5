"""One Redis connection that carries every concurrent call of a process (pipelined).

redis-py's asyncio client takes a connection from its pool for each command, writes it, waits for
the reply on that connection and gives the connection back: per command a pool checkout, a
write (one syscall) and a read on a connection of its own. A turn-runner makes ~10 ``FCALL``\\ s
per turn, most of them while other sessions' calls are in flight, and that per-command path cost
it more CPU than the scripts themselves cost Redis (bench/ANALYSIS.md, "A connection that carries
every call"). Here every call is written to one connection as it is made, and the replies, which Redis sends in the order it received the
commands, are handed to their callers in that order by hiredis's parser: no pool, no lock, no
read per call.

Only what the runner's hot path needs: commands that answer once (no blocking commands, no
pub/sub, no ``MULTI``), over TCP or a Unix socket, with the password (and user) of the client it
is made from. A TLS client, or a cluster, keeps redis-py (:meth:`Mux.of` answers None).

Failures are redis-py's exceptions, so callers handle them as before: a broken or closed connection
fails every call in flight with ``ConnectionError`` (each may or may not have run, as with a
broken pooled connection; the runner's store retries by transition id), the next call connects
again; a reply not read within ``timeout`` raises ``TimeoutError`` and drops the connection (a
server that answers nothing would otherwise hold every later call behind it); an error reply is
the exception redis-py would raise for it. A cancelled call's reply is read and dropped when it
comes: the connection stays in step, where redis-py must close a connection cancelled mid-read.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import hiredis
import redis.exceptions
from redis._parsers.base import BaseParser


class _ErrorReply(Exception):
    """hiredis's instance for an error reply; made redis-py's exception by :func:`_error`."""


def _error(reply: _ErrorReply) -> redis.exceptions.RedisError:
    return BaseParser.parse_error(str(reply))  # type: ignore[no-any-return, no-untyped-call]


class _Link(asyncio.Protocol):
    """One open connection: commands out in order, each reply to the oldest waiting call."""

    def __init__(self, encoding: str | None) -> None:
        self.reader = hiredis.Reader(encoding=encoding, replyError=_ErrorReply)  # None: bytes
        self.waiting: collections.deque[asyncio.Future[Any]] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.lost: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (uvloop's are not asyncio.Transport subclasses)

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            if not self.waiting:  # a reply nobody asked for: the stream is out of step
                self._fail(redis.exceptions.ConnectionError("redis sent a reply no command asked for"))
                return
            fut = self.waiting.popleft()
            if not fut.done():  # a cancelled call's reply is dropped
                fut.set_exception(_error(reply)) if isinstance(reply, _ErrorReply) else fut.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(redis.exceptions.ConnectionError(f"redis connection lost: {exc!r}" if exc else
                                                    "redis closed the connection"))

    def _fail(self, exc: Exception) -> None:
        if self.lost is None:
            self.lost = exc
        while self.waiting:
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()

    def send(self, packed: bytes) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.lost is not None:
            fut.set_exception(self.lost)
            return fut
        self.waiting.append(fut)
        # Written now: one write per command. Gathering the commands of a pass of the event loop
        # into one write halved the CPU of a write, but a command then waited for the rest of
        # that pass (every other session's work) before it went out: 1-2 ms more a turn.
        assert self.transport is not None
        self.transport.write(packed)
        return fut

    def close(self) -> None:
        self._fail(redis.exceptions.ConnectionError("the redis connection was closed"))


class Mux:
    """Calls to one Redis server over one pipelined connection, connected when first needed."""

    def __init__(self, *, host: str = "localhost", port: int = 6379, path: str | None = None,
                 username: str | None = None, password: str | None = None, db: int = 0,
                 encoding: str | None = "utf-8", connect_timeout: float = 2.0, timeout: float = 5.0) -> None:
        self.host, self.port, self.path = host, port, path
        self.username, self.password, self.db = username, password, db
        self.encoding = encoding
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self._link: _Link | None = None
        self._connecting: asyncio.Task[_Link] | None = None
        self._closed = False

    @classmethod
    def of(cls, client: Any) -> Mux | None:
        """A Mux to the server of redis-py's asyncio ``client`` with its credentials and options;
        None where this cannot stand in for it (TLS, a credential provider, a cluster)."""
        pool = getattr(client, "connection_pool", None)
        if pool is None:
            return None
        kw = pool.connection_kwargs
        name = pool.connection_class.__name__
        if name not in ("Connection", "UnixDomainSocketConnection") or kw.get("credential_provider"):
            return None
        return cls(host=kw.get("host") or "localhost", port=int(kw.get("port") or 6379), path=kw.get("path"),
                   username=kw.get("username"), password=kw.get("password"), db=int(kw.get("db") or 0),
                   encoding=kw.get("encoding", "utf-8") if kw.get("decode_responses") else None,
                   connect_timeout=kw.get("socket_connect_timeout") or 2.0,
                   timeout=kw.get("socket_timeout") or 5.0)

    async def call(self, *args: Any) -> Any:
        """Send one command, wait for its reply (redis-py's exceptions on failure)."""
        link = self._link if self._link is not None and self._link.lost is None else await self._connected()
        fut = link.send(hiredis.pack_command(args))
        try:
            async with asyncio.timeout(self.timeout):
                return await fut
        except TimeoutError:
            link.close()  # a server that answers nothing: the next call connects again
            raise redis.exceptions.TimeoutError(f"redis did not answer {args[0]!r} in {self.timeout} s") from None

    async def _connected(self) -> _Link:
        if self._closed:
            raise redis.exceptions.ConnectionError("the redis connection was closed")
        if self._connecting is None:
            self._connecting = asyncio.ensure_future(self._connect())
        task = self._connecting
        try:
            # shielded: one caller cancelled must not cancel the connect the others wait for
            return await asyncio.shield(task)
        finally:
            if task.done() and self._connecting is task:
                self._connecting = None

    async def _connect(self) -> _Link:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_timeout):
                if self.path:
                    _, link = await loop.create_unix_connection(lambda: _Link(self.encoding), self.path)
                else:
                    _, link = await loop.create_connection(lambda: _Link(self.encoding), self.host, self.port)
        except (OSError, TimeoutError) as exc:
            where = self.path or f"{self.host}:{self.port}"
            raise redis.exceptions.ConnectionError(f"could not connect to redis at {where}: {exc!r}") from None
        hello: list[tuple[Any, ...]] = []
        if self.password is not None:
            hello.append(("AUTH", self.username, self.password) if self.username else ("AUTH", self.password))
        if self.db:
            hello.append(("SELECT", self.db))
        try:
            async with asyncio.timeout(self.connect_timeout):
                for cmd in hello:
                    await link.send(hiredis.pack_command(cmd))
        except TimeoutError:
            link.close()
            raise redis.exceptions.TimeoutError("redis did not answer AUTH/SELECT in time") from None
        except BaseException:
            link.close()
            raise
        if self._closed:
            link.close()
            raise redis.exceptions.ConnectionError("the redis connection was closed")
        self._link = link
        return link

    def drop(self) -> None:
        """Close the connection (calls in flight fail with ConnectionError); the next call connects."""
        if self._link is not None:
            self._link.close()
            self._link = None

    async def aclose(self) -> None:
        self._closed = True
        self.drop()
        if self._connecting is not None:
            self._connecting.cancel()
