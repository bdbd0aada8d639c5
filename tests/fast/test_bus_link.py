"""``bus.Link``: a call waiting for its reply fails ``Unavailable`` at once when the connection is
lost, and nothing else about the waiting task changes (docs/design.md, "The bus").

These pin what any mechanism for it must keep: the failure is prompt and says why; a task that
was cancelled from outside meanwhile still sees its cancellation; a task whose call is over is
never touched; and the task goes on normally after the failure (it is not left "cancelling").

The client here is a stand-in with ``request`` only, so the link's own logic is what runs; the
real disconnect is drilled in ``tests/faults/test_faults_bus.py`` (NATS killed with a send in
flight: 503 at once).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from coxswain import bus
from coxswain.errors import Unavailable


class Reply:
    def __init__(self, data: bytes) -> None:
        self.data = data


class Client:
    """A stand-in for nats-py's client: each request waits until ``answer`` (or forever)."""

    def __init__(self) -> None:
        self.is_closed = False
        self.is_connected = True
        self.waiting: list[asyncio.Future[Reply]] = []

    async def request(self, subject: str, payload: bytes, timeout: float) -> Reply:
        fut: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.waiting.append(fut)
        return await asyncio.wait_for(fut, timeout)

    def answer(self, result: Any) -> None:
        for f in self.waiting:
            if not f.done():
                f.set_result(Reply(json.dumps({"ok": True, "result": result}).encode()))


def linked() -> tuple[Client, bus.Link]:
    nc, ln = Client(), bus.Link()
    bus.link(nc, ln)  # type: ignore[arg-type]
    return nc, ln


async def test_calls_waiting_when_the_link_is_lost_fail_at_once_and_go_on_normally() -> None:
    nc, ln = linked()

    async def call() -> str:
        try:
            await bus.raw_call(nc, "cox.rpc.x.op", b"{}", timeout=30)  # type: ignore[arg-type]
        except Unavailable as exc:
            task = asyncio.current_task()
            assert task is not None and task.cancelling() == 0, "left cancelling"
            await asyncio.sleep(0.01)  # the task goes on: no cancellation is pending for it
            return exc.detail
        return "answered"

    calls = [asyncio.create_task(call()) for _ in range(3)]
    await asyncio.sleep(0.01)
    ln.disconnected("the message bus connection was lost")
    details = await asyncio.wait_for(asyncio.gather(*calls), 2)
    assert details == ["the message bus connection was lost while waiting for cox.rpc.x.op"] * 3


async def test_an_answered_call_is_never_touched_by_a_later_loss() -> None:
    nc, ln = linked()
    task = asyncio.create_task(bus.raw_call(nc, "cox.rpc.x.op", b"{}", timeout=30))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    nc.answer({"n": 1})
    assert await asyncio.wait_for(task, 2) == {"n": 1}

    async def after() -> str:
        await bus.raw_call(nc, "cox.rpc.x.op", b"{}", timeout=30)  # type: ignore[arg-type]
        return "answered"

    # a call made after the loss is on a connection of its own: its own loss fails it
    second = asyncio.create_task(after())
    await asyncio.sleep(0.01)
    ln.disconnected()
    with pytest.raises(Unavailable):
        await asyncio.wait_for(second, 2)


async def test_a_cancellation_from_outside_is_kept_when_the_link_is_lost_too() -> None:
    nc, ln = linked()
    task = asyncio.create_task(bus.raw_call(nc, "cox.rpc.x.op", b"{}", timeout=30))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    task.cancel()  # the request's own caller gives up (a client went away)
    ln.disconnected()
    with pytest.raises(asyncio.CancelledError):
        await task
    # and the other order
    task = asyncio.create_task(bus.raw_call(nc, "cox.rpc.x.op", b"{}", timeout=30))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    ln.disconnected()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_call_without_a_link_waits_for_its_reply() -> None:
    nc = Client()
    task = asyncio.create_task(bus.raw_call(nc, "cox.rpc.x.op", b"{}", timeout=30))  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    nc.answer([1, 2])
    assert await asyncio.wait_for(task, 2) == [1, 2]
