"""The gateway's transport sends a response's head with its body (``streams.HeadWithBody``).

What could go wrong is bytes out of order, bytes held forever, or bytes lost at a close: each is
tried here against a transport that records its writes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from cox_gateway.streams import JOIN_MAX, HeadWithBody

HEAD = b"HTTP/1.1 202 Accepted\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n"


class Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False
        self.closed = False
        self.aborted = False

    def write(self, data: bytes) -> None:
        assert not self.closing, "a write after close"
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = self.closed = True

    def abort(self) -> None:
        self.closing = self.aborted = True

    def get_extra_info(self, name: str) -> Any:
        return f"extra:{name}"


def run(body: Any) -> Recorder:
    async def main() -> Recorder:
        rec = Recorder()
        await body(rec, HeadWithBody(rec))  # type: ignore[arg-type]
        return rec
    return asyncio.run(main())


def test_a_head_and_its_body_written_in_one_pass_leave_in_one_write() -> None:
    async def body(rec: Recorder, t: HeadWithBody) -> None:
        t.write(HEAD)
        assert rec.writes == [], "the head waits for its body"
        t.write(b"{}")
        assert rec.writes == [HEAD + b"{}"]
        await asyncio.sleep(0)
        assert rec.writes == [HEAD + b"{}"], "nothing is written twice"
    run(body)


def test_a_head_alone_leaves_at_the_loops_next_pass() -> None:
    async def body(rec: Recorder, t: HeadWithBody) -> None:
        t.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        await asyncio.sleep(0)
        assert rec.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
        t.write(b"more")
        assert rec.writes == [b"HTTP/1.1 100 Continue\r\n\r\n", b"more"]
    run(body)


def test_every_write_leaves_in_the_order_it_was_made() -> None:
    async def body(rec: Recorder, t: HeadWithBody) -> None:
        t.write(b"data: a\n\n")
        t.write(HEAD)
        t.write(bytearray(b"{}"))
        t.write(memoryview(b"tail"))
        t.write(HEAD)
        await asyncio.sleep(0)
        assert b"".join(rec.writes) == b"data: a\n\n" + HEAD + b"{}" + b"tail" + HEAD
    run(body)


def test_a_write_that_is_not_a_whole_head_goes_out_at_once() -> None:
    async def body(rec: Recorder, t: HeadWithBody) -> None:
        t.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n")  # a head in pieces is not held
        t.write(b"\r\n\r\n")
        t.write(b"GET / HTTP/1.1\r\n\r\n")
        assert rec.writes == [b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n", b"\r\n\r\n", b"GET / HTTP/1.1\r\n\r\n"]
    run(body)


def test_a_close_sends_the_held_head_first() -> None:
    async def body(rec: Recorder, t: HeadWithBody) -> None:
        t.write(HEAD)
        t.close()
        assert rec.writes == [HEAD] and rec.closed
        await asyncio.sleep(0)
        assert rec.writes == [HEAD], "the pass after writes nothing on a closed transport"
    run(body)


def test_an_abort_drops_what_is_held_and_the_next_pass_writes_nothing() -> None:
    async def body(rec: Recorder, t: HeadWithBody) -> None:
        t.write(HEAD)
        t.abort()  # a slow reader dropped: its bytes go nowhere
        await asyncio.sleep(0)
        assert rec.aborted and rec.writes == []
    run(body)


def test_the_rest_is_the_transports_own() -> None:
    async def body(rec: Recorder, t: HeadWithBody) -> None:
        assert t.get_extra_info("socket") == "extra:socket"
        assert t.is_closing() is False
    run(body)


def test_a_large_first_write_is_not_copied_but_still_follows_its_head() -> None:
    big = b"x" * (JOIN_MAX + 1)

    async def body(rec: Recorder, t: HeadWithBody) -> None:
        t.write(HEAD)
        t.write(big)
        assert rec.writes == [HEAD, big]
    run(body)
