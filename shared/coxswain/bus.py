"""Typed request-reply over NATS: one pydantic model in, one out, errors as codes.

A reply is ``{"ok": true, "result": {...}}`` or an error envelope (:mod:`coxswain.errors`).
Transport failures (no responders, timeout, closed connection) become :class:`Unavailable`, so
the gateway answers 503 instead of 500 when a service or NATS is down.

A client made by :func:`coxswain.service.connect_nats` has a :class:`Link`: its requests' replies
reach their callers in two passes of the event loop, not nats-py's five, and a request whose
connection is lost fails with :class:`Unavailable` the moment nats-py reports the disconnect
(nats-py would keep its reply future until the timeout, 30 s for the gateway's calls, though no
reply can come on a connection that is gone).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import weakref
from typing import Any, TypeVar

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from pydantic import BaseModel

from .errors import CoxError, Unavailable, from_wire

T = TypeVar("T", bound=BaseModel)


class Link:
    """A client's requests: their replies come through one wildcard subscription of its own, and
    every request in flight fails with :class:`Unavailable` the moment the connection is lost.

    nats-py's own ``request`` hands a reply to its caller five passes of the event loop after it
    reads it (the subscription's task, ``wait_for``'s callback, its task, and the race with the
    lost connection in two more); whatever else is ready runs before each pass, and in the gateway
    that is the session's events, which come in the same read as the reply to the send that
    recorded them. Here the subscription's task completes the caller's future: two passes.
    """

    def __init__(self) -> None:
        self._prefix: str | None = None
        self._starting = asyncio.Lock()
        self._waiting: dict[str, asyncio.Future[Msg]] = {}
        self._n = 0

    def disconnected(self, why: str = "the message bus connection was lost") -> None:
        """nats-py's disconnected callback: every call waiting for a reply fails now."""
        waiting, self._waiting = self._waiting, {}
        for fut in waiting.values():
            if not fut.done():
                fut.set_exception(_Lost(why))

    async def _start(self, nc: Client) -> str:
        """The subscription (on the client's own inbox prefix, which its NATS user may read),
        made by the first request; nats-py makes it again on every reconnect."""
        async with self._starting:
            if self._prefix is None:
                prefix = nc.new_inbox() + "."
                await nc.subscribe(prefix + "*", cb=self._reply)
                self._prefix = prefix
        return self._prefix

    async def _reply(self, msg: Msg) -> None:
        fut = self._waiting.pop(msg.subject[len(self._prefix or ""):], None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    async def ask(self, nc: Client, subject: str, payload: bytes,
                  headers: dict[str, str] | None = None) -> tuple[str, asyncio.Future[Msg]]:
        """Publish ``payload`` to ``subject``: (its token, the future its reply completes). The
        caller waits for the future as it likes and :meth:`forget` s the token when done."""
        prefix = self._prefix or await self._start(nc)
        self._n += 1
        token = str(self._n)
        fut: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()
        self._waiting[token] = fut
        try:
            await nc.publish(subject, payload, reply=prefix + token, headers=headers)
        except BaseException:
            self._waiting.pop(token, None)
            raise
        return token, fut

    def forget(self, token: str) -> None:
        """A request whose reply nobody waits for any more."""
        self._waiting.pop(token, None)

    async def request(self, nc: Client, subject: str, payload: bytes, timeout: float,
                      headers: dict[str, str] | None = None) -> Msg:
        """``payload`` to ``subject``; the reply, or nats-py's own errors for no responders and a
        timeout (as its ``request`` raises them), or :class:`Unavailable` when the connection is lost."""
        token, fut = await self.ask(nc, subject, payload, headers)
        try:
            async with asyncio.timeout(timeout):
                msg = await fut
        except TimeoutError as exc:
            raise nats.errors.TimeoutError from exc
        except _Lost as exc:
            raise Unavailable(f"{exc} while waiting for {subject}") from None
        finally:
            self.forget(token)
            if fut.done() and not fut.cancelled():
                fut.exception()  # a loss that came with a cancellation from outside: the cancellation wins
        if msg.headers and msg.headers.get("Status") == NO_RESPONDERS_STATUS:
            raise nats.errors.NoRespondersError
        return msg


class _Lost(Exception):
    pass


async def js_publish(js: JetStreamContext, subject: str, payload: bytes, timeout: float,
                     headers: dict[str, str]) -> int:
    """A JetStream publish and its ack, as ``js.publish`` makes them (its errors too), through the
    connection's :class:`Link` when it has one: the ack reaches the caller two passes of the event
    loop after it is read, not five (a session's publisher waits for each ack before its next
    publish or its trim). The stream seq the message got."""
    nc = getattr(js, "_nc", None)
    ln = _links.get(nc) if nc is not None else None
    if nc is None or ln is None:
        return int((await js.publish(subject, payload, timeout=timeout, headers=headers)).seq)
    try:
        msg = await ln.request(nc, subject, payload, timeout, headers=headers)
    except nats.errors.NoRespondersError:
        raise nats.js.errors.NoStreamResponseError from None
    resp = json.loads(msg.data)
    if "error" in resp:
        raise nats.js.errors.APIError.from_error(resp["error"])
    return int(resp["seq"])


NO_RESPONDERS_STATUS = "503"
"""The status of the reply the server sends itself when nobody listens on a request's subject."""


_links: weakref.WeakKeyDictionary[Client, Link] = weakref.WeakKeyDictionary()


def link(nc: Client, ln: Link) -> None:
    """Watch ``nc``'s connection with ``ln`` (see :class:`Link`)."""
    _links[nc] = ln


HOME: contextvars.ContextVar[str | None] = contextvars.ContextVar("cox_home", default=None)
"""Where the session of the request being answered has its turns run now, as its handler learnt
it (:func:`set_home`); :meth:`coxswain.service.Service` puts it in the reply as ``home``. Each
request is answered in a task of its own, so one request's home never reaches another's reply."""


def set_home(instance: Any) -> None:
    """Say, from a handler of a :attr:`coxswain.rpc.Op.home` operation, which replica the
    session's turns run on now (a runner id; nothing when empty): its caller sends the session's
    next such request there."""
    if instance and isinstance(instance, str):
        HOME.set(instance)


def ok(result: BaseModel | dict[str, Any], home: str | None = None) -> bytes:
    if isinstance(result, BaseModel):  # pydantic-core writes it: a quarter of json.dumps's time
        at = b"" if home is None else b',"home":' + json.dumps(home).encode()
        return b'{"ok":true,"result":' + result.model_dump_json().encode() + at + b"}"
    envelope = {"ok": True, "result": result} if home is None else {"ok": True, "result": result, "home": home}
    return json.dumps(envelope, ensure_ascii=False).encode()


def err(exc: CoxError) -> bytes:
    return json.dumps(exc.to_wire(), ensure_ascii=False).encode()


async def call(nc: Client, subject: str, request: BaseModel, result: type[T], timeout: float = 10.0) -> T:
    """Send ``request`` to ``subject`` and parse the reply as ``result`` (or raise its error)."""
    data = await raw_call(nc, subject, request.model_dump_json().encode(), timeout)
    return result.model_validate(data)


NO_RESPONDERS_WAIT_S = 2.0
"""How long a request keeps trying while the bus says nobody listens on its subject."""

HOME_PATIENCE_S = 2.5
"""How long a request waits for the session's home alone before it asks any replica too
(:func:`call_home`), and twice how long it then waits for each further ask: a home answers a send
in milliseconds; one that died a moment ago may still have a NATS route's interest that swallows
the request (no "no responders" comes back). Not less: a home stalled by its machine's load
(seconds, seen in CI) would hand its sessions to other runners needlessly."""


async def call_home(nc: Client, subject: str, home_subject: str | None, request: BaseModel, result: type[T],
                    timeout: float = 10.0) -> tuple[T, str | None]:
    """Send ``request`` to ``home_subject`` (one replica: the session's home) when given, or to
    ``subject`` (any replica) when it is not or nobody listens there any more (that replica
    stopped); its reply parsed as ``result``, and the home the reply names (``None``: none).

    A home that has not answered within :data:`HOME_PATIENCE_S`, or answered that it cannot take
    the request (:class:`Unavailable`), is not waited for alone: the request goes to any replica
    too, and the first answer wins. That is safe only for a request whose change is made once
    whoever runs it (``request.tx``, :class:`coxswain.models.HomeCmd`): the replica that runs it
    second answers the first one's reply and does nothing more. A request without one is sent
    to the home alone, and a home that does not answer in time is :class:`Unavailable` (it may
    have taken the request): the caller forgets that home, not the request's outcome."""
    payload = request.model_dump_json().encode()
    if home_subject is None:
        data = await _envelope(nc, subject, payload, timeout)
    elif getattr(request, "tx", None):
        data = await _home_or_any(nc, home_subject, subject, payload, timeout)
    else:
        try:
            data = await _envelope_once(nc, home_subject, payload, timeout)
        except _NoResponders:
            data = await _envelope(nc, subject, payload, timeout)
    home = data.get("home")
    return result.model_validate(data["result"]), home if isinstance(home, str) else None


class _NoResponders(Exception):
    pass


async def _home_or_any(nc: Client, home_subject: str, subject: str, payload: bytes,
                       timeout: float) -> dict[str, Any]:
    """``payload`` (a request made once whoever runs it) to ``home_subject``; to ``subject`` too
    when the home is late or gone: the first answer's envelope.

    Then every half :data:`HOME_PATIENCE_S` without an answer the request goes to any replica
    once more: the queue group may pick the late home itself (it is still a member until the bus
    learns it is gone). Nobody listening on ``subject`` is waited out as :func:`_envelope` waits it out;
    an ``unavailable`` answer of a replica found there is the request's."""
    loop = asyncio.get_running_loop()
    until = loop.time() + timeout
    ln = _links.get(nc)
    out: dict[asyncio.Future[Any], tuple[str, str | None]] = {}
    """The attempts still out: (subject, the Link's token)."""

    async def ask(subj: str) -> None:
        if ln is None:  # a client without a Link: nats-py's own request, in a task of its own
            out[asyncio.ensure_future(_envelope_once(nc, subj, payload, max(0.0, until - loop.time())))] = (subj, None)
        else:
            token, fut = await _ask(ln, nc, subj, payload)
            out[fut] = (subj, token)

    await ask(home_subject)
    quiet_since: float | None = None
    pause = 0.05
    patience = HOME_PATIENCE_S
    try:
        while (left := until - loop.time()) > 0:
            done, _ = await asyncio.wait(out, timeout=min(left, patience), return_when=asyncio.FIRST_COMPLETED)
            nobody = False
            for f in done:
                subj, token = out.pop(f)
                if token is not None and ln is not None:
                    ln.forget(token)
                try:
                    return _answer(f, subj)
                except _NoResponders:
                    nobody = subj == subject
                except Unavailable:
                    if subj == subject:
                        raise  # a replica's own answer (it is shutting down, its Redis is away)
                    # the home's: any replica may take it
            if out and done:
                continue  # another attempt is still out
            if nobody:
                now = loop.time()
                quiet_since = now if quiet_since is None else quiet_since
                if now + pause - quiet_since > NO_RESPONDERS_WAIT_S or now + pause >= until:
                    raise Unavailable(f"no service answers {subject}")
                await asyncio.sleep(pause)
                pause = min(pause * 2, 0.4)
            if until - loop.time() > 0:
                await ask(subject)  # the home is late or gone, or the last replica asked is: any replica
                patience = HOME_PATIENCE_S / 2
        raise Unavailable(f"{home_subject} did not answer within {timeout:g}s, nor did any replica")
    finally:
        for f, (_, token) in out.items():
            if token is not None and ln is not None:
                ln.forget(token)
            _drop(f)


async def _ask(ln: Link, nc: Client, subject: str, payload: bytes) -> tuple[str, asyncio.Future[Any]]:
    if nc.is_closed or not nc.is_connected:
        raise Unavailable("the message bus is not connected")
    try:
        return await ln.ask(nc, subject, payload)
    except Exception as exc:
        if (seen := _transport(exc, subject)) is exc:
            raise
        raise seen from exc


def _answer(fut: asyncio.Future[Any], subject: str) -> dict[str, Any]:
    """The envelope a finished attempt brought (a reply's or an :func:`_envelope`'s), or its error."""
    try:
        got = fut.result()
    except _Lost as exc:
        raise Unavailable(f"{exc} while waiting for {subject}") from None
    if isinstance(got, dict):
        return got
    if got.headers and got.headers.get("Status") == NO_RESPONDERS_STATUS:
        raise _NoResponders()
    return _opened(got, subject)


def _drop(fut: asyncio.Future[Any]) -> None:
    """Stop waiting for an attempt; its outcome, if any, is seen (never "never retrieved")."""
    if fut.done():
        if not fut.cancelled():
            fut.exception()
    else:
        fut.cancel()
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())


async def raw_call(nc: Client, subject: str, payload: bytes, timeout: float = 10.0) -> Any:
    """Send ``payload`` to ``subject``; its reply's result (JSON) or :class:`Unavailable`."""
    return (await _envelope(nc, subject, payload, timeout))["result"]


async def _envelope(nc: Client, subject: str, payload: bytes, timeout: float) -> dict[str, Any]:
    """Send ``payload`` to ``subject``; its reply's envelope (JSON, ``result`` in it) or
    :class:`Unavailable`.

    "No responders" means the request reached nobody, so it is sent again, briefly (up to
    :data:`NO_RESPONDERS_WAIT_S`): in a NATS cluster a server learns of a subscription on
    another node, or of one gone with its dead client, a moment after the fact, and a
    restarting service is back within that time."""
    loop = asyncio.get_running_loop()
    until = loop.time() + min(NO_RESPONDERS_WAIT_S, timeout)
    pause = 0.05
    while True:
        try:
            return await _envelope_once(nc, subject, payload, timeout)
        except _NoResponders as exc:
            if loop.time() + pause > until:
                raise Unavailable(f"no service answers {subject}") from exc.__cause__
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.4)


async def _envelope_once(nc: Client, subject: str, payload: bytes, timeout: float) -> dict[str, Any]:
    if nc.is_closed or not nc.is_connected:
        raise Unavailable("the message bus is not connected")
    try:
        ln = _links.get(nc)
        msg = await (nc.request(subject, payload, timeout=timeout) if ln is None
                     else ln.request(nc, subject, payload, timeout))
    except nats.errors.NoRespondersError as exc:
        raise _NoResponders() from exc
    except nats.errors.TimeoutError as exc:
        raise Unavailable(f"{subject} did not answer within {timeout:g}s") from exc
    except Exception as exc:
        if (seen := _transport(exc, subject)) is exc:
            raise
        raise seen from exc
    return _opened(msg, subject)


def _transport(exc: Exception, subject: str) -> Exception:
    """What a request's failure to reach the bus is to its caller (``exc`` itself: not one)."""
    if isinstance(exc, (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError,
                        nats.errors.ConnectionReconnectingError, nats.errors.OutboundBufferLimitError)):
        return Unavailable(f"the message bus is not connected: {exc}")
    if isinstance(exc, OSError) or (isinstance(exc, RuntimeError) and "closed" in str(exc)):
        # nats-py writes a request to the socket as it publishes it: a server that died under it
        # (its client not yet told) surfaces as the transport's own error, a reset or uvloop's
        # RuntimeError "unable to perform operation on <TCPTransport closed=True>; the handler is
        # closed". Seen as a 500 in the NATS-cluster drill when a node was killed mid-load. The
        # request may have gone out before (as with any 503 in flight).
        return Unavailable(f"the message bus connection broke while sending to {subject}")
    return exc


def _opened(msg: Msg, subject: str) -> dict[str, Any]:
    """A reply's envelope (JSON, ``result`` in it), or the error it carries."""
    try:
        data = json.loads(msg.data)
    except ValueError as exc:
        raise Unavailable(f"{subject} answered with something that is not JSON") from exc
    if isinstance(data, dict) and data.get("ok") is False:
        raise from_wire(data)
    if not isinstance(data, dict) or "result" not in data:
        raise Unavailable(f"{subject} answered without a result")
    return data
