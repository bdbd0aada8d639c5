"""A send, the request of every turn, answered without FastAPI's request machinery.

FastAPI spends on a send what a turn's own work is measured against (issue #23): its route is
found by trying routes, its parameters are solved as dependencies, its body is validated, its
reply is validated again against the response model before it is written, and three middleware
layers and a task's context stand between uvicorn and the route. This ASGI middleware answers a
send whose request is as a client writes it:

- ``POST /v1/sessions/{sid}/messages`` with a session id that fits, ``Content-Type:
  application/json`` exactly and a ``Content-Length`` within ``max_body``;
- a bearer token the gateway knows, a ``traceparent`` of at most 512 characters if any, and a body
  that is JSON and fits :class:`~coxswain.models.SendMessage`.

It runs the route's own code (:func:`.routers.steering.send_message`) and answers its errors
with the handlers' own functions (:func:`.errors.error_response`, :func:`.errors.down_response`).
Every other request, and a send that misses any of the above, goes on to FastAPI as it came (the
body read here is handed on unchanged): every refusal (401, 400, 413, 422) stays the route's own,
with its words, and the OpenAPI document still describes the route.

It runs before FastAPI's own layers, not among its middleware (:class:`.app.GatewayApp`): FastAPI's
and Starlette's ``__call__``, their server-error, exception-telemetry and body-limit middleware
and the metrics one each wrap a request and its ``send`` (~60 µs of a send's wall time on the
2-core VM of issue #23). So a send answered here is counted and timed here, as the metrics
middleware counts the route's (:func:`.metrics.observe`), and an error nothing here expects is
answered as Starlette's server-error middleware answers it (500, then raised for uvicorn to log).
"""

from __future__ import annotations

import json
import re
import time

from pydantic import ValidationError
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coxswain.errors import CoxError, Unauthorized
from coxswain.models import SendMessage

from . import errors, metrics
from .deps import Deps
from .routers import steering

SEND_ROUTE = "/v1/sessions/{sid}/messages"
SEND_PATH = re.compile(r"/v1/sessions/([A-Za-z0-9_-]{1,64})/messages")
"""A send's path, whole (``fullmatch``: no trailing newline either); the session id as the
route's pattern (``coxswain.ids.ID_RE``) takes it."""
TRACEPARENT_MAX = 512
"""The route's ``traceparent`` header bound: a longer one is the route's 422."""
JSON_TYPE = (b"content-type", b"application/json")
"""The 202's media type header, as ``Response(media_type="application/json")`` writes it."""


class TurnPath:
    """The ASGI app that answers a send and hands everything else to ``app`` (FastAPI's own call)."""

    def __init__(self, app: ASGIApp, deps: Deps, route: object) -> None:
        self.app = app
        self.deps = deps
        self.max_body = deps.settings.max_body
        self.root = deps.settings.root
        """The gateway's workspace root, which no error detail names (:func:`.errors.error_response`)."""
        self.route = route
        """The FastAPI route of a send: put in the scope as routing would."""
        self.label: str = getattr(route, "path", SEND_ROUTE)
        """The metrics' label of a send (the route's template), as the metrics middleware reads it."""
        self.served = 0
        """Sends answered here (the rest went on to FastAPI)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or (m := SEND_PATH.fullmatch(scope["path"])) is None:
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        auth = ctype = length = traceparent = None
        for name, value in scope["headers"]:
            # the first of each, as Starlette's Headers.get reads them for the route
            if name == b"authorization":
                auth = value if auth is None else auth
            elif name == b"content-type":
                ctype = value if ctype is None else ctype
            elif name == b"content-length":
                length = value if length is None else length
            elif name == b"traceparent":
                traceparent = value if traceparent is None else traceparent
        # a length that is none or over the limit: the route answers it (BodyLimit's 413)
        if ctype != b"application/json" or length is None or errors.length_over(length, self.max_body) is not False \
                or (traceparent is not None and len(traceparent) > TRACEPARENT_MAX):
            await self.app(scope, receive, send)
            return
        try:
            who = self.deps.auth.principal_of(auth.decode("latin-1") if auth is not None else "")
        except Unauthorized:
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before its body was whole: nothing was done
            chunk = message.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if size > self.max_body:
                await self.app(scope, _replay(chunks, receive, more=message.get("more_body", False)), send)
                return
            if not message.get("more_body", False):
                break
        raw = b"".join(chunks)
        try:
            body = SendMessage.model_validate(json.loads(raw))  # as FastAPI reads a JSON body
        except (ValueError, ValidationError):  # (json's errors are ValueErrors, UnicodeDecodeError too)
            await self.app(scope, _replay([raw], receive), send)
            return
        scope["route"] = self.route
        self.served += 1
        tp = traceparent.decode("latin-1") if traceparent is not None else None
        response: Response
        status = 500
        try:
            try:
                result = await steering.send_message(self.deps, who, m.group(1), body, tp)
            except CoxError as exc:
                response = errors.error_response(exc, self.root)
            except errors.SERVER_DOWN as exc:
                response = errors.down_response(exc)
            except Exception:
                await PlainTextResponse("Internal Server Error", status_code=500)(scope, receive, send)
                raise
            else:
                # The headers a Response(media_type="application/json") writes, in its order.
                raw = result.model_dump_json().encode()
                status = 202
                await send({"type": "http.response.start", "status": 202,
                            "headers": [(b"content-length", str(len(raw)).encode()), JSON_TYPE]})
                await send({"type": "http.response.body", "body": raw})
                return
            status = response.status_code
            await response(scope, receive, send)
        finally:
            metrics.observe("POST", self.label, status, time.perf_counter() - start)


def _replay(chunks: list[bytes], receive: Receive, more: bool = False) -> Receive:
    """``receive`` with the body already read given first, as it came (then the rest, if any)."""
    pending = list(chunks)

    async def replayed() -> Message:
        if pending:
            chunk = pending.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(pending) or more}
        return await receive()

    return replayed
