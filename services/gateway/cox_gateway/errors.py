"""The one place where errors become HTTP responses: ``{"error": code, "detail": text}``.

Besides the domain errors (:mod:`coxswain.errors`), the gateway's own reads of Redis (a session,
its owner) and of JetStream (the event log) may find their server down or restarting: those are
503 ``unavailable``, never a 500, so a client knows to retry.
"""

from __future__ import annotations

import nats.errors
import redis.exceptions
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from coxswain.errors import CoxError

STATUS_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
                405: "method_not_allowed", 409: "conflict", 413: "too_large", 415: "unsupported_media_type",
                422: "invalid", 429: "too_many_requests", 503: "unavailable"}


def body(code: str, detail: str) -> dict[str, str]:
    return {"error": code, "detail": detail}


def install(app: FastAPI) -> None:
    @app.exception_handler(CoxError)
    async def cox_error(request: Request, exc: CoxError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return JSONResponse(body(exc.code, exc.detail), status_code=exc.status, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errs = exc.errors()
        if any(e.get("type") in ("json_invalid", "json_type") for e in errs):
            return JSONResponse(body("bad_json", "the body is not valid UTF-8 JSON"), status_code=400)
        parts = []
        for e in errs[:5]:
            loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
            parts.append(f"{loc}: {e.get('msg')}")
        return JSONResponse(body("invalid", "; ".join(parts)), status_code=422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = STATUS_CODES.get(exc.status_code, "error")
        detail = exc.detail if isinstance(exc.detail, str) else code
        if exc.status_code == 413:
            detail = "the request body is too large"
        return JSONResponse(body(code, detail), status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(redis.exceptions.ConnectionError)
    @app.exception_handler(redis.exceptions.TimeoutError)
    async def redis_down(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(body("unavailable", f"the session store (Redis) is unavailable: {exc}"),
                            status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(nats.errors.Error)
    async def nats_down(request: Request, exc: Exception) -> JSONResponse:
        return JSONResponse(body("unavailable", f"the message bus or event log (NATS) is unavailable: {exc!r}"),
                            status_code=503, headers={"Retry-After": "1"})

    @app.exception_handler(UnicodeDecodeError)
    async def bad_unicode(request: Request, exc: UnicodeDecodeError) -> JSONResponse:
        return JSONResponse(body("bad_json", "the body is not valid UTF-8"), status_code=400)
