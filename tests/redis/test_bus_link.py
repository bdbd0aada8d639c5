"""``bus.Link``: a service's requests and their replies, against a real nats-server.

Each reply reaches its own caller however the replies are ordered; a call whose connection is lost
fails ``Unavailable`` at once, and nothing else about the waiting task changes: a task cancelled
from outside meanwhile still sees its cancellation, a task whose call is over is never touched,
and the task goes on normally after the failure (it is not left "cancelling"). Nobody listening
and no reply in time are ``Unavailable`` too, as with nats-py's own ``request``. The loss here is
the link's callback called as nats-py calls it; a real disconnect is drilled in
``tests/faults/test_faults_bus.py`` (NATS killed with a send in flight: 503 at once).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import nats
import pytest
import uvloop
from nats.aio.msg import Msg

from cox.servers import NatsServer
from coxswain import bus, logs
from coxswain.errors import Unavailable
from coxswain.service import connect_nats

SUBJECT = "cox.rpc.x.op"


@pytest.fixture(scope="module")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with NatsServer(tmp_path_factory.mktemp("nats")) as ns:
        yield ns.admin_url


class Responder:
    """Holds every request on ``SUBJECT`` until told to answer it."""

    def __init__(self) -> None:
        self.held: list[Msg] = []

    async def on(self, msg: Msg) -> None:
        self.held.append(msg)

    async def answer(self, msg: Msg) -> None:
        await msg.respond(json.dumps({"ok": True, "result": json.loads(msg.data)}).encode())


def run(url: str, body: Callable[[Any, bus.Link, Responder], Awaitable[None]]) -> None:
    async def go() -> None:
        nc: Any = await connect_nats(url, "bus-link", logs.get("test"))
        peer = await nats.connect(url)
        responder = Responder()
        await peer.subscribe(SUBJECT, cb=responder.on)
        await peer.flush()
        try:
            await body(nc, bus._links[nc], responder)
        finally:
            await peer.close()
            await nc.close()

    uvloop.run(go())


async def held(responder: Responder, n: int) -> None:
    async with asyncio.timeout(5):
        while len(responder.held) < n:
            await asyncio.sleep(0.005)


def test_replies_reach_their_own_callers_in_whatever_order_they_come(nats_url: str) -> None:
    async def body(nc: Any, ln: bus.Link, responder: Responder) -> None:
        calls = [asyncio.create_task(bus.raw_call(nc, SUBJECT, json.dumps({"n": i}).encode(), 5)) for i in range(20)]
        await held(responder, 20)
        for msg in reversed(responder.held):
            await responder.answer(msg)
        assert await asyncio.gather(*calls) == [{"n": i} for i in range(20)]
        assert ln._waiting == {}, "an answered call left its future behind"

    run(nats_url, body)


def test_calls_waiting_when_the_link_is_lost_fail_at_once_and_go_on_normally(nats_url: str) -> None:
    async def body(nc: Any, ln: bus.Link, responder: Responder) -> None:
        async def call() -> str:
            try:
                await bus.raw_call(nc, SUBJECT, b"{}", timeout=30)
            except Unavailable as exc:
                task = asyncio.current_task()
                assert task is not None and task.cancelling() == 0, "left cancelling"
                await asyncio.sleep(0.01)  # the task goes on: no cancellation is pending for it
                return exc.detail
            return "answered"

        calls = [asyncio.create_task(call()) for _ in range(3)]
        await held(responder, 3)
        ln.disconnected("the message bus connection was lost")
        details = await asyncio.wait_for(asyncio.gather(*calls), 2)
        assert details == [f"the message bus connection was lost while waiting for {SUBJECT}"] * 3
        # a reply that comes after all is dropped, and the link serves the next call
        for msg in responder.held:
            await responder.answer(msg)
        nxt = asyncio.create_task(bus.raw_call(nc, SUBJECT, b"[7]", 5))
        await held(responder, 4)
        await responder.answer(responder.held[3])
        assert await nxt == [7]

    run(nats_url, body)


def test_an_answered_call_is_never_touched_by_a_later_loss(nats_url: str) -> None:
    async def body(nc: Any, ln: bus.Link, responder: Responder) -> None:
        task = asyncio.create_task(bus.raw_call(nc, SUBJECT, b'{"n": 1}', timeout=30))
        await held(responder, 1)
        await responder.answer(responder.held[0])
        assert await asyncio.wait_for(task, 2) == {"n": 1}
        ln.disconnected()
        await asyncio.sleep(0.01)
        assert task.result() == {"n": 1}

    run(nats_url, body)


def test_a_cancellation_from_outside_is_kept_when_the_link_is_lost_too(nats_url: str) -> None:
    async def body(nc: Any, ln: bus.Link, responder: Responder) -> None:
        task = asyncio.create_task(bus.raw_call(nc, SUBJECT, b"{}", timeout=30))
        await held(responder, 1)
        task.cancel()  # the request's own caller gives up (a client went away)
        ln.disconnected()
        with pytest.raises(asyncio.CancelledError):
            await task
        # and the other order
        task = asyncio.create_task(bus.raw_call(nc, SUBJECT, b"{}", timeout=30))
        await held(responder, 2)
        ln.disconnected()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ln._waiting == {}

    run(nats_url, body)


def test_nobody_listening_and_no_reply_in_time_are_unavailable(nats_url: str) -> None:
    async def body(nc: Any, ln: bus.Link, responder: Responder) -> None:
        with pytest.raises(Unavailable, match=re.escape("no service answers cox.rpc.nobody.op")):
            await bus.raw_call(nc, "cox.rpc.nobody.op", b"{}", timeout=0.5)
        with pytest.raises(Unavailable, match=re.escape(f"{SUBJECT} did not answer within 0.2s")):
            await bus.raw_call(nc, SUBJECT, b"{}", timeout=0.2)
        assert ln._waiting == {}

    run(nats_url, body)


def test_a_call_without_a_link_waits_for_its_reply(nats_url: str) -> None:
    async def go() -> None:
        nc = await nats.connect(nats_url)  # not made by connect_nats: nats-py's own request
        peer = await nats.connect(nats_url)
        responder = Responder()
        await peer.subscribe(SUBJECT, cb=responder.on)
        await peer.flush()
        try:
            assert nc not in bus._links
            task = asyncio.create_task(bus.raw_call(nc, SUBJECT, b"[1, 2]", timeout=30))
            await held(responder, 1)
            await responder.answer(responder.held[0])
            assert await asyncio.wait_for(task, 2) == [1, 2]
        finally:
            await peer.close()
            await nc.close()

    uvloop.run(go())


def test_every_service_client_is_linked(nats_url: str) -> None:
    async def go() -> None:
        nc = await connect_nats(nats_url, "bus-link", logs.get("test"))
        try:
            assert isinstance(bus._links.get(nc), bus.Link)
        finally:
            await nc.close()

    uvloop.run(go())
