"""Typed request-reply over NATS: one pydantic model in, one out, errors as codes.

A reply is ``{"ok": true, "result": {...}}`` or an error envelope (:mod:`coxswain.errors`).
Transport failures (no responders, timeout, closed connection) become :class:`Unavailable`, so
the gateway answers 503 instead of 500 when a service or NATS is down.

A request whose connection is lost is answered at once: nats-py keeps its reply future until the
timeout (30 s for the gateway's calls), though no reply can come on a connection that is gone.
A client made by :func:`coxswain.service.connect_nats` has a :class:`Link` that fails every call
in flight with :class:`Unavailable` the moment nats-py reports the disconnect.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from typing import Any, TypeVar

import nats.errors
from nats.aio.client import Client
from pydantic import BaseModel

from .errors import CoxError, Unavailable, from_wire

T = TypeVar("T", bound=BaseModel)


class Link:
    """Calls in flight on one NATS client, failed together when its connection is lost."""

    def __init__(self) -> None:
        self._lost: asyncio.Future[str] | None = None

    def lost(self) -> asyncio.Future[str]:
        """A future that completes (with the reason) when the connection is next lost."""
        if self._lost is None or self._lost.done():
            self._lost = asyncio.get_running_loop().create_future()
        return self._lost

    def disconnected(self, why: str = "the message bus connection was lost") -> None:
        """nats-py's disconnected callback: every call waiting for a reply fails now."""
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(why)
        self._lost = None


_links: weakref.WeakKeyDictionary[Client, Link] = weakref.WeakKeyDictionary()


def link(nc: Client, ln: Link) -> None:
    """Watch ``nc``'s connection with ``ln`` (see :class:`Link`)."""
    _links[nc] = ln


def ok(result: BaseModel | dict[str, Any]) -> bytes:
    payload = result.model_dump(mode="json") if isinstance(result, BaseModel) else result
    return json.dumps({"ok": True, "result": payload}, ensure_ascii=False).encode()


def err(exc: CoxError) -> bytes:
    return json.dumps(exc.to_wire(), ensure_ascii=False).encode()


async def call(nc: Client, subject: str, request: BaseModel, result: type[T], timeout: float = 10.0) -> T:
    """Send ``request`` to ``subject`` and parse the reply as ``result`` (or raise its error)."""
    data = await raw_call(nc, subject, request.model_dump_json().encode(), timeout)
    return result.model_validate(data)


NO_RESPONDERS_WAIT_S = 2.0
"""How long a request keeps trying while the bus says nobody listens on its subject."""


async def raw_call(nc: Client, subject: str, payload: bytes, timeout: float = 10.0) -> Any:
    """Send ``payload`` to ``subject``; its reply (JSON) or :class:`Unavailable`.

    "No responders" means the request reached nobody, so it is sent again, briefly (up to
    :data:`NO_RESPONDERS_WAIT_S`): in a NATS cluster a server learns of a subscription on
    another node, or of one gone with its dead client, a moment after the fact, and a
    restarting service is back within that time."""
    loop = asyncio.get_running_loop()
    until = loop.time() + min(NO_RESPONDERS_WAIT_S, timeout)
    pause = 0.05
    while True:
        try:
            return await _raw_call_once(nc, subject, payload, timeout)
        except _NoResponders as exc:
            if loop.time() + pause > until:
                raise Unavailable(f"no service answers {subject}") from exc.__cause__
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.4)


class _NoResponders(Exception):
    pass


async def _raw_call_once(nc: Client, subject: str, payload: bytes, timeout: float) -> Any:
    if nc.is_closed or not nc.is_connected:
        raise Unavailable("the message bus is not connected")
    try:
        ln = _links.get(nc)
        if ln is None:
            msg = await nc.request(subject, payload, timeout=timeout)
        else:
            lost = ln.lost()
            req = asyncio.ensure_future(nc.request(subject, payload, timeout=timeout))
            try:
                await asyncio.wait((req, lost), return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                req.cancel()
                raise
            if not req.done():
                req.cancel()
                raise Unavailable(f"{lost.result()} while waiting for {subject}")
            msg = req.result()
    except nats.errors.NoRespondersError as exc:
        raise _NoResponders() from exc
    except nats.errors.TimeoutError as exc:
        raise Unavailable(f"{subject} did not answer within {timeout:g}s") from exc
    except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError,
            nats.errors.ConnectionReconnectingError, nats.errors.OutboundBufferLimitError) as exc:
        raise Unavailable(f"the message bus is not connected: {exc}") from exc
    except (OSError, RuntimeError) as exc:
        # nats-py writes a request to the socket as it publishes it: a server that died under it
        # (its client not yet told) surfaces as the transport's own error, a reset or uvloop's
        # RuntimeError "unable to perform operation on <TCPTransport closed=True>; the handler is
        # closed". Seen as a 500 in the NATS-cluster drill when a node was killed mid-load. The
        # request may have gone out before (as with any 503 in flight).
        if isinstance(exc, RuntimeError) and "closed" not in str(exc):
            raise
        raise Unavailable(f"the message bus connection broke while sending to {subject}") from exc
    try:
        data = json.loads(msg.data)
    except ValueError as exc:
        raise Unavailable(f"{subject} answered with something that is not JSON") from exc
    if isinstance(data, dict) and data.get("ok") is False:
        raise from_wire(data)
    if not isinstance(data, dict) or "result" not in data:
        raise Unavailable(f"{subject} answered without a result")
    return data["result"]
