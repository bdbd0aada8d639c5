"""A request whose connection breaks under it is a 503 ``unavailable``, never a 500.

Seen in the NATS-cluster drill: a node killed mid-load; the gateway's next request was written to
the dead socket before nats-py had noticed, uvloop raised ``RuntimeError: unable to perform
operation on <TCPTransport closed=True>; the handler is closed``, and the send answered 500.
Here the socket is aborted under a connected client (as a reset does) and a request sent at once.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
import uvloop

from cox.servers import NatsServer
from coxswain import bus, logs
from coxswain.errors import Unavailable
from coxswain.service import connect_nats


def test_a_request_on_a_socket_that_just_broke_is_unavailable(tmp_path: Path) -> None:
    async def go(url: str) -> None:
        nc: Any = await connect_nats(url, "bus-breaks", logs.get("test"))

        async def echo(msg: Any) -> None:
            await msg.respond(b'{"ok": true, "result": 1}')

        await nc.subscribe("breaks.echo", cb=echo)
        assert await bus.raw_call(nc, "breaks.echo", b"{}", 5) == 1
        nc._transport._io_writer.transport.abort()  # the peer reset it; the client does not know yet
        assert nc.is_connected
        with pytest.raises(Unavailable):
            await bus.raw_call(nc, "breaks.echo", b"{}", 5)
        with contextlib.suppress(RuntimeError):  # nats-py's close flushes to the same dead socket
            await nc.close()

    with NatsServer(tmp_path / "nats") as ns:
        uvloop.run(go(ns.admin_url))
