"""The one place where errors become HTTP responses: ``{"error": code, "detail": text}``.

Besides the domain errors (:mod:`coxswain.errors`), the gateway's own reads of Redis (a session,
its owner) and of JetStream (the event log) may find their server down or restarting: those are
503 ``unavailable``, never a 500, so a client knows to retry.

:class:`ErrorBody` is that envelope as the OpenAPI document declares it; :func:`responses` is
what a route declares for each error status it may answer.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import nats.errors
import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from coxswain.errors import CoxError, without_paths

STATUS_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
                405: "method_not_allowed", 409: "conflict", 413: "too_large", 415: "unsupported_media_type",
                422: "invalid", 429: "too_many_requests", 503: "unavailable"}


WHEN = {400: "The body is not UTF-8 JSON (`bad_json`).",
        401: "No bearer token, or an unknown one (`unauthorized`; with `WWW-Authenticate: Bearer`).",
        403: "Policy or an integrity check refused it (`refused`).",
        404: "No such session (or another principal's), or no such thing in it (`not_found`).",
        409: "The session's state does not allow it now (`busy`, `conflict` or a more specific code).",
        410: "The retention policy removed a version this needs (`collected`).",
        413: "The body is over `max_body`, or what it holds is over a bound (`too_large`).",
        415: "An attachment's media type is not in `[attachments] allowed_types` (`unsupported_media_type`).",
        422: "The body, query or path does not fit (`invalid`, `workspace_invalid`).",
        429: "Too many at once (`too_many_pending`, `too_many_streams`).",
        500: "A fork could not copy an entry of the workspace (`copy_failed`).",
        503: "Redis, NATS or a service is down or stopping (`unavailable`, with `Retry-After: 1`); retry."}


class ErrorBody(BaseModel):
    """Every error the gateway answers (docs/api.md, "Errors")."""

    error: str = Field(description="the error code: `not_found`, `busy`, `invalid`, ... (docs/api.md, Errors)")
    detail: str = Field(description="what went wrong, for a person; it names no host path")


def responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI ``responses`` of these error statuses: each the envelope, with when it happens."""
    return {s: {"model": ErrorBody, "description": WHEN[s]} for s in statuses}


def body(code: str, detail: str) -> dict[str, str]:
    return {"error": code, "detail": detail}


def routes(items: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    """Every route, the included routers' own in their place."""
    for route in items:
        included = getattr(route, "original_router", None)  # FastAPI keeps an included router whole
        yield from routes(included.routes) if included is not None else (route,)


def allowed(request: Request) -> str:
    """Every method of every route of this path (Starlette's 405 names the first route's only)."""
    methods: set[str] = set()
    for route in routes(request.app.router.routes):
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods))


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int, what: str = "") -> None:
        super().__init__(status_code=413, detail=what or f"the request body is larger than {limit} bytes")


UPLOAD_PATH = re.compile(r"^/v1/sessions/[^/]+/attachments/?$")
"""The one route whose body may be larger than ``max_body``: an attachment's upload."""
UPLOAD_SLACK = 65_536
"""What a multipart body holds besides the file (boundaries, headers) at most."""


def length_over(length: str | bytes, limit: int) -> bool | None:
    """Whether a ``Content-Length`` value says more than ``limit`` bytes; None when it is not a
    length (RFC 9110: one or more ASCII digits). Leading zeros are read as zeros ("000100" is
    100): the one reading of a length for the fast path (``turnpath``) and :class:`BodyLimit`
    alike, so a request has one answer whichever path it takes. A length with more digits than
    the limit has is over it without being read as a number (``int`` refuses > 4300 digits)."""
    raw = length.decode("latin-1") if isinstance(length, bytes) else length
    if not raw or not raw.isascii() or not raw.isdigit():
        return None
    digits = raw.lstrip("0") or "0"
    return len(digits) > len(str(limit)) or int(digits) > limit


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with a JSON 413.

    Starlette's own limiter answers in plain text when a Content-Length is over the limit (even
    replacing the app's response), so the gateway limits bodies here: at once from the header,
    or, for a streamed body, when the bytes read pass the limit (raised as an HTTPException,
    which the handler below turns into the usual JSON error).
    """

    def __init__(self, app: ASGIApp, limit: int, upload_limit: int | None = None) -> None:
        self.app = app
        self.limit = limit
        self.upload_limit = upload_limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, what = self.limit, ""
        if self.upload_limit is not None and scope.get("method") == "POST" and UPLOAD_PATH.match(scope["path"]):
            limit = self.upload_limit + UPLOAD_SLACK
            if Headers(scope=scope).get("content-type", "").lower().startswith("application/json"):
                limit = -(-self.upload_limit // 3) * 4 + UPLOAD_SLACK  # the bytes in base64
            what = (f"an attachment may have at most {self.upload_limit} bytes "
                    f"([attachments] max_mb); nothing was kept")
        length = Headers(scope=scope).get("content-length")
        if length is not None and length_over(length, limit):
            too_large = BodyTooLarge(limit, what)
            await JSONResponse(body("too_large", str(too_large.detail)), status_code=413)(scope, receive, send)
            return
        total = 0

        async def limited() -> Message:
            nonlocal total
            message = await receive()
            if message["type"] == "http.request":
                total += len(message.get("body", b""))
                if total > limit:
                    raise BodyTooLarge(limit, what)
            return message

        await self.app(scope, limited, send)


def _auth_in_route(request: Request) -> Any:
    """The gateway's :class:`~.auth.Auth` when the request's route takes its principal from
    :func:`.deps.caller` (it declares its bearer scheme in ``openapi_extra``), else None."""
    route = request.scope.get("route")
    extra = getattr(route, "openapi_extra", None) or {}
    if "security" not in extra:
        return None
    deps = getattr(request.app.state, "deps", None)
    return getattr(deps, "auth", None)


def error_response(exc: CoxError, root: Path | None) -> JSONResponse:
    """A domain error's response (with the gateway's workspace root: see below)."""
    headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else \
        {"Retry-After": "1"} if exc.status == 503 else None
    # The last fence: no detail a client reads names a host path. A service's failure (5xx)
    # is scrubbed of every absolute path; any detail that names the root says paths
    # relative to it (the services say paths relative to the workspace already).
    roots = [root] if root is not None else []
    named = root is not None and str(root) in exc.detail
    detail = without_paths(exc.detail, *roots) if exc.status >= 500 or named else exc.detail
    return JSONResponse(body(exc.code, detail), status_code=exc.status, headers=headers)


SERVER_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, nats.errors.Error)
"""What a read or a request of the gateway raises when Redis or NATS is down: 503."""


def down_response(exc: Exception) -> JSONResponse:
    """The 503 of one of :data:`SERVER_DOWN`."""
    if isinstance(exc, nats.errors.Error):
        detail = f"the message bus or event log (NATS) is unavailable: {exc!r}"
    else:
        detail = f"the session store (Redis) is unavailable: {exc}"
    return JSONResponse(body("unavailable", detail), status_code=503, headers={"Retry-After": "1"})


def install(app: FastAPI, max_body: int | None = None, root: Path | None = None,
            upload_limit: int | None = None) -> None:
    if max_body is not None:
        app.add_middleware(BodyLimit, limit=max_body, upload_limit=upload_limit)

    @app.exception_handler(CoxError)
    async def cox_error(request: Request, exc: CoxError) -> JSONResponse:
        return error_response(exc, root)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        if any(e.get("type") in ("json_invalid", "json_type") for e in errs):
            return JSONResponse(body("bad_json", "the body is not valid UTF-8 JSON"), status_code=400)
        if (auth := _auth_in_route(request)) is not None:
            # A route that checks its bearer token in its body (deps.caller) is validated first:
            # a request without a good token is 401 all the same, as where a dependency checks it.
            try:
                auth.principal(request)
            except CoxError as denied:
                return error_response(denied, root)
        parts = []
        for e in errs[:5]:
            loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
            parts.append(f"{loc}: {e.get('msg')}")
        return JSONResponse(body("invalid", "; ".join(parts)), status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = STATUS_CODES.get(exc.status_code, "error")
        detail = exc.detail if isinstance(exc.detail, str) else code
        if exc.status_code == 413 and not isinstance(exc, BodyTooLarge):
            detail = "the request body is too large"
        if exc.status_code == 400:
            # FastAPI's only 400: a body it could not parse (invalid UTF-8, a broken encoding).
            code, detail = "bad_json", f"the body is not valid UTF-8 JSON ({detail})"
        headers = exc.headers
        allow = allowed(request) if exc.status_code == 405 else ""
        if allow:  # (a mount, /static, has no methods of its own: its own Allow stands)
            headers = {**(headers or {}), "Allow": allow}
        return JSONResponse(body(code, detail), status_code=exc.status_code, headers=headers)

    @app.exception_handler(redis.exceptions.ConnectionError)
    @app.exception_handler(redis.exceptions.TimeoutError)
    @app.exception_handler(nats.errors.Error)
    async def server_down(request: Request, exc: Exception) -> JSONResponse:
        return down_response(exc)

    @app.exception_handler(UnicodeDecodeError)
    async def bad_unicode(request: Request, exc: UnicodeDecodeError) -> JSONResponse:
        return JSONResponse(body("bad_json", "the body is not valid UTF-8"), status_code=400)
