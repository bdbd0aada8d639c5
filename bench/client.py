"""A lean HTTP/1.1 client on asyncio streams: keep-alive connections, JSON bodies, SSE.

Why not httpx: on this machine httpx spends about as much CPU per call as the gateway does,
so a load generator built on it measures itself. This client writes one pre-built request
and parses the status line, ``Content-Length`` or chunked bodies, nothing else; the floor
phase measures its CPU per request next to httpx's (``client_cpu_us``) so the report can say
how much of a client-observed figure is the client's own share.

Every call is bounded by a timeout; only 127.0.0.1 is ever a target.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

HOST = "127.0.0.1"
IDLE_REOPEN_S = 4.0
"""uvicorn closes a keep-alive connection idle for 5 s; reopen before that instead of racing it."""


class HttpError(Exception):
    pass


class Conn:
    """One keep-alive connection."""

    def __init__(self, port: int, headers: dict[str, str]) -> None:
        self.port = port
        self.fixed = "".join(f"{k}: {v}\r\n" for k, v in {"Host": f"{HOST}:{port}", **headers}.items())
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.last_used = 0.0

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(HOST, self.port, limit=1 << 22)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        """One request; a kept connection the server may have closed meanwhile is retried once
        on a new connection (the server read none of it, as HTTP/1.1 keep-alive allows)."""
        if self.writer is not None and time.monotonic() - self.last_used > IDLE_REOPEN_S:
            self.close()
        fresh = self.writer is None
        try:
            return await self._request(method, path, body)
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            self.close()
            if fresh or (isinstance(exc, asyncio.IncompleteReadError) and exc.partial):
                raise
            return await self._request(method, path, body)

    def _write(self, method: str, path: str, body: bytes | None) -> None:
        assert self.writer is not None
        head = f"{method} {path} HTTP/1.1\r\n{self.fixed}"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + (body or b""))

    async def pipelined(self, requests: list[tuple[str, str, bytes | None]]) -> list[tuple[int, bytes]]:
        """HTTP/1.1 pipelining: every request written at once, the replies read in order (the
        server handles them one after another, in this order, with no client round trip between)."""
        if self.writer is None:
            await self.open()
        for method, path, body in requests:
            self._write(method, path, body)
        return [await self._response() for _ in requests]

    async def _request(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        if self.writer is None:
            await self.open()
        self._write(method, path, body)
        return await self._response()

    async def _response(self) -> tuple[int, bytes]:
        assert self.reader is not None
        status, hdrs = await read_head(self.reader)
        if hdrs.get(b"transfer-encoding", b"").lower() == b"chunked":
            data = await read_chunked(self.reader)
        elif b"content-length" in hdrs:
            data = await self.reader.readexactly(int(hdrs[b"content-length"]))
        else:
            data = await self.reader.read()
            self.close()
        if hdrs.get(b"connection", b"").lower() == b"close":
            self.close()
        self.last_used = time.monotonic()
        return status, data


async def read_head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    raw = await reader.readuntil(b"\r\n\r\n")
    lines = raw.split(b"\r\n")
    try:
        status = int(lines[0].split(b" ", 2)[1])
    except (IndexError, ValueError) as exc:
        raise HttpError(f"bad status line {lines[0][:80]!r}") from exc
    hdrs: dict[bytes, bytes] = {}
    for line in lines[1:]:
        k, sep, v = line.partition(b":")
        if sep:
            hdrs[k.strip().lower()] = v.strip()
    return status, hdrs


async def read_chunk(reader: asyncio.StreamReader) -> bytes:
    """One chunk of a chunked body; b'' for the last one."""
    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
    if size == 0:
        await reader.readuntil(b"\r\n")
        return b""
    data = await reader.readexactly(size + 2)
    return data[:-2]


async def read_chunked(reader: asyncio.StreamReader) -> bytes:
    out = bytearray()
    while chunk := await read_chunk(reader):
        out += chunk
    return bytes(out)


class Pool:
    """Up to ``size`` keep-alive connections to one port; ``call`` waits for a free one."""

    def __init__(self, port: int, token: str | None = None, size: int = 16, timeout: float = 60.0) -> None:
        self.port = port
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout
        self._all = [Conn(port, self.headers) for _ in range(size)]
        self._free: asyncio.Queue[Conn] = asyncio.Queue()
        for c in self._all:
            self._free.put_nowait(c)
        self.requests = 0

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """One request; the JSON reply parsed (raw bytes if it is not JSON)."""
        conn = await self._free.get()
        try:
            data = None if body is None else json.dumps(body).encode()
            try:
                status, raw = await asyncio.wait_for(conn.request(method, path, data), self.timeout)
            except BaseException:
                # Cancelled or failed mid-request: its reply may still arrive, so this
                # connection can never be reused.
                conn.close()
                raise
            self.requests += 1
        finally:
            self._free.put_nowait(conn)
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw

    async def pipelined(self, method: str, path: str, bodies: list[Any]) -> list[tuple[int, Any]]:
        """The same request with each body, pipelined on one connection (see ``Conn.pipelined``)."""
        conn = await self._free.get()
        try:
            reqs: list[tuple[str, str, bytes | None]] = [(method, path, json.dumps(b).encode()) for b in bodies]
            try:
                raw = await asyncio.wait_for(conn.pipelined(reqs), self.timeout)
            except BaseException:
                conn.close()
                raise
            self.requests += len(reqs)
        finally:
            self._free.put_nowait(conn)
        return [(st, json.loads(data) if data else None) for st, data in raw]

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        return await self.call("POST", path, body)

    async def get(self, path: str) -> tuple[int, Any]:
        return await self.call("GET", path)

    def close(self) -> None:
        for c in self._all:
            c.close()


class Watch:
    """One session's SSE stream read by a kept task; events kept with their client arrival time.

    ``wait(pred)`` returns the first event (from ``start``) for which ``pred`` holds.
    """

    def __init__(self, port: int, token: str, sid: str, after: int = 0) -> None:
        self.port, self.token, self.sid, self.after = port, token, sid, after
        self.events: list[tuple[float, dict[str, Any]]] = []
        self._new = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._conn = Conn(port, {"Authorization": f"Bearer {token}", "Accept": "text/event-stream"})
        self.error: BaseException | None = None

    async def start(self) -> Watch:
        await self._conn.open()
        self._task = asyncio.create_task(self._read(), name=f"watch:{self.sid}")
        return self

    async def _read(self) -> None:
        c = self._conn
        assert c.reader is not None and c.writer is not None
        c.writer.write(f"GET /v1/sessions/{self.sid}/events?after={self.after} HTTP/1.1\r\n{c.fixed}\r\n".encode())
        try:
            status, _hdrs = await read_head(c.reader)
            if status != 200:
                raise HttpError(f"events stream answered {status}")
            buf = b""
            while chunk := await read_chunk(c.reader):
                buf += chunk
                while b"\n\n" in buf:
                    block, buf = buf.split(b"\n\n", 1)
                    data = [ln[5:].strip() for ln in block.split(b"\n") if ln.startswith(b"data:")]
                    if data:
                        self.events.append((time.perf_counter(), json.loads(b"\n".join(data))))
                        self._new.set()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - reported to whoever waits
            self.error = exc
            self._new.set()

    async def wait(self, pred: Callable[[dict[str, Any]], bool], timeout: float = 30.0,
                   start: int = 0) -> tuple[int, float, dict[str, Any]]:
        """(index, client arrival perf_counter, event) of the first match at or after ``start``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        i = start
        while True:
            while i < len(self.events):
                t, ev = self.events[i]
                if pred(ev):
                    return i, t, ev
                i += 1
            if self.error is not None:
                raise HttpError(f"stream of {self.sid} failed: {self.error!r}")
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise TimeoutError(f"no matching event on {self.sid} within {timeout}s")
            self._new.clear()
            try:
                await asyncio.wait_for(self._new.wait(), remaining)
            except TimeoutError:
                pass

    async def wait_type(self, type_: str, timeout: float = 30.0, start: int = 0,
                        **match: Any) -> tuple[int, float, dict[str, Any]]:
        return await self.wait(lambda e: e.get("type") == type_ and all(e.get(k) == v for k, v in match.items()),
                               timeout, start)

    def busy(self) -> bool:
        """A turn started whose end this stream has not shown yet."""
        starts = sum(1 for _, e in self.events if e.get("type") == "turn.start")
        ends = sum(1 for _, e in self.events if e.get("type") == "turn.end")
        return starts > ends

    async def idle(self, timeout: float = 30.0) -> None:
        """Wait until every turn started has ended (as seen on this stream)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.busy():
            await self.wait(lambda e: True, max(0.01, deadline - loop.time()), start=len(self.events))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 - closing
                pass
        self._conn.close()

